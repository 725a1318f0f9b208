"""The evidence bundle, captured from real processes: py-spy, NCCL RAS (loopback server), the
flight-recorder dump pipe (a real rank process implementing PyTorch's documented mechanism), the
process tree and the progress files; and the degraded paths (no py-spy, a dead pid, nothing listening).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpu_triage.actions.evidence_bundle import (
    CaptureRequest,
    EvidenceCapture,
    RankTarget,
    bundle_path,
    prune_bundles,
    safe_name,
)
from gpu_triage.actions.kill_targets import CommandResult, SubprocessRunner
from gpu_triage.signals.stacks.sampler import find_py_spy
from tests.conftest import require_binary
from tests.watchdog.snapshots import T0
from tests.watchdog.test_delivery import free_port
from tests.watchdog.test_ras import RasServer

RANK_SCRIPT = r"""
import json, os, sys, time

def waiting_in_allreduce_for_rank(rank):
    stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    fd = None
    if stem and int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")) > 0:
        # what ProcessGroupNCCL's DumpPipe does: mkfifo <stem><rank>.pipe, open it O_RDONLY|O_NONBLOCK,
        # and poll it from the monitoring thread; bytes read = dump the flight recorder
        path = f"{stem}{rank}.pipe"
        if os.path.exists(path):
            os.unlink(path)
        os.mkfifo(path, 0o666)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    print("ready", flush=True)
    while True:
        if fd is not None:
            try:
                data = os.read(fd, 128)
            except BlockingIOError:
                data = b""
            if data:
                prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/tmp/nccl_trace_rank_")
                with open(f"{prefix}{rank}", "w") as f:
                    json.dump({"version": "2.4", "entries": [{"profiling_name": "nccl:all_reduce",
                                                              "collective_seq_id": 1201}]}, f)
        time.sleep(0.05)

waiting_in_allreduce_for_rank(int(os.environ.get("RANK", "0")))
"""


class Ranks:
    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[str]] = []

    def start(self, rank: int, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "RANK": str(rank), **(env or {})},
            start_new_session=True,
        )
        self.popens.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return p

    def stop(self) -> None:
        for p in self.popens:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait(5)


@pytest.fixture
def ranks() -> Iterator[Ranks]:
    r = Ranks()
    yield r
    r.stop()


def py_spy_or_skip() -> str:
    path = find_py_spy("auto")
    return path if path is not None else require_binary("py-spy", "py-spy dumps of rank processes")


def skip_if_ptrace_forbidden(py_spy: str, pid: int) -> None:
    probe = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 and any(
        s in probe.stderr.lower() for s in ("permission denied", "operation not permitted", "ptrace")
    ):
        pytest.skip(
            f"ptrace is forbidden on this machine, py-spy cannot attach: {probe.stderr.strip()[:200]}"
        )


def write_progress(directory: Path, job: str, rank: int, pid: int) -> None:
    d = directory / job
    d.mkdir(parents=True, exist_ok=True)
    record = {
        "job": job,
        "rank": rank,
        "local_rank": rank,
        "world_size": 2,
        "pid": pid,
        "host": "node-a",
        "step": 1200,
        "epoch": 1,
        "tokens": 1,
        "phase": "train",
        "lease_until": None,
        "time": T0,
    }
    (d / f"rank-{rank}.json").write_text(json.dumps(record))


def _items(index: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for item in index["items"]:
        out.setdefault(item["name"], []).append(item)
    return out


def test_full_bundle_from_real_ranks(tmp_path: Path, ranks: Ranks) -> None:
    py_spy = py_spy_or_skip()
    fr = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "fr_pipe_"),
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "fr_dump_"),
    }
    rank0 = ranks.start(0, fr)
    rank1 = ranks.start(1)  # no flight recorder
    skip_if_ptrace_forbidden(py_spy, rank0.pid)
    progress = tmp_path / "progress"
    write_progress(progress, "qwen3-32b-ft", 0, rank0.pid)
    write_progress(progress, "qwen3-32b-ft", 1, rank1.pid)
    ras_server = RasServer()
    try:
        path = bundle_path(tmp_path / "state", "qwen3-32b-ft", T0)
        request = CaptureRequest(
            job="qwen3-32b-ft",
            node="node-a",
            verdict="deadlock_suspected",
            path=path,
            ranks=(RankTarget(0, rank0.pid, 0), RankTarget(1, rank1.pid, 1)),
            status={"job": {"job": "qwen3-32b-ft", "verdict": "deadlock_suspected"}},
            progress_dir=progress,
            timeout_s=20.0,
            py_spy=py_spy,
            nvidia_smi=None,
            ras_host="127.0.0.1",
            ras_port=ras_server.port,
        )
        bundle = EvidenceCapture().capture(request)
    finally:
        ras_server.stop()
    assert path == tmp_path / "state" / "evidence" / "20251202T120000Z-qwen3-32b-ft"
    index = json.loads((path / "index.json").read_text())
    assert index["complete"] is True and index["job"] == "qwen3-32b-ft" and index["duration_s"] >= 0
    items = _items(index)
    assert all("duration_s" in i and "status" in i for i in index["items"])
    # py-spy: one dump per rank, showing where each rank waits
    assert [i["status"] for i in items["py_spy"]] == ["ok", "ok"]
    for item in items["py_spy"]:
        text = (path / item["file"]).read_text()
        assert "waiting_in_allreduce_for_rank" in text, text
    # NCCL RAS: the JSON form
    assert items["nccl_ras"][0]["status"] == "ok" and items["nccl_ras"][0]["file"] == "nccl-ras.json"
    assert json.loads((path / "nccl-ras.json").read_text())["communicators_count"] == 1
    assert items["nccl_ras"][0]["result"]["summary"]["count_mismatches"][0]["ranks_behind"] == [3]
    # flight recorder: requested through rank 0's pipe and copied; rank 1 has none enabled
    fr_items = {i["rank"]: i for i in items["flight_recorder"]}
    assert fr_items[0]["status"] == "ok", fr_items[0]
    dump = json.loads((path / fr_items[0]["file"]).read_text())
    assert dump["entries"][0]["collective_seq_id"] == 1201
    assert fr_items[1]["status"] == "skipped" and "not enabled" in fr_items[1]["error"]
    # ... parsed: rank 1 left no dump
    (analysis,) = items["flight_recorder_analysis"]
    assert analysis["result"]["ranks_dumped"] == [0] and analysis["result"]["ranks_without_dump"] == [1]
    assert json.loads((path / "flight-recorder" / "analysis.json").read_text())["ranks_dumped"] == [0]
    # nvidia-smi absent here: recorded, not fatal
    assert items["nvidia_smi"][0]["status"] == "skipped"
    # process tree, progress files, status
    tree = json.loads((path / "process-tree.json").read_text())
    assert [t["pid"] for t in tree] == [rank0.pid, rank1.pid]
    assert tree[0]["ancestors"][0]["pid"] == os.getpid()
    assert sorted(os.listdir(path / "progress")) == ["rank-0.json", "rank-1.json"]
    assert json.loads((path / "status.json").read_text())["job"]["verdict"] == "deadlock_suspected"
    assert bundle.ok_items >= 7


def test_degraded_capture_records_every_failure_and_completes(tmp_path: Path, ranks: Ranks) -> None:
    rank0 = ranks.start(0)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = bundle_path(tmp_path, "job", T0)
    request = CaptureRequest(
        job="job",
        node="n",
        verdict="deadlock_suspected",
        path=path,
        ranks=(RankTarget(0, rank0.pid), RankTarget(1, dead.pid)),
        progress_dir=tmp_path / "no-progress-here",
        timeout_s=5.0,
        py_spy="/nonexistent/bin/py-spy",
        nvidia_smi=None,
        ras_host="127.0.0.1",
        ras_port=free_port(),
    )
    started = time.monotonic()
    EvidenceCapture().capture(request)
    assert time.monotonic() - started < 5.0
    items = _items(json.loads((path / "index.json").read_text()))
    assert [i["status"] for i in items["py_spy"]] == ["error", "error"]
    assert "not found: /nonexistent/bin/py-spy" in items["py_spy"][0]["error"]
    assert "not found" in (path / items["py_spy"][0]["file"]).read_text()
    assert items["nccl_ras"][0]["status"] == "absent" and "refused" in items["nccl_ras"][0]["error"]
    assert items["progress_files"][0]["status"] == "absent"
    assert json.loads((path / "process-tree.json").read_text())[1]["error"].startswith("NoSuchProcess")
    fr = {i["rank"]: i for i in items["flight_recorder"]}
    assert fr[1]["status"] == "skipped" and "unreadable" in fr[1]["error"]
    # without py-spy at all
    request2 = CaptureRequest(
        job="job",
        node="n",
        verdict="x",
        path=tmp_path / "b2",
        ranks=(RankTarget(0, rank0.pid),),
        py_spy=None,
        ras_port=free_port(),
        ras_host="127.0.0.1",
    )
    EvidenceCapture().capture(request2)
    items2 = _items(json.loads((tmp_path / "b2" / "index.json").read_text()))
    assert items2["py_spy"][0]["status"] == "skipped" and "py-spy not found" in items2["py_spy"][0]["error"]


class UnprivilegedRunner(SubprocessRunner):
    """Runs every command as ``nobody`` (setpriv): py-spy then really lacks the right to ptrace a
    root-owned rank - the machine forbidding ptrace, for real."""

    def run(self, argv: Sequence[str], *, timeout_s: float) -> CommandResult:
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        return super().run([*drop, *argv], timeout_s=timeout_s)


def test_forbidden_ptrace_degrades_gracefully(tmp_path: Path, ranks: Ranks) -> None:
    py_spy = py_spy_or_skip()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run py-spy without the right to ptrace")
    rank0 = ranks.start(0)
    request = CaptureRequest(
        job="j",
        node="n",
        verdict="deadlock_suspected",
        path=tmp_path / "b",
        ranks=(RankTarget(0, rank0.pid),),
        py_spy=py_spy,
        ras_host="127.0.0.1",
        ras_port=free_port(),
        timeout_s=10.0,
    )
    EvidenceCapture(UnprivilegedRunner()).capture(request)
    index = json.loads((tmp_path / "b" / "index.json").read_text())
    (item,) = _items(index)["py_spy"]
    assert item["status"] == "error"
    assert item["error"].startswith("ptrace not permitted") and "CAP_SYS_PTRACE" in item["error"]
    assert "Permission Denied" in (tmp_path / "b" / item["file"]).read_text()
    assert index["complete"] is True
    assert _items(index)["process_tree"][0]["status"] == "ok"  # the rest of the bundle is still there


def test_py_spy_on_a_dead_pid_is_recorded(tmp_path: Path) -> None:
    py_spy = py_spy_or_skip()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    request = CaptureRequest(
        job="j",
        node="n",
        verdict="x",
        path=tmp_path / "b",
        ranks=(RankTarget(0, dead.pid),),
        py_spy=py_spy,
        ras_host="127.0.0.1",
        ras_port=free_port(),
        timeout_s=10.0,
    )
    bundle = EvidenceCapture().capture(request)
    (item,) = [i for i in bundle.items if i.name == "py_spy"]
    assert item.status == "error" and item.error


def test_flight_recorder_pipe_that_is_a_regular_file_is_refused(tmp_path: Path, ranks: Ranks) -> None:
    stem = tmp_path / "elsewhere_"
    rank = ranks.start(
        0, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "10", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(stem)}
    )
    # the rank made elsewhere_0.pipe a FIFO; someone swaps in a regular file: it must not be written to
    fifo = tmp_path / "elsewhere_0.pipe"
    fifo.unlink()
    fifo.write_text("precious\n")
    request = CaptureRequest(
        job="j",
        node="n",
        verdict="x",
        path=tmp_path / "b",
        ranks=(RankTarget(0, rank.pid),),
        py_spy=None,
        ras_host="127.0.0.1",
        ras_port=free_port(),
        timeout_s=2.0,
    )
    bundle = EvidenceCapture().capture(request)
    (fr,) = [i for i in bundle.items if i.name == "flight_recorder"]
    assert fr.status == "error" and "not a FIFO: refused" in (fr.error or "")
    assert fifo.read_text() == "precious\n"


def test_nvidia_smi_where_present(tmp_path: Path) -> None:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        pytest.skip("no NVIDIA driver on this machine (nvidia-smi absent): capture records it as skipped")
    request = CaptureRequest(
        job="j",
        node="n",
        verdict="x",
        path=tmp_path / "b",
        ranks=(),
        py_spy=None,
        nvidia_smi=nvidia_smi,
        ras_host="127.0.0.1",
        ras_port=free_port(),
    )
    bundle = EvidenceCapture().capture(request)
    (item,) = [i for i in bundle.items if i.name == "nvidia_smi"]
    assert item.status == "ok", item.error
    assert "Driver Version" in (tmp_path / "b" / "nvidia-smi-q.txt").read_text()


def test_bundle_names_are_safe_and_pruned(tmp_path: Path) -> None:
    assert safe_name("../../etc/passwd") == "etc_passwd"
    assert safe_name("..") == "job"
    path = bundle_path(tmp_path, "../../escape me", T0)
    assert path.parent == tmp_path / "evidence" and path.name == "20251202T120000Z-escape_me"
    path.mkdir(parents=True)
    assert bundle_path(tmp_path, "../../escape me", T0).name == "20251202T120000Z-escape_me-1"
    for i in range(5):
        bundle_path(tmp_path, f"j{i}", T0 + i).mkdir()
    removed = prune_bundles(tmp_path, keep=3)
    assert len(removed) == 3
    assert sorted(p.name for p in (tmp_path / "evidence").iterdir()) == [
        "20251202T120002Z-j2",
        "20251202T120003Z-j3",
        "20251202T120004Z-j4",
    ]


def test_bundles_older_than_the_retention_are_pruned(tmp_path: Path) -> None:
    day = 86400.0
    for age_days in (40, 31, 29, 1):
        bundle_path(tmp_path, f"age{age_days}", T0 - age_days * day).mkdir(parents=True)
    odd = tmp_path / "evidence" / "not-a-stamp"
    odd.mkdir()
    os.utime(odd, (T0 - 60 * day, T0 - 60 * day))  # no stamp in the name: its mtime counts
    removed = prune_bundles(tmp_path, keep=50, max_age_s=30 * day, now=T0)
    assert sorted(p.name.split("-", 1)[1] for p in removed if p.name[0].isdigit()) == ["age31", "age40"]
    assert odd in removed
    assert sorted(p.name.split("-", 1)[1] for p in (tmp_path / "evidence").iterdir()) == ["age1", "age29"]
    # the count limit and the age limit together
    assert [p.name.split("-", 1)[1] for p in prune_bundles(tmp_path, keep=1, max_age_s=30 * day, now=T0)] == [
        "age29"
    ]
