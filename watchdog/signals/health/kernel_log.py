"""The kernel log as a health signal: ``NVRM: Xid`` lines and GPUs that "fell off the bus".

Parsing (:func:`parse_line`) is pure and bounded: one line in, at most one :class:`KernelLine` out,
whatever the bytes. It reads every form NVIDIA's Xid documentation shows, with or without what
surrounds the message (a ``/dev/kmsg`` record prefix ``6,1234,5678,-;``, a syslog or ``journalctl``
prefix ``Nov 22 18:29:55 host kernel: [ 966.503025]``)::

    NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu...
    NVRM: Xid (0000:03:00): 14, Channel 00000001                         (drivers before the PCI: prefix)
    NVRM: Xid (PCI:0000:06:00): 41, ROBUST_CHANNEL_CE2_ERROR: Copy Engine Exception
    NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.

Readers turn a source into lines, never blocking the cycle:

- :class:`KmsgReader` - ``/dev/kmsg``, opened non-blocking and positioned at its end (old boot
  messages are not news); a ``EPIPE`` (records overwritten before we read them) is counted and
  reading goes on; each :meth:`~KmsgReader.poll` reads at most ``max_lines`` records;
- :class:`JournalReader` - ``journalctl -k -f`` where ``/dev/kmsg`` cannot be read (a container
  without it, ``kernel.dmesg_restrict`` and no CAP_SYSLOG), its output read from a non-blocking pipe;
- :class:`FileReader` - a log FILE given to the sim and replay sources, read from its start,
  followed as it grows (a truncated or replaced file is read again from its start).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpu_triage.model.health import FaultKind, canonical_bus_id
from gpu_triage.model.names import printable

#: A kernel record longer than this is cut before parsing (the kernel's own limit is ~1 KiB).
MAX_LINE_CHARS = 4096
#: Characters of a line kept for the reasons people read.
MAX_TEXT_CHARS = 200
#: Lines one poll reads at most (the rest wait for the next cycle).
MAX_LINES_PER_POLL = 2000
_READ_BYTES = 8192

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?)\): "
    r"(?P<code>\d{1,6})(?:,\s*(?P<rest>.*))?"
)
_BUS = re.compile(r"(?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")
_KMSG_PREFIX = re.compile(r"^\d{1,3},\d{1,20},\d{1,20},[^;]{0,64};")
_FALLEN = "fallen off the bus"


@dataclass(frozen=True, slots=True)
class KernelLine:
    """One health-relevant kernel line: an Xid, or a GPU fallen off the bus."""

    kind: FaultKind
    """``XID`` or ``FALLEN_OFF_BUS``."""
    pci_bus_id: str | None
    """Canonical (``00000000:1B:00.0``); None when the line names no address."""
    xid: int | None
    text: str
    """The rest of the message, printable and at most :data:`MAX_TEXT_CHARS`."""


def parse_line(line: str | bytes) -> KernelLine | None:
    """The Xid or fallen-off-the-bus fact in one kernel line, or None. Never raises."""
    if isinstance(line, bytes):
        line = line[: MAX_LINE_CHARS * 4].decode("utf-8", errors="replace")
    line = line[:MAX_LINE_CHARS]
    if "NVRM" not in line and _FALLEN not in line:
        return None
    prefix = _KMSG_PREFIX.match(line)
    if prefix is not None:
        line = line[prefix.end() :]
    m = _XID.search(line)
    if m is not None:
        code = int(m.group("code"))
        if code <= 0:
            return None
        rest = m.group("rest") or ""
        return KernelLine(
            FaultKind.XID, canonical_bus_id(m.group("bus")), code, printable(rest.strip(), MAX_TEXT_CHARS)
        )
    if _FALLEN in line:
        at = line.find("NVRM")
        body = line[at:] if at >= 0 else line
        bus = _BUS.search(body)
        return KernelLine(
            FaultKind.FALLEN_OFF_BUS,
            canonical_bus_id(bus.group("bus")) if bus is not None else None,
            None,
            printable(body.strip(), MAX_TEXT_CHARS),
        )
    return None


class KmsgReader:
    """``/dev/kmsg``, non-blocking, from its end. Raises OSError at construction if unreadable."""

    name = "kmsg"

    def __init__(self, path: str | Path = "/dev/kmsg", *, from_start: bool = False) -> None:
        self.path = str(path)
        self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not from_start:
            os.lseek(self._fd, 0, os.SEEK_END)
        self.overruns = 0
        """Times the kernel overwrote records before we read them (EPIPE)."""
        self.lines_read = 0
        self.last_error: str | None = None

    def poll(self, max_lines: int = MAX_LINES_PER_POLL) -> list[str]:
        """The records written since the last poll (at most ``max_lines``); never blocks."""
        out: list[str] = []
        if self._fd is None:
            return out
        while len(out) < max_lines:
            try:
                record = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                break
            except BrokenPipeError:
                self.overruns += 1  # the ring buffer wrapped past us: the next read resumes
                continue
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                self.last_error = f"{self.path}: {e.strerror or e}"
                break
            if not record:
                break
            out.append(record.decode("utf-8", errors="replace").split("\n", 1)[0])
        self.lines_read += len(out)
        return out

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class JournalReader:
    """``journalctl -k -f`` (the kernel messages from now on), read from a non-blocking pipe."""

    name = "journal"

    def __init__(self, journalctl: str = "journalctl") -> None:
        exe = shutil.which(journalctl)
        if exe is None:
            raise OSError(errno.ENOENT, f"{journalctl} not found")
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [exe, "-k", "-f", "-n", "0", "-o", "cat", "--no-pager"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._buffer = b""
        self.overruns = 0
        self.lines_read = 0
        self.last_error: str | None = None

    def poll(self, max_lines: int = MAX_LINES_PER_POLL) -> list[str]:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return []
        chunks: list[bytes] = []
        budget = max_lines * 256
        while budget > 0:
            try:
                chunk = os.read(proc.stdout.fileno(), _READ_BYTES)
            except BlockingIOError:
                break
            except OSError as e:
                self.last_error = f"journalctl: {e.strerror or e}"
                break
            if not chunk:
                if proc.poll() is not None:
                    self.last_error = f"journalctl exited with {proc.returncode}"
                break
            chunks.append(chunk)
            budget -= len(chunk)
        lines, self._buffer = _split(self._buffer + b"".join(chunks))
        self.lines_read += len(lines)
        return lines[:max_lines]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=2)
            if proc.stdout is not None:
                proc.stdout.close()


class FileReader:
    """A kernel log FILE (sim and replay sources), from its start, followed as it grows."""

    name = "file"

    def __init__(self, path: str | Path, *, max_bytes_per_poll: int = 1 << 20) -> None:
        self.path = Path(path)
        self.max_bytes_per_poll = max_bytes_per_poll
        self._offset = 0
        self._inode: int | None = None
        self._buffer = b""
        self.overruns = 0
        self.lines_read = 0
        self.last_error: str | None = None

    def poll(self, max_lines: int = MAX_LINES_PER_POLL) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self._inode or st.st_size < self._offset:
                    self._inode, self._offset, self._buffer = st.st_ino, 0, b""  # replaced or truncated
                f.seek(self._offset)
                data = f.read(self.max_bytes_per_poll)
        except OSError as e:
            self.last_error = f"{self.path}: {e.strerror or e}"
            return []
        self.last_error = None
        self._offset += len(data)
        lines, self._buffer = _split(self._buffer + data)
        self.lines_read += len(lines)
        return lines[:max_lines]

    def close(self) -> None:
        pass


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the daemon dies, however it dies (no journalctl left
    behind by a killed daemon). Linux ``prctl(PR_SET_PDEATHSIG)``; nothing elsewhere."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1


def _split(data: bytes) -> tuple[list[str], bytes]:
    """Complete lines of ``data`` and the unfinished rest (a rest longer than a line may be is cut:
    a line without an end can never grow without bound)."""
    *complete, rest = data.split(b"\n")
    if len(rest) > MAX_LINE_CHARS * 4:
        complete.append(rest)
        rest = b""
    return [c[: MAX_LINE_CHARS * 4].decode("utf-8", errors="replace") for c in complete], rest


__all__ = [
    "MAX_LINES_PER_POLL",
    "FileReader",
    "JournalReader",
    "KernelLine",
    "KmsgReader",
    "parse_line",
]
