"""The state directory's lock (daemon/state_lock.py): another process is refused, naming the holder;
a child forked while the lock is held does not keep it after the daemon lets go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_triage.daemon.state_lock import LOCK_NAME, StateDirInUse, acquire

PROBE = (
    "import sys\n"
    "from pathlib import Path\n"
    "from gpu_triage.daemon.state_lock import StateDirInUse, acquire\n"
    "try:\n"
    "    acquire(Path(sys.argv[1]))\n"
    "except StateDirInUse as e:\n"
    "    print('in use', e.holder_pid)\n"
    "else:\n"
    "    print('acquired')\n"
)


def probe(state: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(state)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_another_process_is_refused_naming_the_holder_until_released(tmp_path: Path) -> None:
    lock = acquire(tmp_path)
    assert lock is not None
    # (not read here while held: closing any descriptor of the file drops a POSIX lock - the module's note)
    assert probe(tmp_path) == f"in use {os.getpid()}"
    lock.release()
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    assert probe(tmp_path) == "acquired"  # the prober's lock died with it
    with pytest.raises(StateDirInUse, match="in use by another gpu-watchdog"):
        raise StateDirInUse(tmp_path / LOCK_NAME, 42)


def test_a_child_forked_while_it_is_held_does_not_keep_it(tmp_path: Path) -> None:
    lock = acquire(tmp_path)
    assert lock is not None
    child = os.fork()
    if child == 0:  # a helper forked by the daemon, still running after the daemon let go
        time.sleep(30)
        os._exit(0)
    try:
        lock.release()
        assert probe(tmp_path) == "acquired"
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
