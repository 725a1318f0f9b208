"""The evidence bundle: what a hang looked like before anyone touches it.

Captured once per suspected deadlock (before any kill), under
``<state_dir>/evidence/<UTC stamp>-<job>/`` (the job name reduced to ``[A-Za-z0-9._-]``):

========================  ====================================================================
``py-spy-rank<R>-pid<P>.txt``  ``py-spy dump --pid P`` of every rank (stderr and exit code kept: a
                          missing py-spy or a forbidden ptrace is recorded, never fatal)
``nvidia-smi-q.txt``      ``nvidia-smi -q`` where nvidia-smi exists
``nccl-ras.json|.txt``    NCCL RAS ``VERBOSE STATUS`` from localhost:28028 (JSON where NCCL >= 2.28.7)
``flight-recorder/``      PyTorch flight-recorder dumps requested through the job's dump pipe
``process-tree.json``     each rank's ancestors and descendants (psutil)
``progress/rank-N.json``  the last progress file of every rank
``status.json``           the job's verdict, evidence and the node's GPUs at capture time
``index.json``            every item: its file, status (``ok``/``absent``/``skipped``/``error``/
                          ``timeout``), result or error, and duration; ``complete`` once finished
``report.html``           the bundle as one self-contained page: ranks grouped by where they wait
                          (:mod:`gpu_triage.actions.evidence_report`), written after ``index.json``
========================  ====================================================================

Each outside command is limited to ``timeout_s``; py-spy runs for up to four ranks at a time.

**Flight recorder** (PyTorch ``ProcessGroupNCCL``): a rank started with ``TORCH_NCCL_TRACE_BUFFER_SIZE``
(or ``TORCH_FR_BUFFER_SIZE``) > 0 and ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<prefix>`` creates a FIFO
``<prefix><global rank>.pipe`` from its heartbeat-monitor thread (``TORCH_NCCL_ENABLE_MONITORING=1``,
the default); writing to it makes that rank dump its ring buffer to
``<TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default /tmp/nccl_trace_rank_)><rank>``.
The capture reads each rank's environment (``/proc/<pid>/environ``), opens the FIFO through
``/proc/<pid>/root`` (so a containerised rank's path resolves in its own mount namespace), writes only
to a FIFO (a path that is anything else - a regular file, a symlink - is refused), then waits a few
seconds for the dump file to change and copies it (at most 64 MiB) into the bundle.
"""

from __future__ import annotations

import calendar
import concurrent.futures
import contextlib
import errno
import functools
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpu_triage.actions import evidence_report
from gpu_triage.actions.kill_targets import CommandRunner, SubprocessRunner
from gpu_triage.signals import flight_recorder
from gpu_triage.signals.nccl_ras import client as ras

log = logging.getLogger(__name__)

EVIDENCE_DIR = "evidence"
MAX_COPY_BYTES = 64 * 1024 * 1024
MAX_PROGRESS_BYTES = 64 * 1024
PY_SPY_PARALLEL = 4
FLIGHT_RECORDER_WAIT_S = 5.0
DEFAULT_FR_DUMP_PREFIX = "/tmp/nccl_trace_rank_"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str, limit: int = 80) -> str:
    """``text`` reduced to file-name-safe characters (never empty, never ``.``/``..``)."""
    name = _SAFE.sub("_", text).strip("._")[:limit]
    return name or "job"


def utc_stamp(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def bundle_path(state_dir: Path, job: str, now: float) -> Path:
    """``<state_dir>/evidence/<UTC stamp>-<job>`` (a ``-N`` suffix if it exists already)."""
    root = Path(state_dir) / EVIDENCE_DIR
    base = f"{utc_stamp(now)}-{safe_name(job)}"
    path = root / base
    n = 1
    while path.exists():
        path = root / f"{base}-{n}"
        n += 1
    return path


def reserve_bundle(state_dir: Path, job: str, now: float) -> Path:
    """Create and return a new bundle directory (mode 0750); never one another capture holds."""
    while True:
        path = bundle_path(state_dir, job, now)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o750)
        except FileExistsError:
            continue
        return path


@dataclass(frozen=True, slots=True)
class RankTarget:
    rank: int | None
    pid: int
    gpu: int | None = None


@dataclass(frozen=True, slots=True)
class CaptureRequest:
    job: str
    node: str
    verdict: str
    path: Path
    ranks: tuple[RankTarget, ...]
    status: Mapping[str, Any] = field(default_factory=dict)
    """The job's status (and the node's GPUs) at capture time, JSON-able."""
    progress_dir: Path | None = None
    timeout_s: float = 30.0
    py_spy: str | None = None
    nvidia_smi: str | None = None
    ras_host: str = ras.DEFAULT_HOST
    ras_port: int = ras.DEFAULT_PORT
    flight_recorder_wait_s: float = FLIGHT_RECORDER_WAIT_S


@dataclass(slots=True)
class Item:
    name: str
    status: str
    duration_s: float
    file: str | None = None
    result: Any = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            **self.extra,
            "status": self.status,
            "ok": self.status == "ok",
        }
        if self.file is not None:
            d["file"] = self.file
        if self.result is not None:
            d["result"] = self.result
        if self.error is not None:
            d["error"] = self.error
        d["duration_s"] = round(self.duration_s, 3)
        return d


@dataclass(frozen=True, slots=True)
class Bundle:
    path: Path
    items: tuple[Item, ...]
    started: float
    duration_s: float

    @property
    def ok_items(self) -> int:
        return sum(1 for i in self.items if i.status == "ok")

    def index(self) -> dict[str, Any]:
        return {"path": str(self.path), "items": [i.to_dict() for i in self.items]}


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True, default=str).encode()


def _timed(name: str, fn: Callable[[], Item]) -> Item:
    started = time.monotonic()
    try:
        item = fn()
    except Exception as e:  # one item failing never stops the bundle
        item = Item(name, "error", 0.0, error=f"{type(e).__name__}: {e}")
    item.duration_s = time.monotonic() - started
    return item


class EvidenceCapture:
    """Captures one bundle. Blocking (seconds): call from a worker thread, never from the loop."""

    def __init__(
        self, runner: CommandRunner | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.runner = runner or SubprocessRunner()
        self.clock = clock

    def capture(self, req: CaptureRequest) -> Bundle:
        started = self.clock()
        t0 = time.monotonic()
        req.path.mkdir(parents=True, exist_ok=True, mode=0o750)
        header = {
            "job": req.job,
            "node": req.node,
            "verdict": req.verdict,
            "created": started,
            "created_utc": utc_stamp(started),
            "ranks": [{"rank": r.rank, "pid": r.pid, "gpu": r.gpu} for r in req.ranks],
        }
        _write_atomic(req.path / "index.json", _json_bytes({**header, "complete": False, "items": []}))
        items: list[Item] = []
        items.append(_timed("status", lambda: self._status(req)))
        items.append(_timed("process_tree", lambda: self._process_tree(req)))
        items.append(_timed("progress_files", lambda: self._progress(req)))
        items.extend(self._py_spy_all(req))
        items.append(_timed("nvidia_smi", lambda: self._nvidia_smi(req)))
        items.append(_timed("nccl_ras", lambda: self._ras(req)))
        items.extend(self._flight_recorder(req))
        duration = time.monotonic() - t0
        _write_atomic(
            req.path / "index.json",
            _json_bytes(
                {
                    **header,
                    "complete": True,
                    "duration_s": round(duration, 3),
                    "items": [i.to_dict() for i in items],
                }
            ),
        )
        try:  # the page is a reading of what is on disk; it never fails the capture
            evidence_report.write_report(req.path)
        except Exception as e:
            log.warning("evidence report for %s not written: %s", req.path, e)
        return Bundle(req.path, tuple(items), started, duration)

    # ------------------------------------------------------------------------------------ items

    def _status(self, req: CaptureRequest) -> Item:
        _write_atomic(req.path / "status.json", _json_bytes(dict(req.status)))
        return Item("status", "ok", 0.0, file="status.json")

    def _py_spy_all(self, req: CaptureRequest) -> list[Item]:
        if not req.ranks:
            return [Item("py_spy", "skipped", 0.0, error="no rank process known")]
        if req.py_spy is None:
            return [
                Item(
                    "py_spy",
                    "skipped",
                    0.0,
                    error="py-spy not found (install it: pip install py-spy)",
                    extra={"rank": r.rank, "pid": r.pid},
                )
                for r in req.ranks
            ]
        with concurrent.futures.ThreadPoolExecutor(PY_SPY_PARALLEL, thread_name_prefix="py-spy") as pool:
            futures = [
                pool.submit(_timed, "py_spy", functools.partial(self._py_spy, req, r)) for r in req.ranks
            ]
            return [f.result() for f in futures]

    def _py_spy(self, req: CaptureRequest, r: RankTarget) -> Item:
        assert req.py_spy is not None
        name = f"py-spy-rank{r.rank if r.rank is not None else 'x'}-pid{r.pid}.txt"
        result = self.runner.run([req.py_spy, "dump", "--pid", str(r.pid)], timeout_s=req.timeout_s)
        text = (
            f"$ {' '.join(result.argv)}\n# exit code: {result.returncode}"
            + (f" ({result.error})" if result.error else "")
            + f"\n\n{result.stdout}"
            + (f"\n--- stderr ---\n{result.stderr}" if result.stderr.strip() else "")
        )
        _write_atomic(req.path / name, text.encode())
        extra = {"rank": r.rank, "pid": r.pid}
        if result.ok:
            return Item(
                "py_spy",
                "ok",
                0.0,
                file=name,
                result={"threads": result.stdout.count("\nThread ")},
                extra=extra,
            )
        why = result.error or _first_line(result.stderr) or f"exit code {result.returncode}"
        if _ptrace_denied(result.stderr):
            why = (
                f"ptrace not permitted ({why}); needs CAP_SYS_PTRACE or kernel.yama.ptrace_scope <= 1 as root"
            )
        status = "timeout" if result.error and result.error.startswith("timeout") else "error"
        return Item("py_spy", status, 0.0, file=name, error=why, extra=extra)

    def _nvidia_smi(self, req: CaptureRequest) -> Item:
        if req.nvidia_smi is None:
            return Item("nvidia_smi", "skipped", 0.0, error="nvidia-smi not found")
        result = self.runner.run([req.nvidia_smi, "-q"], timeout_s=req.timeout_s)
        _write_atomic(req.path / "nvidia-smi-q.txt", (result.stdout + result.stderr).encode())
        if result.ok:
            return Item("nvidia_smi", "ok", 0.0, file="nvidia-smi-q.txt")
        status = "timeout" if result.error and result.error.startswith("timeout") else "error"
        return Item(
            "nvidia_smi",
            status,
            0.0,
            file="nvidia-smi-q.txt",
            error=result.error or _first_line(result.stderr) or f"exit code {result.returncode}",
        )

    def _ras(self, req: CaptureRequest) -> Item:
        report = ras.query_status(
            req.ras_host, req.ras_port, verbose=True, json_format=True, timeout_s=req.timeout_s
        )
        if not report.ok:
            return Item("nccl_ras", report.status, 0.0, error=report.error, result=report.to_dict())
        name = "nccl-ras.json" if report.format == "json" else "nccl-ras.txt"
        _write_atomic(req.path / name, report.text.encode())
        return Item("nccl_ras", "ok", 0.0, file=name, result=report.to_dict())

    def _process_tree(self, req: CaptureRequest) -> Item:
        tree = []
        for r in req.ranks:
            try:
                proc = psutil.Process(r.pid)
                entry = {"rank": r.rank, **_describe(proc)}
                entry["ancestors"] = [_describe(p, brief=True) for p in proc.parents()]
                entry["descendants"] = [_describe(p) for p in proc.children(recursive=True)]
            except psutil.Error as e:
                entry = {"rank": r.rank, "pid": r.pid, "error": f"{type(e).__name__}: {e}"}
            tree.append(entry)
        _write_atomic(req.path / "process-tree.json", _json_bytes(tree))
        gone = [t["pid"] for t in tree if "error" in t]
        return Item(
            "process_tree",
            "ok",
            0.0,
            file="process-tree.json",
            result={"ranks": len(tree), "unreadable": gone},
        )

    def _progress(self, req: CaptureRequest) -> Item:
        if req.progress_dir is None:
            return Item("progress_files", "skipped", 0.0, error="no progress directory")
        root = Path(req.progress_dir)
        job_dir = root / req.job
        if "/" in req.job or req.job in ("", ".", "..") or not job_dir.is_dir() or job_dir.is_symlink():
            return Item("progress_files", "absent", 0.0, error=f"no progress files for job {req.job!r}")
        out_dir = req.path / "progress"
        out_dir.mkdir(exist_ok=True)
        copied = []
        for entry in sorted(os.scandir(job_dir), key=lambda e: e.name):
            if not (entry.name.startswith("rank-") and entry.name.endswith(".json")):
                continue
            data = _read_regular(Path(entry.path), MAX_PROGRESS_BYTES)
            if data is None:
                continue
            _write_atomic(out_dir / safe_name(entry.name), data)
            copied.append(entry.name)
        return Item(
            "progress_files", "ok" if copied else "absent", 0.0, file="progress/", result={"files": copied}
        )

    def _flight_recorder(self, req: CaptureRequest) -> list[Item]:
        items: list[Item] = []
        requested: list[tuple[Item, int, Path, float | None]] = []
        for r in req.ranks:
            started = time.monotonic()
            item, poke = self._poke_pipe(r)
            item.duration_s = time.monotonic() - started
            items.append(item)
            if poke is not None:
                requested.append((item, *poke))
        if not requested:
            return items
        deadline = time.monotonic() + min(req.flight_recorder_wait_s, req.timeout_s)
        out_dir = req.path / "flight-recorder"
        out_dir.mkdir(exist_ok=True)
        parsed: dict[int, list[flight_recorder.Entry]] = {}
        refused: dict[str, str] = {}
        for item, rank, dump, before in requested:
            started = time.monotonic()
            while time.monotonic() < deadline and _mtime(dump) == before:
                time.sleep(0.05)
            after = _mtime(dump)
            if after is None or after == before:
                item.status = "timeout"
                item.error = f"dump requested but {dump} did not change within the wait"
            else:
                time.sleep(0.2)  # let the writer finish its file
                data = _read_regular(dump, MAX_COPY_BYTES)
                if data is None:
                    item.status = "error"
                    item.error = f"{dump} is not a readable regular file"
                else:
                    name = f"rank{rank}-{safe_name(dump.name)}"
                    _write_atomic(out_dir / name, data)
                    item.file = f"flight-recorder/{name}"
                    item.result = {**(item.result or {}), "bytes": len(data), "dump": str(dump)}
                    try:
                        parsed[rank] = flight_recorder.entries(flight_recorder.load_dump(data))
                    except flight_recorder.FlightRecorderError as e:
                        refused[str(rank)] = str(e)
            item.duration_s += time.monotonic() - started
        if parsed or refused:
            world = [r.rank for r in req.ranks if r.rank is not None]
            analysis = {**flight_recorder.compare(parsed, world), "refused": refused}
            _write_atomic(out_dir / "analysis.json", json.dumps(analysis, indent=2).encode())
            items.append(
                Item(
                    "flight_recorder_analysis",
                    "ok",
                    0.0,
                    file="flight-recorder/analysis.json",
                    result=analysis,
                )
            )
        return items

    def _poke_pipe(self, r: RankTarget) -> tuple[Item, tuple[int, Path, float | None] | None]:
        extra = {"rank": r.rank, "pid": r.pid}
        try:
            env = psutil.Process(r.pid).environ()
        except (psutil.Error, OSError) as e:
            return Item(
                "flight_recorder", "skipped", 0.0, error=f"environment unreadable: {e}", extra=extra
            ), None
        stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
        size = _int(env.get("TORCH_FR_BUFFER_SIZE")) or _int(env.get("TORCH_NCCL_TRACE_BUFFER_SIZE"))
        if not stem or size <= 0:
            why = (
                "flight recorder not enabled (needs TORCH_NCCL_TRACE_BUFFER_SIZE > 0 and "
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE)"
            )
            return Item("flight_recorder", "skipped", 0.0, error=why, extra=extra), None
        rank = _int(env.get("RANK"), default=r.rank if r.rank is not None else -1)
        if rank < 0:
            return Item("flight_recorder", "skipped", 0.0, error="global rank unknown", extra=extra), None
        pipe = _in_process_view(r.pid, Path(f"{stem}{rank}.pipe"))
        prefix = (
            env.get("TORCH_FR_DUMP_TEMP_FILE")
            or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
            or DEFAULT_FR_DUMP_PREFIX
        )
        dump = _in_process_view(r.pid, Path(f"{prefix}{rank}"))
        try:
            st = os.lstat(pipe)
        except OSError as e:
            return Item(
                "flight_recorder", "absent", 0.0, error=f"no dump pipe {pipe}: {e.strerror}", extra=extra
            ), None
        if not stat.S_ISFIFO(st.st_mode):
            return Item(
                "flight_recorder", "error", 0.0, error=f"{pipe} is not a FIFO: refused", extra=extra
            ), None
        before = _mtime(dump)
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            why = str(e.strerror)
            if e.errno == errno.ENXIO:
                why = "nobody reads it (is the rank's monitoring thread running?)"
            elif e.errno == errno.EACCES:
                why += " (not writable by the watchdog's user: launch the job with umask 0000)"
            return Item(
                "flight_recorder", "error", 0.0, error=f"cannot open {pipe}: {why}", extra=extra
            ), None
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return Item(
                    "flight_recorder", "error", 0.0, error=f"{pipe} is not a FIFO: refused", extra=extra
                ), None
            os.write(fd, b"1\n")
        except OSError as e:
            return Item(
                "flight_recorder", "error", 0.0, error=f"write to {pipe}: {e.strerror}", extra=extra
            ), None
        finally:
            os.close(fd)
        return Item("flight_recorder", "ok", 0.0, result={"pipe": str(pipe)}, extra=extra), (
            rank,
            dump,
            before,
        )


def _in_process_view(pid: int, path: Path) -> Path:
    """``path`` as process ``pid`` sees it: through ``/proc/<pid>/root`` (absolute) or
    ``/proc/<pid>/cwd`` (relative), when those are reachable; else ``path`` itself."""
    base = Path(f"/proc/{pid}/root") if path.is_absolute() else Path(f"/proc/{pid}/cwd")
    try:
        os.stat(base)
    except OSError:
        return path
    return base / str(path).lstrip("/")


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return None


def _read_regular(path: Path, limit: int) -> bytes | None:
    """The file's bytes if it is a regular file (never following a final symlink), at most ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _ptrace_denied(stderr: str) -> bool:
    text = stderr.lower()
    return "permission denied" in text or "operation not permitted" in text or "ptrace" in text


def _describe(proc: psutil.Process, *, brief: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": proc.pid}
    try:
        with proc.oneshot():
            out["ppid"] = proc.ppid()
            out["name"] = proc.name()
            out["cmdline"] = " ".join(proc.cmdline())[:2000]
            if brief:
                return out
            with contextlib.suppress(OSError):
                out["pgid"] = os.getpgid(proc.pid)
            out["status"] = proc.status()
            out["username"] = proc.username()
            out["create_time"] = proc.create_time()
            out["num_threads"] = proc.num_threads()
            times = proc.cpu_times()
            out["cpu_time_s"] = round(times.user + times.system, 3)
            out["rss_bytes"] = proc.memory_info().rss
    except psutil.Error as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def find_nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def list_bundles(state_dir: Path) -> list[Path]:
    root = Path(state_dir) / EVIDENCE_DIR
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def bundle_time(path: Path) -> float | None:
    """When a bundle was made: the UTC stamp its name starts with, else its mtime (None: gone)."""
    try:
        return calendar.timegm(time.strptime(path.name[:16], "%Y%m%dT%H%M%SZ"))
    except ValueError:
        pass
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def prune_bundles(
    state_dir: Path, keep: int, *, max_age_s: float | None = None, now: float | None = None
) -> list[Path]:
    """Delete the oldest bundles beyond the newest ``keep`` (names sort by their UTC stamp), and, with
    ``max_age_s``, every bundle older than that at ``now`` (``evidence.retention_days``)."""
    bundles = list_bundles(state_dir)
    doomed = bundles[: max(0, len(bundles) - keep)]
    if max_age_s is not None:
        now = time.time() if now is None else now
        for path in bundles[len(doomed) :]:
            made = bundle_time(path)
            if made is not None and now - made > max_age_s:
                doomed.append(path)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


__all__ = [
    "Bundle",
    "CaptureRequest",
    "EvidenceCapture",
    "Item",
    "RankTarget",
    "bundle_path",
    "bundle_time",
    "find_nvidia_smi",
    "prune_bundles",
    "reserve_bundle",
    "safe_name",
]
