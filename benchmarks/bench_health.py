"""``/healthz`` under attack (issue 18, item 7; issue 30): its latency under a ``/metrics`` flood and
under 1,000 slow sockets, answered by the health door (its own thread, the daemon's default) beside the
same probes answered on uvicorn's event loop behind the scrapes (``health_door=False``, the baseline).

The HTTP server runs in this process exactly as the daemon runs it (:class:`HttpServer`: uvicorn in a
thread, the connection guard; the app over a 16-GPU, 16-rank snapshot republished every second by a
stand-in loop). Everything else is a separate process, on loopback only:

- the **prober** opens a new connection per request (as ``curl``, the Slurm health check or a
  Kubernetes probe do) and asks ``GET /healthz`` 10 times a second;
- the **flood**: 64 keep-alive connections asking ``GET /metrics`` back to back, as fast as the
  server answers;
- the **slow sockets**: 1,000 connections that send a request line and never finish their headers
  (one more byte every 2 s); a connection the server closes is opened again at once.

The server runs at the default soft limit of 1024 open files (no LimitNOFILE), the case where 1,100
slow sockets used to exhaust the descriptors of the whole daemon.

Each phase lasts ``duration_s`` (3 s with ``--quick``); every client has a hard deadline, so the
benchmark is bounded in time whatever the server does.

    .venv/bin/python -m benchmarks.bench_health [--quick]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace

from benchmarks.common import header, line
from gpu_triage.model.states import Verdict
from gpu_triage.serving.api import create_app
from gpu_triage.serving.control import QueuedControl
from gpu_triage.serving.http_server import HttpServer
from gpu_triage.serving.publish import SnapshotHolder
from tests.watchdog.snapshots import snapshot

GPUS = 16
PROBE_RATE_PER_S = 10.0
FLOOD_CONNECTIONS = 64
SLOW_SOCKETS = 1000
P99_BUDGET_MS = 20.0
"""Issue 30: a probe must not wait on a scrape (a Kubernetes probe times out after 1-3 s, the Slurm
check after 5 s; 20 ms is what a health answer costs when it waits on nothing)."""

PROBER = r"""
import json, socket, sys, time
host, port, rate, duration_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
latencies, failures = [], 0
start = time.perf_counter()
for i in range(int(duration_s * rate)):
    delay = start + i / rate - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=10.0) as s:
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
    latencies.append(time.perf_counter() - t0)
    failures += not ok
print(json.dumps({"latencies_s": latencies, "failures": failures}))
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


def _probe(port: int, duration_s: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBER, "127.0.0.1", str(port), str(PROBE_RATE_PER_S), str(duration_s)],
        capture_output=True,
        text=True,
        timeout=duration_s + 60 + 10 * duration_s * PROBE_RATE_PER_S,
        check=True,
    )
    return json.loads(out.stdout)


def _report(name: str, measured: dict, before: dict) -> None:
    p = _pct(measured["latencies_s"])
    base = _pct(before["latencies_s"])
    for cut in ("p50", "p99", "max"):
        budget = f"<= {P99_BUDGET_MS:.0f} ms" if cut == "p99" else ""
        line(
            f"/healthz {cut} {name}",
            p[cut],
            "ms",
            baseline=base[cut],
            baseline_name="on the loop",
            budget=budget,
            ok=p[cut] <= P99_BUDGET_MS if budget else None,
            higher_is_better=False,
        )
    line(
        f"/healthz failed probes {name}",
        float(measured["failures"]),
        "probes",
        baseline=float(before["failures"]) or None,
        baseline_name="on the loop",
        budget="0",
        ok=measured["failures"] == 0,
        higher_is_better=False,
    )


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
    duration_s = 3.0 if quick else 10.0
    header(
        f"/healthz under attack: {duration_s:.0f} s per phase, probes at {PROBE_RATE_PER_S:.0f}/s "
        f"(new connection each), server at 1024 open files, loopback only; "
        f"the health door beside /healthz on the event loop (baseline)"
    )
    before = _phases(duration_s, health_door=False)
    after = _phases(duration_s, health_door=True)
    flood, slow = f"under a /metrics flood ({FLOOD_CONNECTIONS} conns)", f"beside {SLOW_SOCKETS} slow sockets"
    for phase in ("quiet", flood, slow):
        _report(phase, after[phase], before[phase])
    for name, unit in (
        ("/metrics flood served", "req/s"),
        ("slow sockets closed by the connection guard", "sockets"),
        ("slow sockets held open at the end (client side)", "sockets"),
        ("slow sockets refused or failed (client side)", "sockets"),
    ):
        line(name, after[name], unit, baseline=before[name] or None, baseline_name="on the loop")


def _phases(duration_s: float, *, health_door: bool) -> dict:
    """The three phases against one server: the probes' latencies and the attackers' counts."""
    out: dict = {}
    holder = SnapshotHolder(snapshot(gpus=GPUS, verdict=Verdict.DEADLOCK_SUSPECTED, time=time.time()))
    app = create_app(
        snapshots=holder, events=None, table=dict, control=QueuedControl(), token=None, period_s=1.0
    )
    server = HttpServer(app, "127.0.0.1", 0, health_door=health_door)
    server.start()
    loop = StandInLoop(holder)
    loop.start()
    port = server.port
    try:
        out["quiet"] = _probe(port, duration_s)

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
        out[f"under a /metrics flood ({FLOOD_CONNECTIONS} conns)"] = _probe(port, duration_s)
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
        out[f"beside {SLOW_SOCKETS} slow sockets"] = _probe(port, duration_s)
        slow_out, _ = slow.communicate(timeout=duration_s + 60)
        held = json.loads(slow_out)
        out["slow sockets closed by the connection guard"] = float(_evicted(server) - evicted_before)
        out["slow sockets held open at the end (client side)"] = float(held["held_at_end"])
        out["slow sockets refused or failed (client side)"] = float(held["failed"])
    finally:
        loop.stop()
        server.stop(2.0)
    return out


def _evicted(server: HttpServer) -> int:
    return server.protocol.evicted + (server.door.evicted if server.door is not None else 0)


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
