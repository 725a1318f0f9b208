"""A rank's kernel counters read straight from ``/proc``: one read of ``/proc/<pid>/stat`` and one of
``/proc/<pid>/io`` per rank per process period, no psutil object, no per-call bookkeeping.

The inspector (:mod:`gpu_triage.signals.processes`) measures every rank each process period; through
psutil that was a ``oneshot`` context, three method calls and an ``os.getpgid`` per rank, ~40 % of the
daemon's per-second work at 16 ranks (issue 30). The values are psutil's, computed the same way:

* ``status``: the state letter of ``stat`` mapped as psutil maps it (``D`` is ``disk-sleep``);
* ``cpu_time_s``: ``utime / CLK_TCK + stime / CLK_TCK`` (psutil's ``user + system``);
* ``pgid``: ``stat``'s ``pgrp`` (what ``os.getpgid`` answers);
* ``start_ticks``: the start time in clock ticks since boot - a pid that names a process started at
  another time is another process (the pid was reused): :class:`Gone`, never that process's counters;
* io: ``read_bytes``, ``write_bytes``, ``rchar``, ``wchar`` of ``io`` (psutil's ``read_bytes``,
  ``write_bytes``, ``read_chars``, ``write_chars``); None where it cannot be read (another user's
  process without ``CAP_SYS_PTRACE``), as psutil's ``AccessDenied``.

A vanished process raises :class:`Gone` (psutil's ``NoSuchProcess``), an unreadable ``stat``
:class:`Denied`. Where there is no ``/proc`` (:data:`AVAILABLE` false) the inspector keeps psutil.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

import psutil

PROC = "/proc"
AVAILABLE = os.path.exists(f"{PROC}/self/stat") and os.path.exists(f"{PROC}/self/io")
"""Whether this kernel has the files (Linux with task I/O accounting); else psutil measures."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAX_STAT_BYTES = 4096
"""``stat`` is ~300 bytes (its command name at most 64); more is not read."""

STATUSES = {
    "R": psutil.STATUS_RUNNING,
    "S": psutil.STATUS_SLEEPING,
    "D": psutil.STATUS_DISK_SLEEP,
    "T": psutil.STATUS_STOPPED,
    "t": psutil.STATUS_TRACING_STOP,
    "Z": psutil.STATUS_ZOMBIE,
    "X": psutil.STATUS_DEAD,
    "x": psutil.STATUS_DEAD,
    "K": "wake-kill",  # psutil._common.STATUS_WAKE_KILL (not exported)
    "W": psutil.STATUS_WAKING,
    "I": psutil.STATUS_IDLE,
    "P": psutil.STATUS_PARKED,
}
"""The kernel's state letters as psutil names them."""

_GONE = (errno.ENOENT, errno.ESRCH)


class Gone(Exception):
    """The process is gone (or its pid now names another process)."""


class Denied(Exception):
    """The process's ``stat`` cannot be read."""


@dataclass(frozen=True, slots=True)
class ProcStat:
    status: str
    cpu_time_s: float
    pgid: int
    start_ticks: int


def _read(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read_stat(pid: int, start_ticks: int | None = None) -> ProcStat:
    """``/proc/<pid>/stat`` in one read. ``start_ticks``: the start time the process had when first
    read (None: not known yet); another one raises :class:`Gone`."""
    try:
        data = _read(f"{PROC}/{pid}/stat", MAX_STAT_BYTES)
    except OSError as e:
        if e.errno in _GONE:
            raise Gone(pid) from None
        raise Denied(f"{pid}: {e.strerror}") from None
    st = parse_stat(data)
    if st is None:
        raise Denied(f"{pid}: unexpected stat format")
    if start_ticks is not None and st.start_ticks != start_ticks:
        raise Gone(pid)
    return st


def parse_stat(data: bytes) -> ProcStat | None:
    """The fields of one ``stat`` text (None: not that format). ``pid (comm) S ppid pgrp ...``: the
    command name is the program's own (any byte but NUL, spaces and parentheses included), so the
    fields are counted from the last ``)``."""
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        state = fields[0].decode("ascii", "replace")
        pgid, utime, stime, started = int(fields[2]), int(fields[11]), int(fields[12]), int(fields[19])
    except (IndexError, ValueError):
        return None
    return ProcStat(STATUSES.get(state, "?"), utime / CLOCK_TICKS + stime / CLOCK_TICKS, pgid, started)


def read_io(pid: int) -> tuple[int, int, int, int] | None:
    """(read_bytes, write_bytes, read_chars, write_chars) from ``/proc/<pid>/io`` in one read; None
    where it may not be read. Raises :class:`Gone`."""
    try:
        data = _read(f"{PROC}/{pid}/io", 1024)
    except OSError as e:
        if e.errno in _GONE:
            raise Gone(pid) from None
        return None
    values: dict[bytes, int] = {}
    for line in data.splitlines():
        name, _, value = line.partition(b":")
        try:
            values[name] = int(value)
        except ValueError:
            continue
    try:
        return values[b"read_bytes"], values[b"write_bytes"], values[b"rchar"], values[b"wchar"]
    except KeyError:
        return None


_LEADERS_MAX = 4096
_leaders: dict[int, int] = {}
"""pid -> the start time of the process psutil last found leading its thread group under that pid."""


def pid_exists(pid: int) -> bool:
    """``psutil.pid_exists`` (a process, not a thread's id), for a pid asked about again and again (the
    progress reader, each file each process period): one read of ``stat``; psutil's check of the
    thread group (``status``, a larger file) only the first time a pid shows a start time - a process
    that leads its group keeps leading it until it exits, and a pid reused is a new start time."""
    if pid <= 0 or not AVAILABLE:
        return bool(psutil.pid_exists(pid))
    try:
        started = read_stat(pid).start_ticks
    except Gone:
        return False
    except Denied:
        return bool(psutil.pid_exists(pid))
    if _leaders.get(pid) == started:
        return True
    exists = bool(psutil.pid_exists(pid))
    if exists:
        if len(_leaders) >= _LEADERS_MAX:
            _leaders.clear()
        _leaders[pid] = started
    return exists


__all__ = ["AVAILABLE", "Denied", "Gone", "ProcStat", "parse_stat", "pid_exists", "read_io", "read_stat"]
