"""The REST contract (DESIGN.md "Interfaces"), over the real app with FastAPI's TestClient."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE

from gpu_triage.actions.silences import SilenceBook
from gpu_triage.model.evidence import JobEvidence, evidence_dict
from gpu_triage.model.snapshot import Snapshot
from gpu_triage.model.states import GpuState, Mode, Verdict
from gpu_triage.serving.api import create_app
from gpu_triage.serving.control import ControlRefused, EventsReader, QueuedControl
from gpu_triage.serving.evidence_doc import EvidenceDoc
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.serving.status_doc import GpuDoc, HealthDoc, StatusDoc
from tests.watchdog.snapshots import T0, snapshot

TOKEN = "tok-3f9c2a7e51d04b8c9a6e"
RIGHT = {"Authorization": f"Bearer {TOKEN}"}
TABLE = {"model": "B300", "power_limit_w": 1100.0, "bands": {"compute": [0.55, 1.0]}}


class ListEvents:
    """A real (in-memory) EventsReader: events with id 1..n."""

    def __init__(self, count: int) -> None:
        self.rows = [{"id": i, "time": T0 + i, "kind": "state", "gpu": i % 8} for i in range(1, count + 1)]
        self.calls: list[tuple[int, int]] = []

    def since(self, after_id: int, limit: int) -> list[dict[str, Any]]:
        self.calls.append((after_id, limit))
        return [r for r in self.rows if r["id"] > after_id][:limit]


class RecordingControl(QueuedControl):
    """The loop's QueuedControl, recording every call made to it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[str] = []

    def arm(self, mode: Mode) -> None:
        self.calls.append(f"arm:{mode.value}")
        super().arm(mode)

    def disarm(self) -> None:
        self.calls.append("disarm")
        super().disarm()

    def add_silence(
        self, matchers: dict[str, str], duration_s: float, comment: str, now: float
    ) -> dict[str, Any]:
        self.calls.append("add_silence")
        return super().add_silence(matchers, duration_s, comment, now)

    def delete_silence(self, silence_id: str) -> bool:
        self.calls.append("delete_silence")
        return super().delete_silence(silence_id)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_client(
    snap: Snapshot | None = None,
    *,
    token: str | None = TOKEN,
    control: QueuedControl | None = None,
    events: EventsReader | None = None,
    clock: Callable[[], float] | None = None,
    period_s: float = 1.0,
    max_body_bytes: int = 64 * 1024,
) -> tuple[TestClient, SnapshotHolder]:
    holder = SnapshotHolder(snap)
    app = create_app(
        snapshots=holder,
        events=events,
        table=lambda: TABLE,
        control=control,
        token=token,
        period_s=period_s,
        clock=clock or Clock(T0 + 0.4),
        max_body_bytes=max_body_bytes,
    )
    return TestClient(app), holder


@pytest.fixture
def client() -> Iterator[TestClient]:
    test_client, _holder = make_client(snapshot(verdict=Verdict.DEADLOCK_SUSPECTED, jobs=2))
    with test_client:
        yield test_client


# ----------------------------------------------------------------------------------------------------
# Read endpoints

STATUS_KEYS = {"node", "source", "mode", "armed", "cycle", "time", "gpus", "jobs"}
GPU_KEYS = {
    "gpu",
    "uuid",
    "name",
    "model",
    "power_w",
    "power_limit_w",
    "utilization_ratio",
    "memory_used_bytes",
    "state",
    "state_since",
}
JOB_KEYS = {"job", "ranks", "verdict", "onset", "raised", "evidence"}


def test_status_has_every_contract_field(client: TestClient) -> None:
    response = client.get("/status")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    status = response.json()
    assert status.keys() >= STATUS_KEYS
    assert status["node"] == "node-a"
    assert status["source"] == "sim"
    assert status["mode"] == "observe"
    assert status["armed"] is False
    assert status["cycle"] == 42
    assert status["time"] == T0
    assert len(status["gpus"]) == 8
    gpu = status["gpus"][3]
    assert gpu.keys() >= GPU_KEYS
    assert gpu["gpu"] == 3
    assert gpu["uuid"] == "GPU-00000003-0000-4000-8000-000000000000"
    assert gpu["name"] == "NVIDIA B300 SXM6 AC"
    assert gpu["model"] == "B300"
    assert gpu["power_w"] == 230.0
    assert gpu["power_limit_w"] == 1100.0
    assert gpu["utilization_ratio"] == 1.0
    assert gpu["memory_used_bytes"] == 150.0 * 2**30
    assert gpu["state"] == "checkpoint_or_deadlock"
    assert gpu["state_since"] == T0 - 60.0
    job = status["jobs"][0]
    assert job.keys() >= JOB_KEYS
    assert job["job"] == "qwen3-32b-ft"
    assert job["verdict"] == "deadlock_suspected"
    assert job["onset"] == T0 - 60.0
    assert job["raised"] == T0 - 20.0
    assert job["evidence"]["gpus"] == list(range(8))
    assert job["evidence"]["phases"] == {"0": "epoch_end", **{str(r): "train" for r in range(1, 8)}}
    assert isinstance(job["ranks"], list) and len(job["ranks"]) == 8
    assert job["ranks"][2] == {
        "rank": 2,
        "pid": 10_002,
        "gpu": 2,
        "step": 1200,
        "step_since": None,
        "phase": "train",
        "lease_until": None,
        "alive": True,
        "process_status": "running",
        "pod": None,
    }
    assert status["jobs"][1]["verdict"] == "healthy"


def test_status_matches_its_documented_schema(client: TestClient) -> None:
    # The OpenAPI models forbid extra fields: the documentation and the document cannot drift apart.
    StatusDoc.model_validate(client.get("/status").json())
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert schema["GpuDoc"]["properties"].keys() >= GPU_KEYS
    assert schema["StatusDoc"]["properties"].keys() >= STATUS_KEYS


def test_openapi_documents_every_evidence_key(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert "EvidenceDoc" in str(schemas["JobDoc"]["properties"]["evidence"])
    documented = schemas["EvidenceDoc"]["properties"]
    # every key evidence_dict can write (the optional ones switched on), plus the facts' own documents
    optional = JobEvidence(gpus_unknown=True, not_kill_worthy_because="x", untrusted_progress_files=({},))
    full = evidence_dict(optional, cause="c")
    assert documented.keys() == set(full) | {"nccl_ras", "stacks", "stacks_where", "fleet", "detector_error"}
    assert all(doc.get("description") or "$ref" in str(doc) for doc in documented.values())
    for part in ("FindingDoc", "CoverageDoc", "CannotJudgeDoc", "StacksDoc", "NcclRasDoc", "FleetDoc"):
        assert part in schemas
    EvidenceDoc.model_validate(full)
    EvidenceDoc.model_validate({"detector_error": "ValueError: boom"})


def test_gpus_is_the_status_gpu_list(client: TestClient) -> None:
    gpus = client.get("/gpus").json()
    assert gpus == client.get("/status").json()["gpus"]
    for gpu in gpus:
        GpuDoc.model_validate(gpu)


def test_read_endpoints_follow_each_published_snapshot() -> None:
    test_client, holder = make_client(snapshot(cycle=1))
    assert test_client.get("/status").json()["cycle"] == 1
    holder.publish(snapshot(cycle=2, mode=Mode.KILL, armed=True, gpus=16))
    status = test_client.get("/status").json()
    assert (status["cycle"], status["mode"], status["armed"]) == (2, "kill", True)
    assert len(test_client.get("/gpus").json()) == 16


def test_before_the_first_cycle_status_and_gpus_answer_503() -> None:
    test_client, holder = make_client(None)
    for path in ("/status", "/gpus"):
        response = test_client.get(path)
        assert response.status_code == 503
        assert "starting" in response.json()["detail"]
    holder.publish(snapshot())
    assert test_client.get("/status").status_code == 200


def test_unknown_and_non_finite_values_are_null() -> None:
    snap = snapshot(gpus=2)
    lost = replace(
        snap.gpus[1], power_w=None, utilization_ratio=math.nan, state=GpuState.UNKNOWN, temperature_c=math.inf
    )
    evidence = JobEvidence(
        gpus=(0, 1), gpu_states={0: GpuState.IDLE}, step_interval_s=math.nan, bytes_read_recently=math.inf
    )
    job = replace(snap.jobs[0], evidence=evidence)
    test_client, _ = make_client(replace(snap, gpus=(snap.gpus[0], lost), jobs=(job,)))
    response = test_client.get("/status")
    assert response.status_code == 200
    json.loads(response.text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    gpu = response.json()["gpus"][1]
    assert (gpu["power_w"], gpu["utilization_ratio"], gpu["temperature_c"]) == (None, None, None)
    assert gpu["state"] == "unknown"
    ev = response.json()["jobs"][0]["evidence"]
    assert (ev["step_interval_s"], ev["bytes_read_recently"]) == (None, None)
    assert (ev["gpus"], ev["gpu_states"]) == ([0, 1], {"0": "idle"})


# ----------------------------------------------------------------------------------------------------
# Health


@pytest.mark.parametrize(
    ("period_s", "age_s", "code", "status"),
    [
        (1.0, 0.4, 200, "ok"),
        (1.0, 4.9, 200, "ok"),  # 3 periods would be 3 s; the floor is 5 s
        (1.0, 5.0, 503, "stale"),
        (0.1, 4.0, 200, "ok"),
        (10.0, 29.0, 200, "ok"),  # 3 periods = 30 s
        (10.0, 31.0, 503, "stale"),
    ],
)
def test_healthz_freshness(period_s: float, age_s: float, code: int, status: str) -> None:
    test_client, _ = make_client(snapshot(period_s=period_s), clock=Clock(T0 + age_s), period_s=period_s)
    response = test_client.get("/healthz")
    assert response.status_code == code
    body = response.json()
    assert body["status"] == status
    assert body["last_cycle_age_s"] == pytest.approx(age_s, abs=1e-3)
    HealthDoc.model_validate(body)


def test_healthz_turns_stale_and_recovers_as_the_clock_moves() -> None:
    clock = Clock(T0 + 0.4)
    test_client, holder = make_client(snapshot(), clock=clock)
    assert test_client.get("/healthz").json() == {
        "status": "ok",
        "last_cycle_age_s": 0.4,
        "max_age_s": 5.0,
        "cycle": 42,
        "failed_cycles": 0,
        "failed_cycles_total": 0,
        "errors": [],
    }
    clock.now = T0 + 7.25
    response = test_client.get("/healthz")
    assert (response.status_code, response.json()["status"], response.json()["last_cycle_age_s"]) == (
        503,
        "stale",
        7.25,
    )
    holder.publish(snapshot(cycle=43, time=T0 + 7.0))
    assert test_client.get("/healthz").status_code == 200


def test_healthz_before_the_first_cycle_is_starting() -> None:
    test_client, _ = make_client(None)
    response = test_client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "starting"
    assert response.json()["last_cycle_age_s"] is None
    assert test_client.head("/healthz").status_code == 503


# ----------------------------------------------------------------------------------------------------
# Events, tables, metrics, OpenAPI


def test_events_pages_oldest_first_until_the_end() -> None:
    store = ListEvents(250)
    test_client, _ = make_client(snapshot(), events=store)
    first = test_client.get("/events").json()
    assert [e["id"] for e in first["events"]] == list(range(1, 101))
    assert (first["since"], first["limit"], first["next_since"], first["more"]) == (0, 100, 100, True)
    seen = [e["id"] for e in first["events"]]
    since = first["next_since"]
    while True:
        page = test_client.get("/events", params={"since": since, "limit": 70}).json()
        seen += [e["id"] for e in page["events"]]
        since = page["next_since"]
        if not page["more"]:
            break
    assert seen == list(range(1, 251))
    empty = test_client.get("/events", params={"since": 250}).json()
    assert (empty["events"], empty["next_since"], empty["more"]) == ([], 250, False)
    exact = test_client.get("/events", params={"since": 150, "limit": 100}).json()
    assert len(exact["events"]) == 100 and exact["more"] is False
    assert test_client.get("/events", params={"limit": 1000}).json()["more"] is False
    assert store.calls[0] == (0, 101)  # one more than asked, to tell whether more follow


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 1001}, {"since": -1}, {"since": "x"}, {"limit": "1.5"}]
)
def test_events_query_validation_is_422(params: dict[str, Any]) -> None:
    store = ListEvents(5)
    test_client, _ = make_client(snapshot(), events=store)
    assert test_client.get("/events", params=params).status_code == 422
    assert store.calls == []


def test_events_from_the_real_event_store(tmp_path: Path) -> None:
    from gpu_triage.journal.eventstore import EventStore

    store = EventStore(tmp_path, T0)
    try:
        ids = [
            store.append("state", {"state": "compute", "n": i}, time_s=T0 + i, gpu=i % 2) for i in range(5)
        ]
        test_client, _ = make_client(snapshot(), events=store)
        page = test_client.get("/events", params={"since": ids[1], "limit": 2}).json()
        assert [e["id"] for e in page["events"]] == ids[2:4]
        assert page["events"][0]["payload"] == {"state": "compute", "n": 2}
        assert (page["next_since"], page["more"]) == (ids[3], True)
    finally:
        store.close()


class BrokenEvents:
    def since(self, after_id: int, limit: int) -> list[dict[str, Any]]:
        raise RuntimeError("cannot read events from /var/lib/gpu-watchdog/events.db: disk I/O error")


def test_an_unreadable_event_store_is_503() -> None:
    test_client, _ = make_client(snapshot(), events=BrokenEvents())
    response = test_client.get("/events")
    assert response.status_code == 503
    assert "disk I/O error" in response.json()["detail"]


def test_events_without_a_store_is_503() -> None:
    test_client, _ = make_client(snapshot(), events=None)
    assert test_client.get("/events").status_code == 503


def test_tables_current_returns_the_table(client: TestClient) -> None:
    assert client.get("/tables/current").json() == TABLE


def test_metrics_content_types(client: TestClient) -> None:
    text = client.get("/metrics")
    assert text.status_code == 200
    # prometheus_client's own choice for a scraper that states no preference (text format 0.0.4)
    assert text.headers["content-type"] == choose_encoder("")[1]
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'gpu_watchdog_verdict{training_job="qwen3-32b-ft",verdict="deadlock_suspected"} 1.0' in text.text
    openmetrics = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert openmetrics.headers["content-type"].startswith(OPENMETRICS_CONTENT_TYPE.split(";")[0])
    assert openmetrics.text.endswith("# EOF\n")


def test_openapi_lists_every_endpoint_and_the_bearer_scheme(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {
        "/healthz",
        "/status",
        "/gpus",
        "/events",
        "/tables/current",
        "/metrics",
        "/arm",
        "/disarm",
        "/silences",
        "/silences/{silence_id}",
    } <= paths.keys()
    for path, method in [
        ("/arm", "post"),
        ("/disarm", "post"),
        ("/silences", "post"),
        ("/silences/{silence_id}", "delete"),
    ]:
        assert paths[path][method]["security"] == [{"HTTPBearer": []}], (path, method)
    assert "security" not in paths["/silences"]["get"]
    assert "security" not in paths["/status"]["get"]
    arm_schema = paths["/arm"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert arm_schema["properties"]["mode"]["enum"] == ["alert", "kill"]


# ----------------------------------------------------------------------------------------------------
# Authentication on every mutating endpoint

MUTATIONS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/arm", {"mode": "kill"}),
    ("POST", "/disarm", None),
    ("POST", "/silences", {"matchers": {"job": "qwen3-32b-ft"}, "duration_s": 3600, "comment": "known"}),
    ("DELETE", "/silences/{id}", None),
]
CASES = [
    # (token configured, headers, expected status)
    ("none configured", None, RIGHT, 403),
    ("none configured, no header", None, {}, 403),
    ("missing", TOKEN, {}, 401),
    ("not bearer", TOKEN, {"Authorization": f"Basic {TOKEN}"}, 401),
    ("empty bearer", TOKEN, {"Authorization": "Bearer "}, 401),
    ("wrong", TOKEN, {"Authorization": "Bearer tok-guess"}, 403),
    ("prefix of the right one", TOKEN, {"Authorization": f"Bearer {TOKEN[:-1]}"}, 403),
    ("right one plus more", TOKEN, {"Authorization": f"Bearer {TOKEN}x"}, 403),
    ("non-ascii", TOKEN, {"Authorization": "Bearer t\u00f6ken".encode()}, 403),
]


def _call(
    test_client: TestClient,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    headers: dict[str, str],
    silence_id: str,
) -> Any:
    return test_client.request(method, path.replace("{id}", silence_id), json=body, headers=headers)


@pytest.mark.parametrize(("method", "path", "body"), MUTATIONS, ids=[f"{m} {p}" for m, p, _ in MUTATIONS])
@pytest.mark.parametrize(("case", "token", "headers", "expected"), CASES, ids=[c[0] for c in CASES])
def test_refused_calls_change_nothing(
    method: str,
    path: str,
    body: dict[str, Any] | None,
    case: str,
    token: str | None,
    headers: dict[str, str],
    expected: int,
) -> None:
    control = RecordingControl()
    existing = control.silences.add({"job": "other"}, 600.0, "pre-existing", T0)
    test_client, _ = make_client(snapshot(), token=token, control=control)
    response = _call(test_client, method, path, body, headers, existing.id)
    assert response.status_code == expected, response.text
    assert control.calls == [], "a refused call reached the Control"
    assert control.pending() == []
    assert [s.id for s in control.silences.active(T0 + 1)] == [existing.id]
    assert TOKEN not in response.text and "tok-guess" not in response.text
    if expected == 401:
        assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path", "body"), MUTATIONS, ids=[f"{m} {p}" for m, p, _ in MUTATIONS])
def test_the_right_token_is_accepted(method: str, path: str, body: dict[str, Any] | None) -> None:
    control = RecordingControl()
    existing = control.silences.add({"job": "other"}, 600.0, "pre-existing", T0)
    test_client, _ = make_client(snapshot(), control=control)
    response = _call(test_client, method, path, body, RIGHT, existing.id)
    assert response.status_code in (201, 202, 204), response.text
    assert len(control.calls) == 1


def test_authentication_comes_before_body_validation() -> None:
    control = RecordingControl()
    test_client, _ = make_client(snapshot(), control=control)
    bad_json = {"Content-Type": "application/json"}
    assert test_client.post("/arm", content=b"{not json", headers=bad_json).status_code == 401
    wrong = {**bad_json, "Authorization": "Bearer nope"}
    assert test_client.post("/silences", content=b"[]", headers=wrong).status_code == 403
    assert test_client.post("/arm", content=b"{not json", headers={**bad_json, **RIGHT}).status_code == 422
    assert control.calls == []


def test_an_empty_token_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        make_client(snapshot(), token="  ")


# ----------------------------------------------------------------------------------------------------
# Mutations with the right token


def test_arm_and_disarm_are_queued_for_the_next_cycle() -> None:
    control = QueuedControl()
    test_client, _ = make_client(snapshot(), control=control)
    response = test_client.post("/arm", json={"mode": "alert"}, headers=RIGHT)
    assert response.status_code == 202
    assert response.json() == {
        "accepted": True,
        "mode": "alert",
        "armed": True,
        "current_mode": "observe",
        "applies": "next_cycle",
    }
    assert test_client.post("/disarm", headers=RIGHT).json()["mode"] == "observe"
    assert [(c.mode, c.armed) for c in control.drain()] == [(Mode.ALERT, True), (Mode.OBSERVE, False)]
    assert control.drain() == []


@pytest.mark.parametrize("body", [{"mode": "observe"}, {"mode": "KILL"}, {}, {"mode": "kill", "x": 1}, []])
def test_arm_body_validation_is_422(body: Any) -> None:
    control = RecordingControl()
    test_client, _ = make_client(snapshot(), control=control)
    assert test_client.post("/arm", json=body, headers=RIGHT).status_code == 422
    assert control.calls == []


def test_arm_refused_by_configuration_is_409() -> None:
    control = QueuedControl(allowed_modes=frozenset({Mode.OBSERVE, Mode.ALERT}))
    test_client, _ = make_client(snapshot(), control=control)
    response = test_client.post("/arm", json={"mode": "kill"}, headers=RIGHT)
    assert response.status_code == 409
    assert "kill" in response.json()["detail"]
    assert control.pending() == []


def test_mutations_without_a_control_are_503_after_authentication() -> None:
    test_client, _ = make_client(snapshot(), control=None)
    assert test_client.post("/disarm").status_code == 401
    assert test_client.post("/disarm", headers=RIGHT).status_code == 503
    assert test_client.get("/silences").json() == []


def test_silence_lifecycle_on_an_injected_clock() -> None:
    clock = Clock(T0)
    control = QueuedControl()
    test_client, _ = make_client(snapshot(), control=control, clock=clock)
    body = {
        "matchers": {"job": "qwen3-32b-ft", "verdict": "deadlock_suspected"},
        "duration_s": 3600,
        "comment": "known hang, fix deploying",
    }
    created = test_client.post("/silences", json=body, headers=RIGHT)
    assert created.status_code == 201
    silence = created.json()
    assert silence["matchers"] == body["matchers"]
    assert (silence["starts_at"], silence["ends_at"], silence["comment"]) == (T0, T0 + 3600, body["comment"])
    assert test_client.get("/silences").json() == [silence]  # open: no token needed
    labels = {"node": "node-a", "job": "qwen3-32b-ft", "verdict": "deadlock_suspected"}
    assert control.silences.silenced_by(labels, T0 + 10) is not None
    clock.now = T0 + 3600
    assert test_client.get("/silences").json() == []
    second = test_client.post("/silences", json=body, headers=RIGHT).json()
    assert test_client.delete(f"/silences/{second['id']}", headers=RIGHT).status_code == 204
    assert test_client.get("/silences").json() == []
    assert test_client.delete(f"/silences/{second['id']}", headers=RIGHT).status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"matchers": {}, "duration_s": 60},
        {"matchers": {"gpu": "3"}, "duration_s": 60},
        {"matchers": {"verdict": "deadlock"}, "duration_s": 60},
        {"matchers": {"job": ""}, "duration_s": 60},
        {"matchers": {"job": "a"}, "duration_s": 0},
        {"matchers": {"job": "a"}, "duration_s": 31 * 24 * 3600},
        {"matchers": {"job": "a"}, "duration_s": 60, "comment": "x" * 1025},
        {"matchers": {"job": 3}, "duration_s": 60},
        {"matchers": {"job": "a"}},
    ],
)
def test_silence_validation_is_422(body: dict[str, Any]) -> None:
    control = QueuedControl()
    test_client, _ = make_client(snapshot(), control=control)
    response = test_client.post("/silences", json=body, headers=RIGHT)
    assert response.status_code == 422, response.text
    assert control.silences.active(T0) == []


# ----------------------------------------------------------------------------------------------------
# Body size limit


def test_a_declared_body_over_the_limit_is_413_before_anything_else() -> None:
    control = RecordingControl()
    test_client, _ = make_client(snapshot(), control=control, max_body_bytes=1024)
    big = {"matchers": {"job": "a"}, "duration_s": 60, "comment": "x" * 2000}
    for headers in (RIGHT, {}):
        response = test_client.post("/silences", json=big, headers=headers)
        assert response.status_code == 413
        assert "1024 bytes" in response.json()["detail"]
    assert control.calls == []
    small = {"matchers": {"job": "a"}, "duration_s": 60, "comment": "x" * 900}
    assert test_client.post("/silences", json=small, headers=RIGHT).status_code == 201


def test_a_streamed_body_over_the_limit_is_413() -> None:
    control = RecordingControl()
    test_client, _ = make_client(snapshot(), control=control, max_body_bytes=1024)

    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b"x" * 200

    response = test_client.post("/arm", content=chunks(), headers=RIGHT)
    assert response.status_code == 413
    assert control.calls == []


def test_a_malformed_content_length_is_400() -> None:
    test_client, _ = make_client(snapshot())
    response = test_client.post("/disarm", content=b"", headers={**RIGHT, "Content-Length": "abc"})
    assert response.status_code == 400


# ----------------------------------------------------------------------------------------------------
# SilenceBook and QueuedControl (what the loop uses)


def test_silence_book_matches_exactly_and_expires() -> None:
    book = SilenceBook()
    book.add({"job": "a", "verdict": "deadlock_suspected"}, 60.0, "", now=T0)
    book.add({"node": "node-b"}, 120.0, "", now=T0)
    assert book.silenced_by({"node": "node-a", "job": "a", "verdict": "deadlock_suspected"}, T0 + 1)
    assert book.silenced_by({"node": "node-a", "job": "a", "verdict": "deadlock_confirmed"}, T0 + 1) is None
    assert book.silenced_by({"node": "node-a", "job": "ab", "verdict": "deadlock_suspected"}, T0 + 1) is None
    assert book.silenced_by({"node": "node-b", "job": "z", "verdict": "healthy"}, T0 + 61)
    assert book.silenced_by({"node": "node-a", "job": "a", "verdict": "deadlock_suspected"}, T0 + 60) is None
    assert len(book.active(T0 + 60)) == 1
    assert book.active(T0 + 120) == []


def test_silence_book_caps_the_number_of_silences() -> None:
    book = SilenceBook(max_silences=2)
    book.add({"job": "a"}, 10.0, "", T0)
    book.add({"job": "b"}, 10.0, "", T0)
    with pytest.raises(ValueError, match="too many"):
        book.add({"job": "c"}, 10.0, "", T0)
    book.add({"job": "c"}, 10.0, "", T0 + 10)  # the first two expired


def test_queued_control_refuses_observe_as_an_arm_mode() -> None:
    with pytest.raises(ControlRefused):
        QueuedControl().arm(Mode.OBSERVE)


# ----------------------------------------------------------------------------------------------------
# SnapshotHolder (the loop -> readers channel)


def test_snapshot_holder_publishes_and_wakes_waiters() -> None:
    holder = SnapshotHolder()
    assert holder.latest() is None and holder.published_age_s is None
    assert holder.wait_for_cycle(1, timeout_s=0.01) is None
    publisher = threading.Timer(0.05, holder.publish, args=(snapshot(cycle=3),))
    publisher.start()
    got = holder.wait_for_cycle(2, timeout_s=5.0)
    publisher.join()
    assert got is not None and got.cycle == 3
    assert holder.latest() is got
    assert holder.published_age_s is not None and 0 <= holder.published_age_s < 5.0
    assert holder.wait_for_cycle(4, timeout_s=0.01) is None


def test_publishing_takes_no_lock_while_nobody_waits() -> None:
    """The loop publishes 10 times a second: with no thread in wait_for_cycle it stores the snapshot
    and goes on, never taking (nor waiting for) the waiters' lock; a waiter still wakes."""
    holder = SnapshotHolder()
    with holder._changed:  # a reader holding the lock cannot delay a publish nobody waits for
        done = threading.Event()
        threading.Thread(target=lambda: (holder.publish(snapshot(cycle=1)), done.set()), daemon=True).start()
        assert done.wait(5.0), "publish waited for the lock"
    publisher = threading.Timer(0.05, holder.publish, args=(snapshot(cycle=2),))
    publisher.start()
    got = holder.wait_for_cycle(2, timeout_s=5.0)
    publisher.join()
    assert got is not None and got.cycle == 2


def test_an_unbuilt_cycle_is_built_by_its_first_reader_once_and_an_unread_one_never() -> None:
    holder = SnapshotHolder()
    built: list[int] = []

    def maker(cycle: int) -> Callable[[], Snapshot]:
        def make() -> Snapshot:
            built.append(cycle)
            return snapshot(cycle=cycle)

        return make

    for cycle in range(1, 11):  # ten cycles, nobody reads
        holder.publish_lazy(cycle, maker(cycle))
    assert built == [] and holder.latest_cycle == 10
    first = holder.latest()
    assert first is not None and first.cycle == 10 and holder.latest() is first and built == [10]
    holder.publish_lazy(11, maker(11))
    readers = [threading.Thread(target=holder.latest) for _ in range(8)]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    assert built == [10, 11]  # eight readers at once: built once
    publisher = threading.Timer(0.05, holder.publish_lazy, args=(12, maker(12)))
    publisher.start()
    got = holder.wait_for_cycle(12, timeout_s=5.0)
    publisher.join()
    assert got is not None and got.cycle == 12 and built == [10, 11, 12]


def test_docs_work_offline_and_point_to_the_openapi_document(client: TestClient) -> None:
    """FastAPI's default /docs loads Swagger UI from a CDN - blank on an air-gapped node. Ours is one
    page that loads nothing from anywhere, lists every endpoint and links /openapi.json."""
    import re

    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    body = page.text
    assert "href='/openapi.json'" in body
    assert not re.search(r"<script|<link|src=|https?://", body), "nothing loaded from the network"
    spec = client.get("/openapi.json").json()
    for path in ("/status", "/healthz", "/metrics", "/arm"):
        assert path in spec["paths"] and f"<code>{path}</code>" in body
    assert client.get("/redoc").status_code == 404


def test_docs_and_the_openapi_document_show_no_restructuredtext_markup(client: TestClient) -> None:
    """Issue 28 (5): the descriptions come from docstrings written in reStructuredText (``literal``,
    :class:`Name`); /docs and /openapi.json show them readable - literals as code, roles as their
    name - never the raw markup."""
    import json
    import re

    raw = re.compile(r"``|:(?:class|func|mod|meth|attr|data|exc|obj):`")
    spec_text = json.dumps(client.get("/openapi.json").json())
    assert not raw.findall(spec_text), raw.findall(spec_text)[:5]
    body = client.get("/docs").text
    assert not raw.findall(body), [body[m.start() - 40 : m.end() + 40] for m in raw.finditer(body)][:3]
    assert "Switch to <code>alert</code> or <code>kill</code> mode" in body  # POST /arm's docstring
