"""How a recording that cannot be read is reported: one error naming file, line and field.

Every part of the reader raises :class:`RecordingError` with the 1-based line in the file and the
1-based field number, so a user can open the file at the exact spot; what is skipped instead of
refused (a truncated last line, a repeated header) becomes a warning string, re-issued as
:class:`RecordingWarning` by :func:`gpu_triage.recordings.read_recording`.
"""

from __future__ import annotations

from pathlib import Path


class RecordingError(ValueError):
    """A recording that cannot be read; ``str()`` is ``"{path}:{line}:{column}: {message}"``.

    ``line`` is 1-based in the file; ``column`` is the 1-based field number (comma-separated), or 0
    when the problem is not one field's (e.g. the GPU count cannot be inferred).
    """

    def __init__(self, path: str | Path, line: int, column: int, message: str) -> None:
        self.path = str(path)
        self.line = int(line)
        self.column = int(column)
        self.message = message
        super().__init__(f"{self.path}:{self.line}:{self.column}: {message}")

    def __reduce__(self) -> tuple[type, tuple[str, int, int, str]]:
        return (type(self), (self.path, self.line, self.column, self.message))


class RecordingWarning(UserWarning):
    """Something in a recording was skipped (truncated last line, repeated header, no timestamps)."""


def short(cell: object) -> str:
    """A cell quoted for a message, cut to 40 characters."""
    text = str(cell)
    return repr(text if len(text) <= 40 else text[:37] + "...")
