"""The health door's request classifier and its answer (pure functions of the bytes read)."""

from __future__ import annotations

import pytest

from gpu_triage.serving.health_door import MAX_HEAD_BYTES, classify, host_header, response


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "health"),
        (b"HEAD /healthz HTTP/1.0\r\n\r\n", "health"),
        (b"GET /healthz?probe=1 HTTP/1.1\n\n", "health"),
        (b"G", "wait"),
        (b"HEAD /heal", "wait"),
        (b"GET /healthz", "wait"),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", "wait"),
        (b"GET /metrics HTTP/1.1\r\n", "app"),
        (b"GET /healthzz HTTP/1.1\r\n\r\n", "app"),
        (b"POST /healthz HTTP/1.1\r\n\r\n", "app"),
        (b"GET /healthz HTTP/2.0\r\n\r\n", "app"),
        (b"\x16\x03\x01", "app"),  # a TLS hello: the app answers (400) as before
        (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES, "app"),  # too long: the app's limits
    ],
)
def test_classify(head: bytes, kind: str) -> None:
    assert classify(head) == kind


def test_response_carries_the_answer_and_the_host_header_reaches_it() -> None:
    seen: list[str | None] = []

    def answer(host: str | None) -> tuple[int, bytes]:
        seen.append(host)
        return 503, b'{"status":"stale"}'

    get = response(b"GET /healthz HTTP/1.1\r\nhOsT:  node-7:9410 \r\n\r\n", answer)
    assert get.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"content-length: 18\r\n" in get and get.endswith(b'\r\n\r\n{"status":"stale"}')
    head = response(b"HEAD /healthz HTTP/1.1\r\n\r\n", answer)
    assert head.endswith(b"\r\n\r\n") and b"content-length: 18" in head
    assert seen == ["node-7:9410", None]
    assert host_header(b"GET /healthz HTTP/1.1\r\n\r\nHost: body\r\n") is None


def test_hostile_request_heads_never_raise_and_only_well_formed_probes_are_answered() -> None:
    """The door parses bytes from anyone: mutated request heads (tests/watchdog/fuzz_inputs.mutate)
    are classified without raising, answered only when they are a complete GET/HEAD /healthz
    request, and a health answer is always one bounded, well-formed response."""
    import random

    from tests.watchdog.fuzz_inputs import mutate

    seeds = [
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:9410\r\nUser-Agent: kube-probe/1.29\r\n\r\n",
        b"HEAD /healthz?x=1 HTTP/1.0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n",
    ]
    rng = random.Random(30)

    def answer(host: str | None) -> tuple[int, bytes]:
        assert host is None or isinstance(host, str)
        return 200, b"{}"

    for _ in range(3000):
        head = mutate(rng.choice(seeds), rng)[: MAX_HEAD_BYTES + 64]
        kind = classify(head)
        assert kind in ("health", "app", "wait")
        if kind == "health":
            assert head.startswith((b"GET /healthz", b"HEAD /healthz"))
            out = response(head, answer)
            assert out.startswith(b"HTTP/1.1 200 OK\r\n") and len(out) < 512


def test_doors_lower_the_switch_interval_while_any_runs_and_restore_it() -> None:
    import socket
    import sys

    from gpu_triage.serving.health_door import SWITCH_INTERVAL_S, HealthDoor

    before = sys.getswitchinterval()
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    doors = [
        HealthDoor(s, lambda host: (200, b"{}"), lambda batch: None, max_pending=16, request_timeout_s=1.0)
        for s in listeners
    ]
    try:
        doors[0].start()
        doors[1].start()
        assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL_S)
        doors[0].stop()  # the other still runs
        assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL_S)
        doors[1].stop()
        assert sys.getswitchinterval() == before
    finally:
        for s in listeners:
            s.close()
