"""Wait for a spawned process to be the program it was started as.

``subprocess.Popen`` returns once the child's close-on-exec descriptors close. The kernel closes them
early in ``execve`` - before it lays out the new image's arguments and environment - so for a short
while after ``Popen`` returns, ``/proc/PID/cmdline`` and ``/proc/PID/environ`` read empty. On a loaded
machine (CI) that window is wide enough for an inspector to see a process with no rank environment and
refuse it. A test that inspects a process at once waits for its image first; the daemon needs no such
wait (it judges every claim again at the next discovery).
"""

from __future__ import annotations

import subprocess
import time


def _read(pid: int, name: str) -> bytes | None:
    """The file's bytes (empty while the image is not laid out); None where we may not read it."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except PermissionError:
        return None
    except OSError:
        return b""


def wait_for_exec(proc: subprocess.Popen, marker: bytes = b"", timeout_s: float = 10.0) -> subprocess.Popen:
    """Return ``proc`` once its command line and environment are laid out (the command line holding
    ``marker``: a wrapper such as ``setsid`` execs a second time). A process started with an empty
    environment never shows one: do not wait for those. Raises AssertionError after ``timeout_s``,
    or if it exited first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cmdline = _read(proc.pid, "cmdline")
        environ = _read(proc.pid, "environ")
        if cmdline and marker in cmdline and environ != b"":
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"pid {proc.pid} exited ({proc.returncode}) before it ran {marker!r}")
        time.sleep(0.005)
    raise AssertionError(f"pid {proc.pid} did not exec {marker!r} within {timeout_s} s")
