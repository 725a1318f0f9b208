"""Untrusted names are bytes until proven (pure).

Every name the daemon did not make itself - a job directory's or a file's name in the progress
directory, a progress file's ``job``, ``GPU_WATCHDOG_JOB`` / ``SLURM_JOB_ID`` / ``MASTER_ADDR`` from a
process's environment - is written by a training user. Such a name reaches the event store (SQLite:
a lone surrogate from a non-UTF-8 directory name cannot be encoded), log lines (a newline forges a
whole line, ESC bytes drive the terminal), alert summaries and HTTP answers. Two tools, used at the
edge where the name enters:

- :func:`job_name_problem` - why a name is not a job name (the contract's rule: one path component
  of letters, digits, ``-``, ``_``, ``.``, not starting with ``.``, at most ``MAX_JOB_NAME``
  characters; a lone surrogate, a control or format character is never a letter). The progress reader
  refuses such directories and files with an error entry (escaped);
- :func:`safe_job_key` - a name the daemon derives from an environment value: kept when it is safe,
  otherwise replaced by a bounded, printable form with a short hash of the raw bytes (two different
  hostile names never merge, one hostile name always maps to the same key);
- :func:`printable` - any text made safe for one log line, an alert or JSON: every character that is
  not printable (controls, surrogates, line and paragraph separators, bidi overrides) becomes a
  ``\\xNN`` / ``\\uNNNN`` escape, and the whole is cut to ``limit`` characters.
"""

from __future__ import annotations

import hashlib
import unicodedata

MAX_JOB_NAME = 200
"""The contract's bound on a job name (``gpu_triage.contract.MAX_JOB_NAME``; a test holds them equal:
the model layer does not import the contract)."""

_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:@")
MAX_TEXT = 300
"""Default bound of :func:`printable` (a path or an error message in a log line)."""


def _is_printable(c: str) -> bool:
    if not c.isprintable():
        return False
    return unicodedata.category(c) not in ("Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def printable(value: object, limit: int = MAX_TEXT) -> str:
    """``value`` as one line of printable text, at most ``limit`` characters (escapes included; a cut
    says how many characters were left out)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit and text.isascii() and text.isprintable():
        return text  # the common case, at C speed
    out: list[str] = []
    size = 0
    for i, c in enumerate(text):
        if _is_printable(c):
            piece = c
        elif ord(c) < 0x100:
            piece = f"\\x{ord(c):02x}"
        elif ord(c) < 0x10000:
            piece = f"\\u{ord(c):04x}"
        else:
            piece = f"\\U{ord(c):08x}"
        if size + len(piece) > limit:
            out.append(f"...(+{len(text) - i} chars)")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def job_name_problem(name: str) -> str | None:
    """Why ``name`` is not a job name (None: it is). Pure; never raises."""
    if not name:
        return "empty job name"
    if len(name) > MAX_JOB_NAME:
        return f"job name longer than {MAX_JOB_NAME} characters"
    if name.startswith("."):
        return "job name starts with '.'"
    if not all((c.isalnum() and _is_printable(c)) or c in "-_." for c in name):
        return "job name holds characters other than letters, digits, '-', '_' and '.'"
    return None


def _raw(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape") if _has_surrogates(value) else value.encode()


def _has_surrogates(value: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def safe_job_key(value: str, limit: int = 64) -> str:
    """A job key derived from an untrusted value: ``value`` itself when it uses only ASCII letters,
    digits and ``-_.:@`` and fits ``limit``; else those characters of it (others as ``_``), cut, plus
    ``~`` and 8 hex digits of the raw bytes' SHA-256."""
    if value and len(value) <= limit and all(c in _KEY_CHARS for c in value):
        return value
    try:
        raw = _raw(value)
    except UnicodeEncodeError:  # surrogates that surrogateescape cannot map back (from JSON escapes)
        raw = value.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(raw).hexdigest()[:8]
    kept = "".join(c if c in _KEY_CHARS else "_" for c in value[: limit - 9])
    return f"{kept}~{digest}"


__all__ = ["MAX_TEXT", "job_name_problem", "printable", "safe_job_key"]
