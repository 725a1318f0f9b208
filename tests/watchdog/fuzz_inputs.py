"""A seeded mutation fuzzer for the three hostile inputs: nvidia-smi CSV recordings, config files and
progress files (issue 11). Run by ``test_fuzz.py`` in a subprocess with a memory cap::

    python -m tests.watchdog.fuzz_inputs {csv|config|progress|prometheus|names|kmsg} COUNT SEED

Each input is a valid seed document mutated a few times (bytes flipped, inserted, deleted,
duplicated; lines spliced, truncated; hostile tokens - NaN, Infinity, 1e309, huge integers, deep
brackets, a 1970 timestamp, a 2 MiB line, NUL, CR - put in place of a field). Every input must end in
a *clean* outcome:

- ``csv``: ``gpu-watchdog triage`` (``cli.main``, in process) returns 0/1, or 2 with the error on
  stderr starting ``gpu-watchdog triage: error: FILE:LINE:FIELD:`` (or naming the file);
- ``config``: :func:`load_config` returns a Config or raises ConfigError naming the file;
- ``progress``: :func:`parse_record` returns a record or raises ProgressFormatError, and a
  :class:`ProgressReader` over the file lists it as a per-file error or reads it;
- ``prometheus``: a Prometheus query answer (other nodes' facts, issue 21; the recording rules'
  aggregates, issue 26): ``parse_vector`` returns samples or raises PromError; the facts and the job
  summary built from them and the fusion rule never raise;
- ``names``: directory and file names as bytes (:func:`run_names`): the reader reads the job or
  reports it, and its reports, log lines, environment job keys and event-store rows stay printable,
  bounded, one line each;
- ``kmsg``: kernel log text (issue 27): ``parse_line`` reads each line or ignores it, and the health
  signal over it as a log file builds a bounded, printable node verdict.

Anything else is a traceback; an input taking more than ``HANG_S`` is a hang (SIGALRM). The summary
is one JSON line on stdout: counts, the slowest input, peak RSS (``VmHWM``) and every failure.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

HANG_S = 20

TOKENS = [
    b"NaN",
    b"nan",
    b"Infinity",
    b"-inf",
    b"inf",
    b"1e309",
    b"-1",
    b"0",
    b"99999999999999999999999",
    b"1000000",
    b"[N/A]",
    b"",
    b" ",
    b'"',
    b"\x00",
    b"\r",
    b"\xff\xfe",
    b"[" * 3000,
    b"{" * 3000,
    b"1970/01/01 00:00:00.000",
    b"2024/13/45 25:61:61.999",
    b"9999/12/31 23:59:59.999",
    b"true",
    b"null",
    b"[[[]]]",
    b'{"a": 1}',
    b"x" * 5000,
]


def mutate(seed: bytes, rng: random.Random) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:  # flip a byte
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op == 1:  # insert random bytes
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and data:  # delete a range
            del data[pos : pos + rng.randint(1, 64)]
        elif op == 3 and data:  # duplicate a range
            end = min(len(data), pos + rng.randint(1, 200))
            data[end:end] = data[pos:end] * rng.randint(1, 20)
        elif op == 4:  # a hostile token in place of a field
            fields = [i for i, c in enumerate(data) if c in b",=:\n"]
            at = rng.choice(fields) + 1 if fields else pos
            end = at
            while end < len(data) and data[end] not in b",\n}":
                end += 1
            data[at:end] = rng.choice(TOKENS)
        elif op == 5:  # truncate
            del data[pos:]
        elif op == 6:  # splice lines: repeat, drop or swap one
            lines = bytes(data).split(b"\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            choice = rng.randrange(3)
            if choice == 0:
                lines.insert(i, lines[j])
            elif choice == 1:
                del lines[i]
            else:
                lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
        elif op == 7 and rng.random() < 0.05:  # rarely: a very long line
            data[pos:pos] = b"1" * (2 << 20)
        else:  # a token anywhere
            data[pos:pos] = rng.choice(TOKENS)
    return bytes(data)


# ------------------------------------------------------------------------------------- seeds


def csv_seeds() -> list[bytes]:
    rows_index = [
        "timestamp, index, name, power.draw [W], power.limit [W], utilization.gpu [%], memory.used [MiB]"
    ]
    rows_plain = ["timestamp, power.draw [W], utilization.gpu [%]"]
    rows_uuid = ["timestamp, uuid, power.draw [W], utilization.gpu [%]"]
    t0 = 1_700_000_000
    for s in range(12):
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(t0 + s)) + ".123"
        for g in range(2):
            power = 650.0 if s < 6 else 180.0
            rows_index.append(
                f"{stamp}, {g}, NVIDIA H100 80GB HBM3, {power:.2f} W, 700.00 W, "
                f"{95 if s < 6 else 100} %, 40000 MiB"
            )
            rows_plain.append(f"{stamp}, {power:.2f} W, 90 %")
            rows_uuid.append(f"{stamp}, GPU-{g:08d}-aaaa, {power:.2f} W, 90 %")
    return [("\n".join(r) + "\n").encode() for r in (rows_index, rows_plain, rows_uuid)]


def config_seeds() -> list[bytes]:
    example = Path(__file__).resolve().parents[2] / "deploy" / "config.example.toml"
    small = b"""[daemon]
listen = "127.0.0.1:9410"
period_s = 1.0
allowed_hosts = ["node01"]
[detector]
fast_min_s = 60.0
[classifier.dwell_s]
compute = 3.0
[[alerts.sinks]]
kind = "webhook"
url = "http://127.0.0.1:9/hook"
timeout_s = 2.0
"""
    return [example.read_bytes(), small]


def progress_seeds() -> list[bytes]:
    base = {
        "job": "j",
        "rank": 0,
        "local_rank": 0,
        "world_size": 2,
        "pid": 1,
        "host": "elsewhere",
        "step": 10,
        "epoch": 0,
        "tokens": 100,
        "phase": "train",
        "lease_until": None,
        "time": 1_700_000_000.5,
    }
    lease = {**base, "phase": "checkpoint", "lease_until": 1_700_000_600.0, "lease_scope": "job"}
    return [json.dumps(base).encode(), json.dumps(lease, indent=1).encode()]


def name_seeds() -> list[bytes]:
    """Directory and file names as bytes (issue 18): valid job names, non-UTF-8 bytes, a newline that
    would forge a log line, ESC, bidi overrides, the longest name the file system allows."""
    return [
        b"qwen3-32b-ft",
        b"j",
        b"slurm-4242.0",
        b"\xff\xfejob",
        b"x\n2026-12-03 10:00:00,000 CRITICAL gpu_watchdog.events: kill job=prod sigterm ok",
        b"esc\x1b[2J\x1b]0;title\x07",
        "bidi\u202ejob\u2028".encode(),
        b"a" * 255,
    ]


# ------------------------------------------------------------------------------------- runners


def run_csv(data: bytes, tmp: Path) -> str:
    from gpu_triage.cli import main as cli

    path = tmp / "rec.csv"
    path.write_bytes(data)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["triage", "--no-progress", "--json", str(path)])
    if code in (0, 1):
        return "result"
    message = err.getvalue()
    if code == 2 and f"gpu-watchdog triage: error: {path}" in message:
        return "error"
    raise AssertionError(f"exit {code}: {message[:500]}")


def run_config(data: bytes, tmp: Path) -> str:
    from gpu_triage.daemon.config import ConfigError, load_config

    path = tmp / "config.toml"
    path.write_bytes(data)
    try:
        load_config(path, {})
    except ConfigError as e:
        if str(path) not in str(e):
            raise AssertionError(f"error not naming the file: {e}") from None
        return "error"
    return "result"


def run_progress(data: bytes, tmp: Path) -> str:
    from gpu_triage.signals.progress import ProgressReader
    from gpu_triage.signals.progress_model import ProgressFormatError, parse_record

    try:
        parse_record(data)
        outcome = "result"
    except ProgressFormatError:
        outcome = "error"
    job = tmp / "progress" / "j"
    job.mkdir(parents=True, exist_ok=True)
    (job / "rank-0.json").write_bytes(data)
    view = ProgressReader(tmp / "progress", host="here").read(1_700_000_001.0)
    read = bool(view.jobs) or any(e.path.name == "rank-0.json" for e in view.errors)
    if not read:
        raise AssertionError("the reader neither read the file nor reported it")
    return outcome


def _fs_name(data: bytes, fallback: bytes) -> bytes:
    """A name the kernel accepts: no '/' nor NUL, 1-255 bytes, not '.' or '..'."""
    name = data.replace(b"/", b"_").replace(b"\0", b"_")[:255]
    return fallback if name in (b"", b".", b"..") else name


def run_names(data: bytes, tmp: Path) -> str:
    """The name as a job directory (holding a record whose ``job`` is that name, decoded as the reader
    decodes it), as a file name beside a rank file, and as ``GPU_WATCHDOG_JOB``: the reader reads the
    job or reports it; what it reports, logs and records is printable and bounded."""
    import os
    import shutil

    from gpu_triage.journal import logs
    from gpu_triage.journal.eventstore import EventStore
    from gpu_triage.model.names import job_name_problem, printable
    from gpu_triage.signals.progress import ProgressReader
    from gpu_triage.signals.ranks import job_key

    root = tmp / "names"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    raw = bytes(root)
    name = _fs_name(data, b"j")
    job = os.fsdecode(name)
    record = {**json.loads(progress_seeds()[0]), "job": job, "host": "here"}
    os.mkdir(raw + b"/" + name)
    with open(raw + b"/" + name + b"/rank-0.json", "wb") as f:
        f.write(json.dumps(record).encode())
    with open(raw + b"/" + name + b"/" + _fs_name(data[::-1], b"k"), "wb") as f:
        f.write(b"{}")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.TextFormatter(logs.TEXT_FORMAT))
    progress_log = logging.getLogger("gpu_triage.progress")
    progress_log.addHandler(handler)
    try:
        view = ProgressReader(root, host="here").read(1_700_000_001.0)
    finally:
        progress_log.removeHandler(handler)
    for j in view.jobs:
        if job_name_problem(j) is not None:
            raise AssertionError(f"a job the reader should have refused: {j!r}")
    for e in view.errors:
        where = printable(str(e.path))
        if not where.isprintable() or len(where) > 400:
            raise AssertionError(f"an error entry that is not one bounded line: {where!r}")
    lines = stream.getvalue().splitlines()
    if any("\x1b" in line for line in lines) or len(lines) != stream.getvalue().count(" WARNING "):
        raise AssertionError(f"a log line was split or carries ESC: {lines!r}")
    key = job_key({"GPU_WATCHDOG_JOB": job})
    if key is None or not key.isprintable() or len(key) > 64:
        raise AssertionError(f"an environment job key that is not bounded and printable: {key!r}")
    with EventStore(tmp / "store", 1_700_000_000.0) as store:
        store.append("verdict", {"job": job}, time_s=1_700_000_000.0, job=job)
    return "result" if view.jobs else "error"


def prometheus_seeds() -> list[bytes]:
    """Prometheus's answers to the fleet selector (issue 21): other nodes' facts about one job."""
    job, t = "master-10.0.0.1:29500", 1_700_000_000.0
    series = []
    for node, ranks in (("node-a", (0, 1)), ("node-b", (2, 3))):
        base = {"training_job": job, "fleet_node": node, "job": "gpu-watchdog", "instance": f"{node}:9410"}
        series.append(
            {
                "metric": {"__name__": "gpu_watchdog_fleet_facts_timestamp_seconds", **base},
                "value": [t, str(t - 1)],
            }
        )
        series.append({"metric": {"__name__": "gpu_watchdog_fleet_world_size", **base}, "value": [t, "4"]})
        series.append(
            {
                "metric": {"__name__": "gpu_watchdog_fleet_verdict", **base, "verdict": "stalled"},
                "value": [t, "1"],
            }
        )
        series.append(
            {"metric": {"__name__": "gpu_watchdog_fleet_io_active", **base, "io": "write"}, "value": [t, "0"]}
        )
        for r in ranks:
            rl = {**base, "rank": str(r)}
            where = (
                "collective barrier @ train.py:90 main"
                if r == 0
                else "collective all_reduce @ train.py:40 main"
            )
            series.append(
                {
                    "metric": {
                        "__name__": "gpu_watchdog_fleet_rank_stack_since_timestamp_seconds",
                        **rl,
                        "phase": "collective",
                        "where": where,
                        "collective": "barrier" if r == 0 else "all_reduce",
                    },
                    "value": [t, str(t - 60)],
                }
            )
            series.append(
                {
                    "metric": {"__name__": "gpu_watchdog_fleet_rank_stack_sampled_timestamp_seconds", **rl},
                    "value": [t, str(t - 2)],
                }
            )
            series.append({"metric": {"__name__": "gpu_watchdog_fleet_rank_step", **rl}, "value": [t, "120"]})
            series.append(
                {
                    "metric": {
                        "__name__": "gpu_watchdog_fleet_rank_phase_since_timestamp_seconds",
                        **rl,
                        "phase": "train",
                    },
                    "value": [t, str(t - 600)],
                }
            )
        series.append(
            {
                "metric": {"__name__": "gpu_watchdog_fleet_last_facts_timestamp_seconds", **base},
                "value": [t, str(t - 90)],
            }
        )
    ok = {"status": "success", "data": {"resultType": "vector", "result": series}}
    err = {"status": "error", "errorType": "bad_data", "error": "invalid parameter"}
    # the recording rules' aggregates of the same job (issue 26: [cluster] job_rules)
    jl = {"training_job": job}
    group = {
        **jl,
        "where": "collective all_reduce @ train.py:40 main",
        "phase": "collective",
        "collective": "x",
    }
    tj, tw = "training_job:gpu_watchdog_fleet_", "training_job_where:gpu_watchdog_fleet_"

    def one(name: str, labels: dict[str, str], value: float) -> dict[str, object]:
        return {"metric": {"__name__": name, **labels}, "value": [t, str(value)]}

    rules = [
        one(tj + "world_size:max", jl, 4),
        one(tj + "nodes:count", jl, 2),
        one(tj + "ranks_reported:count", jl, 4),
        one(tj + "rank_reports:count", jl, 4),
        one(tw + "stack_ranks:count", group, 4),
        one(tw + "stack_frozen:min_seconds", group, 58),
        one(tj + "odd_rank:since_timestamp_seconds", {**jl, "fleet_node": "node-a", "rank": "0"}, t - 60),
        one("training_job_fleet_node:gpu_watchdog_fleet_oldest_facts:timestamp_seconds",
            {**jl, "fleet_node": "node-x"}, t - 90),
        one("training_job_fleet_node:gpu_watchdog_fleet_io_active:first",
            {**jl, "fleet_node": "node-a", "io": "write"}, 1),
        one(tj + "save_work_rank:since_timestamp_seconds",
            {**jl, "fleet_node": "node-a", "rank": "0", "phase": "checkpoint"}, t - 5),
    ]  # fmt: skip
    summary = {"status": "success", "data": {"resultType": "vector", "result": rules}}
    return [json.dumps(ok).encode(), json.dumps(ok, indent=1).encode(), json.dumps(err).encode(),
            json.dumps(summary).encode()]  # fmt: skip


def run_prometheus(data: bytes, tmp: Path) -> str:
    """A Prometheus answer: parsed into samples or refused (PromError); then the other nodes' facts
    and the fusion rule on them never raise."""
    from gpu_triage.signals.fleet.fusion import fuse
    from gpu_triage.signals.fleet.prom_client import PromError, parse_vector
    from gpu_triage.signals.fleet.remote import remote_facts
    from gpu_triage.verdicts.settings import DetectorConfig

    try:
        samples = parse_vector(data)
    except PromError:
        return "error"
    from gpu_triage.signals.fleet.remote import RemoteFacts
    from gpu_triage.signals.fleet.summary import job_summary

    job = "master-10.0.0.1:29500"
    remote = remote_facts(job, samples, own_node="node-c", asked_at=1_700_000_001.0)
    fuse(1_700_000_001.0, own_node="node-c", world_size=6, local_ranks=[4, 5], local_stacks=None,
         remote=remote, cfg=DetectorConfig().fusion())  # fmt: skip
    summary = job_summary(job, samples, now=1_700_000_001.0, stale_after_s=15.0)
    if summary is not None:
        ruled = RemoteFacts(job, 1_700_000_001.0, summary=summary)
        fuse(1_700_000_001.0, own_node="node-c", world_size=None, local_ranks=[4, 5], local_stacks=None,
             remote=ruled, cfg=DetectorConfig().fusion())  # fmt: skip
    return "result"


def kmsg_seeds() -> list[bytes]:
    """Kernel log text (issue 27): NVIDIA's Xid lines in every wrapper the log sources add, a GPU
    fallen off the bus, lines that are no Xid."""
    lines = [
        b"3,1234,567890123,-;NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
        b"GPU has fallen off the bus.",
        b"Nov 22 18:29:55 host kernel: [ 966.503025] NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 1",
        b"Oct 01 13:00:00 host kernel: NVRM: Xid (PCI:0000:06:00): 41, ROBUST_CHANNEL_CE2_ERROR: Copy Engine",
        b"NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu.",
        b"NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to "
        b"0x2 (Node Reboot Required)",
        b"NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.",
        b"6,1235,567890124,-;usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        b" SUBSYSTEM=pci",
    ]
    return [b"\n".join(lines) + b"\n", lines[0] + b"\n", b"\n".join(lines[1:4])]


def run_kmsg(data: bytes, tmp: Path) -> str:
    """Kernel log bytes: every line parses to a finding or to nothing, never raises; fed as a log file
    through the health signal, the node verdict is built, bounded and printable."""
    from gpu_triage.model.health import node_health_dict
    from gpu_triage.signals.health.kernel_log import MAX_TEXT_CHARS, parse_line
    from gpu_triage.signals.health.monitor import HealthConfig, HealthMonitor

    for line in data.split(b"\n"):
        parsed = parse_line(line)
        if parsed is not None:
            assert parsed.text.isprintable() and len(parsed.text) <= MAX_TEXT_CHARS + 20, parsed
    log = tmp / "kern.log"
    log.write_bytes(data)
    monitor = HealthMonitor(
        HealthConfig(kernel_log="off", kernel_log_file=log),
        [(0, "00000000:1B:00.0"), (3, "00000000:61:00.0")],
    )
    monitor.open()
    health = monitor.sample(1.0)
    doc = json.dumps(node_health_dict(health))
    assert len(health.findings) + sum(len(g.findings) for g in health.gpus) <= 4096
    assert len(doc) < 4 << 20
    monitor.close()
    # "error": nothing in it was read as an Xid or a lost GPU (ignored, cleanly); "result": findings
    return "result" if health.level.value != "healthy" or health.xid_totals else "error"


def scheduler_seeds() -> list[bytes]:
    """What the schedulers' side reads (issue 27 part B): a ``/status`` document's node verdict (read
    by ``slurm-health-check`` and the NPD plugin) and ``scontrol show job -o`` (the requeue check)."""
    status = {
        "node": "gpu-a17",
        "time": 1.0,
        "gpus": [{"gpu": 3, "state": "unknown", "power_w": None, "state_since": 0.0}],
        "jobs": [{"job": "slurm-42", "verdict": "telemetry_lost"}],
        "node_health": {
            "level": "unhealthy",
            "gpus": [
                {
                    "gpu": 3,
                    "level": "unhealthy",
                    "findings": [{"kind": "xid", "level": "unhealthy", "xid": 79}],
                },
                {
                    "gpu": 1,
                    "level": "degraded",
                    "findings": [{"kind": "throttle_thermal", "level": "degraded"}],
                },
            ],
            "findings": [{"kind": "fabric", "level": "unhealthy", "xid": None}],
        },
    }
    show_job = (
        b"JobId=42 JobName=ft UserId=nobody(65534) GroupId=nogroup(65534) Priority=1 Requeue=1 Restarts=2 "
        b"BatchFlag=1 Reboot=0 ExitCode=0:0 JobState=RUNNING Reason=None NodeList=wdnode"
    )
    return [json.dumps(status).encode(), json.dumps({"node": {"level": "healthy"}}).encode(), show_job]


def run_scheduler(data: bytes, tmp: Path) -> str:
    """A /status document through ``slurm-health-check``'s reasons (bounded, one line each), or
    ``scontrol show job`` text through the requeue check (a bool or None, never a raise)."""
    from gpu_triage.actions.requeue import requeue_allowed, restarts
    from gpu_triage.cli.slurm_health import drain_reason, health_reasons, node_reasons, parse_status

    text = data.decode("utf-8", "replace")
    allowed, count = requeue_allowed(text), restarts(text)
    assert allowed in (True, False, None) and (count is None or 0 <= count < 10**9)
    try:
        doc = parse_status(data)
    except ValueError:
        return "error" if allowed is None else "result"
    reasons = health_reasons(doc, now_s=2.0)
    node = node_reasons(doc)
    assert len(node) <= 16 and all(isinstance(r, str) and len(r) < 80 for r in node), node
    assert len(drain_reason(reasons)) <= 200
    return "result" if reasons else "error"


FORMATS: dict[str, tuple[Callable[[], list[bytes]], Callable[[bytes, Path], str]]] = {
    "csv": (csv_seeds, run_csv),
    "config": (config_seeds, run_config),
    "progress": (progress_seeds, run_progress),
    "prometheus": (prometheus_seeds, run_prometheus),
    "names": (name_seeds, run_names),
    "kmsg": (kmsg_seeds, run_kmsg),
    "scheduler": (scheduler_seeds, run_scheduler),
}


def _peak_rss_mb() -> float:
    """This process image's peak RSS: ``VmHWM`` (reset by exec, unlike ``ru_maxrss``, which would
    count the forked parent's pages)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _alarm(*_args: object) -> None:
    raise TimeoutError(f"input took more than {HANG_S} s")


def main(argv: list[str]) -> int:
    fmt, count, seed = argv[0], int(argv[1]), int(argv[2])
    seeds, run = FORMATS[fmt]
    rng = random.Random(seed)
    docs = seeds()
    outcomes: dict[str, int] = {}
    failures: list[dict[str, object]] = []
    hangs = 0
    slowest = 0.0
    signal.signal(signal.SIGALRM, _alarm)
    logging.getLogger().addHandler(logging.NullHandler())  # the readers log each bad file: not here
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{fmt}-") as tmp_name:
        tmp = Path(tmp_name)
        for i in range(count):
            data = mutate(rng.choice(docs), rng)
            started = time.monotonic()
            signal.alarm(HANG_S)
            try:
                outcome = run(data, tmp)
            except TimeoutError:
                hangs += 1
                outcome = "hang"
                failures.append({"input": i, "hang": True, "head": data[:200].decode("latin-1")})
            except BaseException as e:  # a traceback: the thing the fuzzer exists to find
                outcome = "traceback"
                failures.append(
                    {
                        "input": i,
                        "error": f"{type(e).__name__}: {str(e)[:300]}",
                        "traceback": traceback.format_exc()[-1500:],
                        "head": data[:200].decode("latin-1"),
                    }
                )
            finally:
                signal.alarm(0)
            slowest = max(slowest, time.monotonic() - started)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    peak_mb = _peak_rss_mb()
    print(
        json.dumps(
            {
                "format": fmt,
                "inputs": count,
                "seed": seed,
                "outcomes": outcomes,
                "tracebacks": outcomes.get("traceback", 0),
                "hangs": hangs,
                "slowest_s": round(slowest, 3),
                "peak_rss_mb": round(peak_mb, 1),
                "failures": failures[:20],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
