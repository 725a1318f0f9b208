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

Kept open (issue 30): a rank's ``stat`` and ``io`` are opened once (:class:`ProcFiles`) and read with
``pread`` each period - an open ``/proc/<pid>`` file names the process, not the number: once that
process is reaped every read fails with ``ESRCH`` (:class:`Gone`), even when the pid names a new
process by then. :func:`pid_exists` keeps a pidfd per pid it said yes to. :func:`identity` is one read
of ``stat`` with what tells one program run in a process from the next: the inspector keeps what it
read about a process (command line, environment, owner, cgroup) until that changes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
from collections.abc import Collection
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
_IO_LAYOUT = (b"rchar:", b"wchar:", b"read_bytes:", b"write_bytes:")


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
    return _checked_stat(pid, data, start_ticks)


def _checked_stat(pid: int, data: bytes, start_ticks: int | None) -> ProcStat:
    """``data`` read from ``pid``'s ``stat``, parsed: :class:`Denied` where it is not that format,
    :class:`Gone` where its start time is not ``start_ticks`` (the pid names another process)."""
    st = parse_stat(data)
    if st is None:
        raise Denied(f"{pid}: unexpected stat format")
    if start_ticks is not None and st.start_ticks != start_ticks:
        raise Gone(pid)
    return st


def _stat_fields(data: bytes) -> list[bytes]:
    """The fields of a ``stat`` text after the command name, from the state on. ``pid (comm) S ppid
    pgrp ...``: the command name is the program's own (any byte but NUL, spaces and parentheses
    included), so the fields are counted from the last ``)``."""
    return data[data.rfind(b")") + 2 :].split()


def parse_stat(data: bytes) -> ProcStat | None:
    """The fields of one ``stat`` text (None: not that format; see :func:`_stat_fields`)."""
    fields = data[data.rfind(b")") + 2 :].split()  # _stat_fields, inlined: every rank every period
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
    return _parse_io(data)


def _parse_io(data: bytes) -> tuple[int, int, int, int] | None:
    t = data.split()
    if len(t) >= 12 and (t[0], t[2], t[8], t[10]) == _IO_LAYOUT:  # the kernel's order (since 2.6.20)
        try:
            return int(t[9]), int(t[11]), int(t[1]), int(t[3])
        except ValueError:
            pass
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


@dataclass(frozen=True, slots=True)
class ProcIdentity:
    """Who a pid is now, from one read of ``stat``: its parent (which may change), its start time,
    and ``program`` - its command name and where its argument and environment blocks lie
    in its memory (new with every ``execve``: a different place on a randomised stack, a different
    size); all zero where the reader may not look into the process (another user's, without
    ``CAP_SYS_PTRACE``) or it has no memory (a zombie, a kernel thread)."""

    ppid: int
    start_ticks: int
    program: tuple[bytes, int, int, int, int]
    kernel_thread: bool

    @property
    def stable(self) -> bool:
        """Whether what was read about this (pid, start, program) holds until ``program`` changes: a
        kernel thread never runs another program; a process whose blocks cannot be seen may have run
        one since (a fork reads as its parent until its ``execve``)."""
        return self.kernel_thread or any(self.program[1:])


_PF_KTHREAD = 0x00200000


def identity(pid: int) -> ProcIdentity | None:
    """:class:`ProcIdentity` of ``pid``; None where it is gone or ``stat`` cannot be read."""
    try:
        data = _read(f"{PROC}/{pid}/stat", MAX_STAT_BYTES)
    except OSError:
        return None
    fields = _stat_fields(data)
    try:
        blocks = (
            (int(fields[45]), int(fields[46]), int(fields[47]), int(fields[48]))
            if len(fields) > 48
            else (0, 0, 0, 0)
        )
        return ProcIdentity(
            int(fields[1]),
            int(fields[19]),
            (data[data.find(b"(") + 1 : data.rfind(b")")], *blocks),
            bool(int(fields[6]) & _PF_KTHREAD),
        )
    except (IndexError, ValueError):
        return None


def pids() -> list[int]:
    """Every process id in ``/proc`` (one ``listdir``)."""
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


class ProcFiles:
    """One process's ``stat`` and ``io``, opened once and read with ``pread`` (see the module doc):
    :meth:`stat` and :meth:`io` answer as :func:`read_stat` and :func:`read_io`. :meth:`close` when
    done; a read that finds the process gone closes them itself. At most :attr:`max_open` are open
    in the process (two descriptors each): :meth:`keep` says None past that, or when no descriptor is
    left, and the caller reads the files afresh each time as before."""

    __slots__ = ("_io", "_stat", "pid")
    max_open = 128
    open_now = 0
    """Instances with their files open (all inspectors together)."""

    def __init__(self, pid: int) -> None:
        """Raises :class:`Gone` (no such process) or :class:`Denied` (``stat`` cannot be opened)."""
        self.pid = pid
        self._io: int | None = None
        self._stat: int | None = None
        try:
            self._stat = os.open(f"{PROC}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in _GONE:
                raise Gone(pid) from None
            raise Denied(f"{pid}: {e.strerror}") from None
        ProcFiles.open_now += 1

    @classmethod
    def keep(cls, pid: int) -> ProcFiles | None:
        """Open ``pid``'s files to keep, or None where no more may be kept open. Raises as the
        constructor does."""
        if cls.open_now >= cls.max_open:
            return None
        try:
            return cls(pid)
        except Denied:
            if _descriptors_left():
                raise
            return None

    def stat(self, start_ticks: int | None = None) -> ProcStat:
        if self._stat is None:
            raise Gone(self.pid)
        try:
            data = os.pread(self._stat, MAX_STAT_BYTES, 0)
        except OSError as e:
            if e.errno in _GONE:
                self.close()
                raise Gone(self.pid) from None
            raise Denied(f"{self.pid}: {e.strerror}") from None
        try:
            return _checked_stat(self.pid, data, start_ticks)
        except Gone:
            self.close()
            raise

    def sample(self, start_ticks: int | None = None) -> tuple[ProcStat, tuple[int, int, int, int] | None]:
        """:meth:`stat` and then :meth:`io` (the inspector's reads of a rank, every process period)."""
        return self.stat(start_ticks), self.io()

    def io(self) -> tuple[int, int, int, int] | None:
        """As :func:`read_io`; a file that cannot be opened (another user's process) is tried again
        next time, as a fresh read would be."""
        if self._stat is None:
            raise Gone(self.pid)
        try:
            if self._io is None:
                self._io = os.open(f"{PROC}/{self.pid}/io", os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(self._io, 1024, 0)
        except OSError as e:
            if e.errno in _GONE:
                self.close()
                raise Gone(self.pid) from None
            return None
        return _parse_io(data)

    def __del__(self) -> None:  # an inspector dropped without close() (tests): no descriptor leaks
        self.close()

    def close(self) -> None:
        if self._stat is not None:
            ProcFiles.open_now -= 1
        for fd in (self._stat, self._io):
            if fd is not None:
                os.close(fd)
        self._stat = self._io = None


def _descriptors_left() -> bool:
    """Whether this process can open one more file (EMFILE/ENFILE say not)."""
    try:
        os.close(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            return False
    return True


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


class PidCheck:
    """:func:`pid_exists` for the pids asked about every process period (the progress reader's): a
    pid said to exist keeps a pidfd, and the next answers are one ``pidfd_send_signal(fd, 0)`` - no
    file read, no parsing - until that process is reaped (``ESRCH``: the pid is asked about afresh,
    it may name another process by now). A zombie still exists, as for psutil. At most
    :attr:`max_fds` pidfds; :meth:`retain` closes those of pids no longer asked about.

    A round of questions (the reader's files of one period) that starts with :meth:`poll` costs one
    system call for all the pids held: every pidfd is watched in one epoll set, and a pidfd becomes
    readable when its process exits - a pid whose pidfd is not readable still exists, no signal
    sent; one whose pidfd is (exited: a zombie, or reaped) is asked as above. :meth:`retain` ends the
    round (without :meth:`poll`, every answer is asked as above)."""

    def __init__(self, max_fds: int = 256) -> None:
        self.max_fds = max_fds
        self._fds: dict[int, int] = {}
        self.fresh_checks = 0
        """Answers that needed :func:`pid_exists` (a pid not held, or its process gone)."""
        self.signal_checks = 0
        """Answers that needed a ``pidfd_send_signal`` (no :meth:`poll` this round, or it exited)."""
        self._watch: select.epoll | None = None
        """The epoll set every held pidfd is in (None: not made yet, or given up)."""
        self._watch_failed = False
        self._exited: set[int] | None = None
        """The pidfds readable at this round's :meth:`poll` (None: no poll this round)."""

    def poll(self) -> None:
        """Start a round: one ``epoll_wait`` (no wait) tells which held pidfds' processes exited."""
        self._exited = None
        if self._watch is None or not self._fds:
            return
        try:
            self._exited = {fd for fd, _ in self._watch.poll(0, len(self._fds))}
        except OSError:
            self._exited = None

    def _watched(self, fd: int) -> None:
        """Put a new pidfd in the epoll set; where that fails, no round is polled any more (every
        answer then asks the kernel, as without :meth:`poll`)."""
        if self._watch_failed:
            return
        try:
            if self._watch is None:
                self._watch = select.epoll()
            self._watch.register(fd, select.EPOLLIN)
        except (AttributeError, OSError, ValueError):
            self._watch_failed = True
            if self._watch is not None:
                self._watch.close()
            self._watch = None

    def __call__(self, pid: int) -> bool:
        fd = self._fds.get(pid)
        if fd is not None:
            if self._exited is not None and fd not in self._exited:
                return True  # its process has not exited (this round's poll)
            self.signal_checks += 1
            try:
                signal.pidfd_send_signal(fd, 0)
                return True
            except PermissionError:  # another user's process: it exists
                return True
            except OSError:  # reaped: the pid may name another process now
                del self._fds[pid]
                os.close(fd)
        self.fresh_checks += 1
        exists = pid_exists(pid)
        if exists and pid > 0 and AVAILABLE and len(self._fds) < self.max_fds:
            # no pidfds here (Linux < 5.3), or gone meanwhile: asked afresh next time
            with contextlib.suppress(AttributeError, OSError):
                self._fds[pid] = fd = os.pidfd_open(pid)
                self._watched(fd)
        return exists

    def retain(self, pids: Collection[int]) -> None:
        """End the round: close the pidfds of every pid not in ``pids`` (a closed descriptor leaves
        the epoll set by itself)."""
        self._exited = None
        for pid in [p for p in self._fds if p not in pids]:
            os.close(self._fds.pop(pid))

    def close(self) -> None:
        self.retain(())
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def __del__(self) -> None:
        self.close()


__all__ = [
    "AVAILABLE",
    "Denied",
    "Gone",
    "PidCheck",
    "ProcFiles",
    "ProcIdentity",
    "ProcStat",
    "identity",
    "parse_stat",
    "pid_exists",
    "pids",
    "read_io",
    "read_stat",
]
