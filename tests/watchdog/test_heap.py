"""The daemon's start-up heap is frozen out of the garbage collector's reach (runner.settle_heap):
a full collection then walks only what the daemon made since, so it no longer stops every thread -
the health door's too - for the ~70,000 objects of the modules, app and tables (issue 30)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]

# The real `gpu-watchdog run` path in a fresh interpreter: once it listens, report how many objects
# the collector no longer walks, and stop as systemd would.
CHILD = r"""
import gc, os, signal, sys
from pathlib import Path
from gpu_triage.daemon.runner import RunOptions, run_daemon
tmp = Path(sys.argv[2])
seen = []
def started():
    seen.append(gc.get_freeze_count())
    os.kill(os.getpid(), signal.SIGTERM)
rc = run_daemon(RunOptions(source="sim", listen=f"127.0.0.1:{sys.argv[1]}", state_dir=tmp / "state",
                           progress_dir=tmp / "progress", period_s=0.1, on_started=started))
print(rc, seen[0])
"""


def test_run_freezes_the_start_up_heap(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(free_port()), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    rc, frozen = (int(v) for v in out.stdout.split()[-2:])
    assert rc == 0
    # the modules alone are tens of thousands of objects; a freeze that missed start-up would count 0
    assert frozen > 10_000, out.stdout
