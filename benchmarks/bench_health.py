"""``/healthz`` under attack (issue 18, item 7; issue 30): its latency under a ``/metrics`` flood and
under 1,000 slow sockets, answered by the health door (its own thread, the daemon's default) beside the
same probes answered on uvicorn's event loop behind the scrapes (``health_door=False``, the baseline).

The HTTP server runs in this process exactly as the daemon runs it (:class:`HttpServer`: uvicorn in a
thread, the connection guard; the app over a 16-GPU, 16-rank snapshot republished every second by a
stand-in loop). Everything else is a separate process, on loopback only:

- the **prober** opens a new connection per request (as ``curl``, the Slurm health check or a
  Kubernetes probe do) and asks ``GET /healthz`` 50 times a second; halfway between two probes it asks
  the same of a **bare server** (its own process: accept, read the request, answer a fixed 200, close -
  the least any Python server can do), whose latency is what the machine alone costs at that moment;
- the **flood**: 64 keep-alive connections asking ``GET /metrics`` back to back, as fast as the
  server answers;
- the **slow sockets**: 1,000 connections that send a request line and never finish their headers
  (one more byte every 2 s); a connection the server closes is opened again at once.

The server runs at the default soft limit of 1024 open files (no LimitNOFILE), the case where 1,100
slow sockets used to exhaust the descriptors of the whole daemon.

**How p99 is measured (issue 30).** A p99 is decided by the worst 1 % of the probes, so it is only as
good as their number: the bench used to send 100 probes a phase (10 s at 10/s), which made its p99 the
second-worst probe - one scheduler hiccup of a shared 2-core machine - and it ranged 2-57 ms from run
to run with no trend by commit. Now each phase runs ``ROUNDS`` times, the door and the loop alternating
(which goes first swaps each round, so a slow minute of the machine hits both), at 50 probes a second:
1,500 probes per phase and variant (3 x 10 s), 500 per round. Printed for each phase:

- the pooled p99 over all of them (the 15th-worst probe), with its distribution-free 95 % confidence
  interval (the order statistics that bracket the true p99 with 95 % probability, from the binomial
  distribution) - the budget (<= 20 ms) is judged on it;
- the median of the per-round p99s, and their range: rounds that disagree mean the machine, not the
  server, moved (a real server stall shows in every round);
- the bare server's pooled p99 in the same phase: the machine's own floor under that load;
- how many probes took over 5 ms and how many of those overlapped a garbage collection (generation 1
  or 2, over 2 ms) in the server's process - the collector holds the GIL, so the door stands still
  too (the prober and the server read the same monotonic clock).

50 probes a second do not load the server: each costs the door one accept, one read and one write
(tens of microseconds), against the thousands of connections a second the slow sockets make it accept
(the guard closes the oldest, the attacker comes back). Every client has a hard deadline, so the
benchmark is bounded in time whatever the server does (~4 minutes; ``--quick``: 1 round of 3 s).

    .venv/bin/python -m benchmarks.bench_health [--quick]
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace

from benchmarks.common import header, line
from gpu_triage.daemon.runner import settle_heap
from gpu_triage.model.states import Verdict
from gpu_triage.serving.api import create_app
from gpu_triage.serving.control import QueuedControl
from gpu_triage.serving.http_server import HttpServer
from gpu_triage.serving.publish import SnapshotHolder
from tests.watchdog.snapshots import snapshot

GPUS = 16
PROBE_RATE_PER_S = 50.0
ROUNDS = 3
FLOOD_CONNECTIONS = 64
SLOW_SOCKETS = 1000
P99_BUDGET_MS = 20.0
"""Issue 30: a probe must not wait on a scrape (a Kubernetes probe times out after 1-3 s, the Slurm
check after 5 s; 20 ms is what a health answer costs when it waits on nothing)."""

PROBER = r"""
import json, socket, sys, time
host, port, control = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rate, duration_s = float(sys.argv[4]), float(sys.argv[5])
request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
def ask(to):
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, to), timeout=10.0) as s:
            s.sendall(request)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        ok = data.startswith(b"HTTP/1.1 200")
    except OSError:
        ok = False
    return time.perf_counter() - t0, ok
latencies, control_s, failures, starts = [], [], 0, []
start = time.perf_counter()
for i in range(int(duration_s * rate)):
    for offset, to in ((0.0, port), (0.5, control)):
        delay = start + (i + offset) / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        at = time.perf_counter()
        took, ok = ask(to)
        if to == port:
            starts.append(at)
            latencies.append(took)
            failures += not ok
        else:
            control_s.append(took)
print(json.dumps({"latencies_s": latencies, "control_s": control_s, "failures": failures, "starts": starts}))
"""

BARE = r"""
import socket
listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
print(listener.getsockname()[1], flush=True)
body = b'{"status": "ok"}'
head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
answer = head + b"content-length: %d\r\n\r\n" % len(body) + body
while True:
    conn, _ = listener.accept()
    conn.settimeout(5.0)
    try:
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = conn.recv(4096)
            if not chunk:
                break
            got += chunk
        conn.sendall(answer)
    except OSError:
        pass
    finally:
        conn.close()
"""

FLOOD = r"""
import asyncio, json, sys, time
host, port, conns, duration_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
done = [0, 0]
async def worker(end):
    while time.monotonic() < end:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            while time.monotonic() < end:
                w.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
                sizes = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
                length = int(sizes[0].split(b":")[1])
                await asyncio.wait_for(r.readexactly(length), 10)
                done[0] += 1
            w.close()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, IndexError, ValueError):
            done[1] += 1
            await asyncio.sleep(0.05)
async def main():
    end = time.monotonic() + duration_s
    await asyncio.gather(*(worker(end) for _ in range(conns)))
asyncio.run(main())
print(json.dumps({"requests": done[0], "errors": done[1], "duration_s": duration_s}))
"""

SLOW = r"""
import json, resource, selectors, socket, sys, time
host, port, count, duration_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 256)), hard))
sel = selectors.DefaultSelector()
opened = closed = failed = 0
def open_one():
    global opened, failed
    try:
        s = socket.create_connection((host, port), timeout=2.0)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        opened += 1
    except OSError:
        failed += 1
for _ in range(count):
    open_one()
print("ready", flush=True)
end = time.monotonic() + duration_s
next_trickle = time.monotonic() + 2.0
while time.monotonic() < end:
    for key, _ in sel.select(timeout=0.2):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if not data:  # the server closed it: the attacker comes straight back
            sel.unregister(s); s.close(); closed += 1
            if time.monotonic() < end:
                open_one()
    if time.monotonic() >= next_trickle:
        next_trickle += 2.0
        for key in list(sel.get_map().values()):
            try:
                key.fileobj.send(b"a")
            except OSError:
                pass
held = len(sel.get_map())
print(json.dumps({"opened": opened, "closed_by_server": closed, "failed": failed, "held_at_end": held}))
"""


SLOW_PROBE_S = 0.005
"""A probe slower than this is looked at: did a garbage collection in the server overlap it?"""
GC_PAUSE_S = 0.002


class GcPauses:
    """The server process's garbage collections of generations 1 and 2 longer than :data:`GC_PAUSE_S`,
    as (start, end) on the monotonic clock: CPython's collector holds the GIL throughout, so every
    thread - the door's too - stands still meanwhile."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float]] = []
        self._start = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif info["generation"] >= 1 and time.perf_counter() - self._start > GC_PAUSE_S:
            self.pauses.append((self._start, time.perf_counter()))

    def overlapping(self, probe: dict) -> tuple[int, int, float]:
        """Of one phase's probes: how many were slower than :data:`SLOW_PROBE_S`, how many of those a
        pause overlapped, and the longest pause within the phase (ms)."""
        starts, took = probe["starts"], probe["latencies_s"]
        slow = [(a, a + d) for a, d in zip(starts, took, strict=True) if d > SLOW_PROBE_S]
        hit = sum(any(p0 < b and p1 > a for p0, p1 in self.pauses) for a, b in slow)
        end = starts[-1] + took[-1] if starts else 0.0
        within = [p1 - p0 for p0, p1 in self.pauses if starts and starts[0] <= p0 <= end]
        return len(slow), hit, max(within, default=0.0) * 1e3


class StandInLoop(threading.Thread):
    def __init__(self, holder: SnapshotHolder, period_s: float = 1.0) -> None:
        super().__init__(name="stand-in-loop", daemon=True)
        self.holder = holder
        self.period_s = period_s
        self._halt = threading.Event()

    def run(self) -> None:
        base = self.holder.latest()
        assert base is not None
        cycle = 0
        while not self._halt.wait(self.period_s):
            cycle += 1
            self.holder.publish(replace(base, cycle=base.cycle + cycle, time=time.time()))

    def stop(self) -> None:
        self._halt.set()
        self.join(2.0)


def _pct(values_s: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values_s, n=100, method="inclusive")
    return {"p50": cuts[49] * 1e3, "p99": cuts[98] * 1e3, "max": max(values_s) * 1e3}


def quantile_ci(values_s: list[float], q: float = 0.99, confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free ``confidence`` interval of the ``q`` quantile, in ms: the order statistics
    ``x(l) <= x(u)`` with P(l <= B < u) >= ``confidence``, B ~ Binomial(n, q) the count of samples
    below the true quantile (chosen as even on both sides as the binomial allows)."""
    xs = sorted(values_s)
    n = len(xs)

    def pmf(k: int) -> float:
        return math.exp(
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * math.log(q)
            + (n - k) * math.log1p(-q)
        )

    cdf, acc = [], 0.0
    for k in range(n + 1):
        acc += pmf(k)
        cdf.append(acc)  # P(B <= k)
    tail = (1.0 - confidence) / 2.0
    lo = next((k for k in range(n + 1) if cdf[k] > tail), 0)  # P(B < lo) <= tail
    hi = next((k for k in range(n + 1) if cdf[k] >= 1.0 - tail), n)  # P(B > hi) <= tail
    # samples x(lo) .. x(hi + 1) (1-based) bracket the quantile; clamp to the sample
    return xs[max(lo - 1, 0)] * 1e3, xs[min(hi, n - 1)] * 1e3


def _probe(port: int, control_port: int, duration_s: float) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBER,
            "127.0.0.1",
            str(port),
            str(control_port),
            str(PROBE_RATE_PER_S),
            str(duration_s),
        ],
        capture_output=True,
        text=True,
        timeout=duration_s + 60 + 20 * duration_s * PROBE_RATE_PER_S,
        check=True,
    )
    return json.loads(out.stdout)


def _pooled(rounds: list[dict], phase: str, key: str = "latencies_s") -> list[float]:
    return [x for r in rounds for x in r[phase][key]]


def _ms_vs_loop(name: str, value: float, base: float, *, budget: str = "", ok: bool | None = None) -> None:
    """One latency line, the door's beside the loop's (lower is better)."""
    line(name, value, "ms", baseline=base, baseline_name="on the loop", budget=budget, ok=ok,
         higher_is_better=False)  # fmt: skip


def _report(label: str, phase: str, door: list[dict], loop: list[dict]) -> None:
    """One phase (printed as ``label``): pooled percentiles (p99 with its confidence interval, the
    budget judged on it), the median and range of the rounds' p99s, failures, and the bare server's
    p99 beside."""
    p, base = _pct(_pooled(door, phase)), _pct(_pooled(loop, phase))
    n = len(_pooled(door, phase))
    _ms_vs_loop(f"p50 {label}", p["p50"], base["p50"])
    _ms_vs_loop(
        f"p99 {label} (pooled, {n} probes)",
        p["p99"],
        base["p99"],
        budget=f"<= {P99_BUDGET_MS:.0f} ms",
        ok=p["p99"] <= P99_BUDGET_MS,
    )
    ci, ci_base = quantile_ci(_pooled(door, phase)), quantile_ci(_pooled(loop, phase))
    print(
        f"      p99 95% CI: door {ci[0]:.2f}-{ci[1]:.2f} ms, on the loop {ci_base[0]:.2f}-{ci_base[1]:.2f} ms"
    )
    per_round = [_pct(r[phase]["latencies_s"])["p99"] for r in door]
    per_round_base = [_pct(r[phase]["latencies_s"])["p99"] for r in loop]
    _ms_vs_loop(
        f"p99 {label} (median of {len(door)} rounds)",
        statistics.median(per_round),
        statistics.median(per_round_base),
    )
    _print_rounds("rounds' p99: door", per_round, "on the loop", per_round_base)
    _ms_vs_loop(f"max {label}", p["max"], base["max"])
    failures = sum(r[phase]["failures"] for r in door)
    failures_base = sum(r[phase]["failures"] for r in loop)
    line(
        f"failed probes {label}",
        float(failures),
        "probes",
        baseline=float(failures_base) or None,
        baseline_name="on the loop",
        budget="0",
        ok=failures == 0,
        higher_is_better=False,
    )
    bare, bare_base = _pct(_pooled(door, phase, "control_s")), _pct(_pooled(loop, phase, "control_s"))
    line(
        f"bare server p99 {label} (the machine)",
        bare["p99"],
        "ms",
        baseline=bare_base["p99"],
        baseline_name="during the loop's",
        higher_is_better=False,
    )
    for name, rounds in (("door", door), ("on the loop", loop)):
        slow_n = sum(r[phase]["gc"][0] for r in rounds)
        hit_n = sum(r[phase]["gc"][1] for r in rounds)
        longest_ms = max(r[phase]["gc"][2] for r in rounds)
        print(
            f"      {name}: {slow_n} probes over {SLOW_PROBE_S * 1e3:.0f} ms, {hit_n} of them during a "
            f"garbage collection of the server (longest in the phase {longest_ms:.1f} ms)"
        )
    bare_rounds = [_pct(r[phase]["control_s"])["p99"] for r in door]
    bare_rounds_base = [_pct(r[phase]["control_s"])["p99"] for r in loop]
    _print_rounds("rounds' bare p99: beside the door", bare_rounds, "beside the loop", bare_rounds_base)


def _print_rounds(label: str, values_ms: list[float], base_label: str, base_ms: list[float]) -> None:
    """One line of per-round values (ms), the door's then the loop's."""
    door, loop = (" / ".join(f"{v:.2f}" for v in vs) for vs in (values_ms, base_ms))
    print(f"      {label} {door} ms, {base_label} {loop} ms")


def run(quick: bool = False) -> None:
    import resource

    # The server runs at the usual default soft limit of 1024 open files (a node without the unit's
    # LimitNOFILE): the connection guard alone must keep the slow sockets from exhausting it.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        _run(quick)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _run(quick: bool) -> None:
    duration_s, rounds = (3.0, 1) if quick else (10.0, ROUNDS)
    header(
        f"/healthz under attack: {rounds} x {duration_s:.0f} s per phase (the door and the loop "
        f"alternating), probes at {PROBE_RATE_PER_S:.0f}/s (new connection each) and as many to a bare "
        f"server, server at 1024 open files, loopback only; the health door beside /healthz on the "
        f"event loop (baseline)"
    )
    bare = subprocess.Popen([sys.executable, "-c", BARE], stdout=subprocess.PIPE, text=True)
    try:
        assert bare.stdout is not None
        control_port = int(bare.stdout.readline())
        door: list[dict] = []
        loop: list[dict] = []
        for r in range(rounds):
            for health_door in (False, True) if r % 2 == 0 else (True, False):
                (door if health_door else loop).append(
                    _phases(duration_s, control_port, health_door=health_door)
                )
    finally:
        bare.kill()
        bare.wait()
    flood, slow = f"under a /metrics flood ({FLOOD_CONNECTIONS} conns)", f"beside {SLOW_SOCKETS} slow sockets"
    print("  /healthz latency (new connection per probe); the door's, beside the loop's:")
    for label, phase in (("quiet", "quiet"), ("flood", flood), ("slow sockets", slow)):
        _report(label, phase, door, loop)
    for name, unit in (
        ("/metrics flood served", "req/s"),
        ("slow sockets closed by the connection guard", "sockets"),
        ("slow sockets held open at the end (client side)", "sockets"),
        ("slow sockets refused or failed (client side)", "sockets"),
    ):
        value = statistics.median(r[name] for r in door)
        before = statistics.median(r[name] for r in loop)
        line(f"{name} (median of rounds)", value, unit, baseline=before or None, baseline_name="on the loop")


def _phases(duration_s: float, control_port: int, *, health_door: bool) -> dict:
    """The three phases against one server: the probes' latencies and the attackers' counts."""
    out: dict = {}
    holder = SnapshotHolder(snapshot(gpus=GPUS, verdict=Verdict.DEADLOCK_SUSPECTED, time=time.time()))
    app = create_app(
        snapshots=holder, events=None, table=dict, control=QueuedControl(), token=None, period_s=1.0
    )
    server = HttpServer(app, "127.0.0.1", 0, health_door=health_door)
    server.start()
    settle_heap()  # as `gpu-watchdog run` does once it listens
    loop = StandInLoop(holder)
    loop.start()
    port = server.port
    pauses = GcPauses().__enter__()
    try:
        out["quiet"] = _probe(port, control_port, duration_s)

        flood = subprocess.Popen(
            [
                sys.executable,
                "-c",
                FLOOD,
                "127.0.0.1",
                str(port),
                str(FLOOD_CONNECTIONS),
                str(duration_s + 2),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # the flood is on before the first probe
        out[f"under a /metrics flood ({FLOOD_CONNECTIONS} conns)"] = _probe(port, control_port, duration_s)
        flood_out, _ = flood.communicate(timeout=duration_s + 60)
        stats = json.loads(flood_out)
        out["/metrics flood served"] = stats["requests"] / stats["duration_s"]

        slow = subprocess.Popen(
            [sys.executable, "-c", SLOW, "127.0.0.1", str(port), str(SLOW_SOCKETS), str(duration_s + 2)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert slow.stdout is not None
        slow.stdout.readline()  # "ready": all sockets opened (or refused)
        evicted_before = _evicted(server)
        out[f"beside {SLOW_SOCKETS} slow sockets"] = _probe(port, control_port, duration_s)
        slow_out, _ = slow.communicate(timeout=duration_s + 60)
        held = json.loads(slow_out)
        out["slow sockets closed by the connection guard"] = float(_evicted(server) - evicted_before)
        out["slow sockets held open at the end (client side)"] = float(held["held_at_end"])
        out["slow sockets refused or failed (client side)"] = float(held["failed"])
    finally:
        pauses.__exit__()
        loop.stop()
        server.stop(2.0)
    for phase in (
        "quiet",
        f"under a /metrics flood ({FLOOD_CONNECTIONS} conns)",
        f"beside {SLOW_SOCKETS} slow sockets",
    ):
        out[phase]["gc"] = pauses.overlapping(out[phase])
    return out


def _evicted(server: HttpServer) -> int:
    return server.protocol.evicted + (server.door.evicted if server.door is not None else 0)


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
