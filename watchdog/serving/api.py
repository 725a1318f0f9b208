"""The REST API (contract in DESIGN.md, "Interfaces"): a FastAPI app over the latest snapshot.

Read endpoints render the latest published :class:`~gpu_triage.model.snapshot.Snapshot` and nothing else:
they never call into the loop, take no lock the loop holds, and cache the rendered ``/status`` and
``/gpus`` bodies per snapshot (the loop publishes a new immutable snapshot each cycle, so a cached body
is exact until the next one). Mutations go through a :class:`Control` whose methods must be cheap and
thread-safe - :class:`QueuedControl` enqueues ``arm``/``disarm`` for the loop to apply at its next
cycle and keeps silences in a :class:`SilenceBook`; the HTTP side never waits for a cycle.

Security (issue 4, item 5): mutating endpoints need ``Authorization: Bearer <token>``. No token
configured: 403. Header missing (or not a bearer token): 401 with ``WWW-Authenticate: Bearer``.
Wrong token: 403. Tokens are compared in constant time (:func:`hmac.compare_digest`) and no response
ever contains a token. Authentication runs before the request body is parsed, so an unauthenticated
caller learns nothing about body validation. Every request body is limited (64 KiB by default, 413
beyond, checked on ``Content-Length`` and on the bytes actually streamed).
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpu_triage import __version__
from gpu_triage.actions.silences import SilenceBook
from gpu_triage.model.health import node_health_dict
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.snapshot import GpuStatus, JobStatus, RankStatus, Snapshot
from gpu_triage.model.states import Mode
from gpu_triage.serving.control import Control, ControlRefused, EventsReader
from gpu_triage.serving.docs_page import offline_docs_html, readable_descriptions
from gpu_triage.serving.metrics import MetricsExposition, render
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.serving.status_doc import (
    ArmRequest,
    CommandDoc,
    EventsDoc,
    GpuDoc,
    HealthDoc,
    SilenceDoc,
    SilenceRequest,
    StatusDoc,
)

MAX_BODY_BYTES = 64 * 1024
#: Health: the last cycle must be younger than this many periods, and never less than MIN_STALE_S.
STALE_PERIODS = 3.0
MIN_STALE_S = 5.0
EVENTS_LIMIT_DEFAULT = 100
EVENTS_LIMIT_MAX = 1000

# Field names of the JSON contract (DESIGN.md): renaming any of these breaks operators' scripts.
STATUS_FIELDS = (
    "node",
    "source",
    "mode",
    "armed",
    "cycle",
    "time",
    "period_s",
    "sample_duration_s",
    "last_sample_time",
    "started_at",
    "version",
)
GPU_FIELDS = (
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
    "energy_j",
    "temperature_c",
    "sm_clock_mhz",
    "read_errors_total",
    "pci_bus_id",
)
JOB_FIELDS = ("job", "verdict", "kill_worthy", "onset", "raised", "cause", "blame")
RANK_FIELDS = ("rank", "pid", "gpu", "step", "step_since", "phase", "lease_until", "alive", "process_status")


# --------------------------------------------------------------------------------------------------
# JSON documents (the contract) and their OpenAPI descriptions


def _fields(obj: object, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: jsonable(getattr(obj, name)) for name in names}


def gpu_document(gpu: GpuStatus) -> dict[str, Any]:
    return _fields(gpu, GPU_FIELDS)


def rank_document(rank: RankStatus) -> dict[str, Any]:
    document = _fields(rank, RANK_FIELDS)
    pod = getattr(rank, "pod", None)
    document["pod"] = jsonable(pod.to_dict()) if pod is not None else None
    return document


def job_document(job: JobStatus) -> dict[str, Any]:
    document = _fields(job, JOB_FIELDS)
    document["ranks"] = [rank_document(r) for r in job.ranks]
    document["evidence"] = job.evidence_dict()
    return document


def status_document(snapshot: Snapshot) -> dict[str, Any]:
    """The ``GET /status`` document for one snapshot (times in epoch seconds)."""
    document = _fields(snapshot, STATUS_FIELDS)
    document["gpus"] = [gpu_document(g) for g in snapshot.gpus]
    document["jobs"] = [job_document(j) for j in snapshot.jobs]
    document["untrusted_progress_files"] = jsonable(list(snapshot.untrusted_progress_files))
    document["input_errors"] = jsonable(list(snapshot.input_errors))
    document["failed_cycles"] = snapshot.failed_cycles
    document["clock_offset_s"] = round(snapshot.clock_offset_s, 3)
    document["stacks"] = jsonable(snapshot.stacks)
    document["cluster"] = jsonable(snapshot.cluster)
    document["node_health"] = jsonable(node_health_dict(snapshot.node_health))
    if snapshot.signals:
        document["signals"] = jsonable(snapshot.signals)
    return document


def _dumps(document: Any) -> bytes:
    return json.dumps(jsonable(document), separators=(",", ":"), allow_nan=False).encode()


FAILING_AFTER_CYCLES = 3
"""Consecutive failed cycles after which /healthz answers 503 ``failing``."""
DEGRADING_ERRORS = ("job", "persist", "actions", "store", "signal")
"""Input error kinds that make /healthz say ``degraded`` (progress-file errors are the users' own)."""


# --------------------------------------------------------------------------------------------------
# Request body limit (pure ASGI, before routing, authentication and parsing)


METRICS_MAX_AGE_S = 1.0
"""A cached /metrics body is reused for the same snapshot at most this long (process_* metrics)."""


class HealthFirst:
    """``GET``/``HEAD /healthz`` answered at once, ahead of routing, dependencies and body handling:
    the cheapest request the server has, whatever else is queued."""

    def __init__(self, app: ASGIApp, health: Callable[[], tuple[dict[str, Any], int]]) -> None:
        self.app = app
        self.health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/healthz" and scope["method"] in ("GET", "HEAD"):
            document, status_code = self.health()
            body = _dumps(document)
            await send(
                {
                    "type": "http.response.start",
                    "status": status_code,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
            return
        await self.app(scope, receive, send)


class BodySizeLimit:
    """Answer 413 to a request whose body exceeds ``max_body_bytes``, judged on ``Content-Length``
    before reading and on the bytes actually received (chunked bodies); the app then gets the whole
    (small) body replayed. A malformed ``Content-Length`` answers 400."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = JSONResponse({"detail": f"request body exceeds {self.max_body_bytes} bytes"}, 413)
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared_bytes = int(value)
                except ValueError:
                    await JSONResponse({"detail": "malformed Content-Length"}, 400)(scope, receive, send)
                    return
                if declared_bytes > self.max_body_bytes:
                    await too_large(scope, receive, send)
                    return
        chunks: list[bytes] = []
        received_bytes = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            received_bytes += len(chunk)
            if received_bytes > self.max_body_bytes:
                await too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# --------------------------------------------------------------------------------------------------
# The app


class _Auth:
    """The configured bearer token; its repr never shows it."""

    __slots__ = ("_token",)

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token is not None else None

    def __repr__(self) -> str:
        return f"_Auth(configured={self._token is not None})"

    def check(self, credentials: HTTPAuthorizationCredentials | None) -> None:
        """Raise the HTTP error for a refused call: no token configured 403, none given 401, wrong 403."""
        if self._token is None:
            raise HTTPException(
                403, "mutating calls are disabled: no auth token is configured (auth.token_file)"
            )
        if credentials is None:
            raise HTTPException(
                401,
                "missing bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(credentials.credentials.encode(), self._token):
            raise HTTPException(
                403, "invalid bearer token", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}
            )


_BEARER = HTTPBearer(auto_error=False, description="The token from the file that auth.token_file names")


def _require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]
) -> None:
    request.app.state.auth.check(credentials)


def _require_control(request: Request) -> Control:
    control: Control | None = request.app.state.control
    if control is None:
        raise HTTPException(503, "this daemon accepts no controls")
    return control


#: Dependencies of the mutating endpoints, in this order: authenticate, then find the Control.
Authorized = Annotated[None, Depends(_require_token)]
Controlled = Annotated[Control, Depends(_require_control)]


_Model = TypeVar("_Model", bound=BaseModel)


async def _parse_body(request: Request, model: type[_Model]) -> _Model:
    """Parse the JSON body after authentication (FastAPI parses declared bodies before dependencies)."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as error:
        details = [
            {"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"]}
            for e in error.errors(include_url=False)
        ]
        raise RequestValidationError(details) from None


def _body_spec(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


def _json(document: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(_dumps(document), status_code, headers=dict(headers or {}), media_type="application/json")


@dataclass
class _Rendered:
    snapshot: Snapshot
    status: bytes
    gpus: bytes


def set_token(app: FastAPI, token: str | None) -> None:
    """Replace the bearer token of a running app (SIGHUP re-reads auth.token_file)."""
    if token is not None and not token.strip():
        raise ValueError("the auth token is empty; pass None to disable mutating calls")
    app.state.auth = _Auth(token)


def create_app(
    *,
    snapshots: SnapshotHolder,
    events: EventsReader | None,
    table: Callable[[], dict[str, Any]],
    control: Control | None,
    token: str | None,
    period_s: float,
    clock: Callable[[], float] = time.time,
    max_body_bytes: int = MAX_BODY_BYTES,
    metrics_registry: CollectorRegistry | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> FastAPI:
    """The REST app. ``token`` is the bearer token for mutating calls (``None``: they answer 403);
    ``period_s`` the loop's period (health: stale after max(3 periods, 5 s)); ``clock`` the epoch
    clock compared with ``Snapshot.time``; ``table`` returns the power table in use as a dict;
    ``allowed_hosts`` (None: no check) the host names a request's Host header may name besides IP
    addresses and localhost (:mod:`gpu_triage.serving.host_check`)."""
    if token is not None and not token.strip():
        raise ValueError("the auth token is empty; pass None to disable mutating calls")
    max_age_s = max(STALE_PERIODS * period_s, MIN_STALE_S)
    # /metrics: the snapshot's exposition is encoded once per published snapshot and content type, the
    # process_* series at most once a second (MetricsExposition), so a /metrics flood costs bytes sent,
    # not a render per request; a registry passed in (tests, embedders) is rendered at every scrape.
    exposition = None
    if metrics_registry is None:
        exposition = MetricsExposition(snapshots, process_max_age_s=METRICS_MAX_AGE_S)

    app = FastAPI(
        title="gpu-watchdog",
        version=__version__,
        description="Per-node GPU training watchdog: status, events, metrics and controls.",
        # FastAPI's /docs and /redoc load Swagger UI / ReDoc from a CDN: a blank page on an air-gapped
        # node. /docs is a self-contained page instead (offline_docs_html); /openapi.json stays.
        docs_url=None,
        redoc_url=None,
    )

    generated_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's document with the docstrings' reStructuredText made readable (generated once)."""
        first = app.openapi_schema is None
        spec = generated_openapi()
        return readable_descriptions(spec) if first else spec

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/docs", include_in_schema=False)
    def docs_page() -> HTMLResponse:
        return HTMLResponse(offline_docs_html(app.openapi()))

    app.add_middleware(BodySizeLimit, max_body_bytes=max_body_bytes)

    health = _health(snapshots, clock, max_age_s)

    app.add_middleware(HealthFirst, health=health)  # inside the Host check, before any body is read
    policy = None
    if allowed_hosts is not None:  # DNS rebinding: 421 unless Host names this daemon (host_check)
        from gpu_triage.serving.host_check import HostCheck, HostPolicy

        policy = HostPolicy(allowed_hosts)
        app.add_middleware(HostCheck, policy=policy)
    app.state.health_answer = _health_answer(health, policy)
    app.state.snapshots = snapshots
    app.state.auth = _Auth(token)
    app.state.control = control
    app.state.metrics_registry = metrics_registry
    app.state.metrics_exposition = exposition

    _add_read_routes(app, snapshots, events, table, health, exposition, metrics_registry)
    _add_control_routes(app, snapshots, control, clock)
    return app


def _health_answer(
    health: Callable[[], tuple[dict[str, Any], int]], policy: Any
) -> Callable[[str | None], tuple[int, bytes]]:
    """/healthz for the HTTP server's front door (serving.health_door): the Host check, then the
    document, exactly as HostCheck and HealthFirst answer it on the event loop."""

    def answer(host: str | None) -> tuple[int, bytes]:
        if policy is not None and not policy.allows(host):
            from gpu_triage.serving.host_check import MISDIRECTED_BODY

            return 421, MISDIRECTED_BODY
        document, status_code = health()
        return status_code, _dumps(document)

    return answer


def _health(
    snapshots: SnapshotHolder, clock: Callable[[], float], max_age_s: float
) -> Callable[[], tuple[dict[str, Any], int]]:
    """``/healthz``'s answer (document, status code) from the latest snapshot's age and failures."""

    def health() -> tuple[dict[str, Any], int]:
        snapshot = snapshots.latest()
        if snapshot is None:
            return {
                "status": "starting",
                "last_cycle_age_s": None,
                "max_age_s": max_age_s,
                "cycle": None,
            }, 503
        age_s = clock() - snapshot.time  # both on the daemon's monotonic timeline (model.clock)
        fresh = age_s < max_age_s
        failing = snapshot.failed_cycles >= FAILING_AFTER_CYCLES
        errors = sorted(
            {str(e.get("kind")) for e in snapshot.input_errors if e.get("kind") in DEGRADING_ERRORS}
        )
        degraded = snapshot.failed_cycles > 0 or bool(errors)
        return (
            {
                "status": "failing"
                if failing
                else ("stale" if not fresh else ("degraded" if degraded else "ok")),
                "last_cycle_age_s": round(age_s, 3),
                "max_age_s": max_age_s,
                "cycle": snapshot.cycle,
                "failed_cycles": snapshot.failed_cycles,
                "failed_cycles_total": int(snapshot.counters.get("failed_cycles_total", 0)),
                "errors": errors,
            },
            200 if fresh and not failing else 503,
        )

    return health


def _add_read_routes(
    app: FastAPI,
    snapshots: SnapshotHolder,
    events: EventsReader | None,
    table: Callable[[], dict[str, Any]],
    health: Callable[[], tuple[dict[str, Any], int]],
    exposition: MetricsExposition | None,
    metrics_registry: CollectorRegistry | None,
) -> None:
    """What anyone may read: ``/healthz``, ``/status``, ``/gpus``, ``/events``, ``/tables/current``,
    ``/metrics``."""
    rendered: list[_Rendered] = []  # at most one entry: the latest snapshot's bodies

    def latest_or_503() -> Snapshot:
        snapshot = snapshots.latest()
        if snapshot is None:
            raise HTTPException(503, "starting: no cycle has completed yet")
        return snapshot

    def bodies(snapshot: Snapshot) -> _Rendered:
        if rendered and rendered[0].snapshot is snapshot:
            return rendered[0]
        document = status_document(snapshot)
        entry = _Rendered(snapshot, _dumps(document), _dumps(document["gpus"]))
        rendered[:] = [entry]
        return entry

    @app.head("/healthz", include_in_schema=False)
    @app.get(
        "/healthz", response_model=None, responses={200: {"model": HealthDoc}, 503: {"model": HealthDoc}}
    )
    async def healthz() -> Response:
        """200 while the last cycle is younger than max(3 periods, 5 s); else 503 (stale/starting);
        503 ``failing`` as soon as 3 cycles in a row raised; ``degraded`` (still 200: the loop runs) the
        moment one cycle raised or a job could not be judged or recorded, with what failed. (Answered
        by :class:`HealthFirst` ahead of routing; this route documents it.)"""
        document, status_code = health()
        return _json(document, status_code)

    @app.get("/status", response_model=None, responses={200: {"model": StatusDoc}})
    async def status() -> Response:
        """The latest cycle: node, mode, every GPU and every job with its verdict and evidence."""
        return Response(bodies(latest_or_503()).status, media_type="application/json")

    @app.get("/gpus", response_model=None, responses={200: {"model": list[GpuDoc]}})
    async def gpus() -> Response:
        """The ``gpus`` list of ``/status`` alone."""
        return Response(bodies(latest_or_503()).gpus, media_type="application/json")

    @app.get("/events", response_model=None, responses={200: {"model": EventsDoc}})
    def list_events(
        since: Annotated[
            int, Query(ge=0, le=2**63 - 1, description="Return events with id greater than this")
        ] = 0,
        limit: Annotated[int, Query(ge=1, le=EVENTS_LIMIT_MAX)] = EVENTS_LIMIT_DEFAULT,
    ) -> Response:
        """Events with id greater than ``since``, oldest first (a sync handler: the store is SQLite)."""
        if events is None:
            raise HTTPException(503, "no event store")
        try:
            found = events.since(since, limit + 1)
        except RuntimeError as error:
            raise HTTPException(503, f"event store unavailable: {error}") from None
        rows = [row.to_dict() if hasattr(row, "to_dict") else dict(row) for row in found]
        page = rows[:limit]
        next_since = int(page[-1]["id"]) if page else since
        return _json(
            {
                "events": page,
                "since": since,
                "limit": limit,
                "next_since": next_since,
                "more": len(rows) > limit,
            }
        )

    @app.get("/tables/current", response_model=None)
    def tables_current() -> Response:
        """The power table(s) in use, as data."""
        return _json(table())

    @app.get(
        "/metrics",
        response_model=None,
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}},
    )
    async def metrics(request: Request) -> Response:
        """Prometheus exposition (OpenMetrics when the scraper asks for it)."""
        accept = request.headers.get("accept")
        if exposition is not None:
            body, content_type = exposition.render(accept)
        else:
            assert metrics_registry is not None
            body, content_type = render(metrics_registry, accept)
        return Response(body, headers={"Content-Type": content_type})


def _add_control_routes(
    app: FastAPI, snapshots: SnapshotHolder, control: Control | None, clock: Callable[[], float]
) -> None:
    """The commands: ``/arm``, ``/disarm`` and the silences (mutating ones need the token)."""

    def accepted(mode: Mode, armed: bool) -> Response:
        snapshot = snapshots.latest()
        return _json(
            {
                "accepted": True,
                "mode": mode,
                "armed": armed,
                "current_mode": snapshot.mode if snapshot else None,
                "applies": "next_cycle",
            },
            202,
        )

    @app.post(
        "/arm",
        status_code=202,
        response_model=None,
        responses={202: {"model": CommandDoc}},
        openapi_extra=_body_spec(ArmRequest),
    )
    async def arm(request: Request, _auth: Authorized, ctl: Controlled) -> Response:
        """Switch to ``alert`` or ``kill`` mode (applied by the loop at its next cycle)."""
        body = await _parse_body(request, ArmRequest)
        mode = Mode(body.mode)
        try:
            ctl.arm(mode)
        except ControlRefused as refused:
            raise HTTPException(409, str(refused)) from None
        return accepted(mode, True)

    @app.post("/disarm", status_code=202, response_model=None, responses={202: {"model": CommandDoc}})
    async def disarm(_auth: Authorized, ctl: Controlled) -> Response:
        """Back to ``observe`` (applied by the loop at its next cycle)."""
        ctl.disarm()
        return accepted(Mode.OBSERVE, False)

    @app.post(
        "/silences",
        status_code=201,
        response_model=None,
        responses={201: {"model": SilenceDoc}},
        openapi_extra=_body_spec(SilenceRequest),
    )
    async def add_silence(request: Request, _auth: Authorized, ctl: Controlled) -> Response:
        """Silence alerts whose labels match every matcher exactly, for ``duration_s``."""
        body = await _parse_body(request, SilenceRequest)
        try:
            SilenceBook.validate(body.matchers, body.duration_s, body.comment)
            silence = ctl.add_silence(body.matchers, body.duration_s, body.comment, clock())
        except ValueError as invalid:
            raise RequestValidationError(
                [{"type": "value_error", "loc": ("body",), "msg": str(invalid)}]
            ) from None
        return _json(silence, 201)

    @app.get("/silences", response_model=None, responses={200: {"model": list[SilenceDoc]}})
    async def list_silences() -> Response:
        """Active silences (readable without a token)."""
        return _json(control.list_silences(clock()) if control is not None else [])

    @app.delete(
        "/silences/{silence_id}",
        status_code=204,
        response_model=None,
        responses={404: {"description": "No such silence"}},
    )
    async def delete_silence(silence_id: str, _auth: Authorized, ctl: Controlled) -> Response:
        """Expire a silence now."""
        if not ctl.delete_silence(silence_id):
            raise HTTPException(404, f"no silence {silence_id!r}")
        return Response(status_code=204)
