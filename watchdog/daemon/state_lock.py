"""One daemon per state directory: an exclusive POSIX lock on ``<state_dir>/gpu-watchdog.lock``.

Two daemons on one state directory would share the event store, the kill budget (two budgets of N
kills an hour, each believing it is alone) and the alert outbox (every page twice). The lock is held
for the daemon's life; the kernel drops it when the process ends, however it ends, so a stale file
never blocks a restart. The file holds the holder's pid, so the second daemon's error names it.

A POSIX record lock (``lockf``), not ``flock``: an ``flock`` belongs to the open file description, so
a child forked while it is held (a capture, a kill hook, a library's helper) would keep holding it
after the daemon released it or exited; a POSIX lock belongs to the process and is never inherited.
Its one pitfall: closing *any* descriptor of the file in the process drops the lock, so nothing but
this module opens the lock file.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = "gpu-watchdog.lock"
#: A lock file larger than this is not ours (a pid is a few bytes); it is read no further.
_MAX_LOCK_BYTES = 64


class StateDirInUse(Exception):
    """Another live process holds the state directory's lock."""

    def __init__(self, path: Path, holder_pid: int | None) -> None:
        who = f"pid {holder_pid}" if holder_pid is not None else "a process whose pid the file does not say"
        super().__init__(
            f"daemon.state_dir: {path.parent} is in use by another gpu-watchdog ({who}; lock {path}). "
            "Stop it, or give this one its own --state-dir"
        )
        self.path = path
        self.holder_pid = holder_pid


class StateLock:
    """The held lock; :meth:`release` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the description drops the flock
            self._fd = None


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, _MAX_LOCK_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def acquire(state_dir: Path, pid: int | None = None) -> StateLock | None:
    """Take the lock of ``state_dir`` (which must exist) for ``pid`` (default: this process).

    Raises :class:`StateDirInUse` when another process holds it, and OSError when the lock file cannot
    be opened for another reason than a full disk. On a full disk (no room for the file) returns None:
    the daemon runs on without the lock, as its store runs on memory.
    """
    path = Path(state_dir) / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return None
        raise
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            os.close(fd)
            raise
        holder = _holder(fd)
        os.close(fd)
        raise StateDirInUse(path, holder) from None
    try:  # the pid is for the next one's message; no room to write it costs only that
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid() if pid is None else pid}\n".encode(), 0)
    except OSError:
        pass
    return StateLock(path, fd)
