"""What stays low of the configuration: :class:`ConfigError` (every config problem; the CLI maps it to
exit code 2) and :func:`load_secret`, the one way a secret file (bearer token, routing key, Slack URL) is
read. The sections live beside their components; the aggregate and the loader in
:mod:`gpu_triage.daemon.config`."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from gpu_triage.model.limits import InputTooLarge, read_regular_file

MAX_SECRET_BYTES = 64 * 1024


class ConfigError(ValueError):
    """One or more configuration problems; ``str()`` lists them one per line."""

    def __init__(self, problems: Sequence[object]) -> None:
        self.problems = tuple(str(p) for p in problems)
        super().__init__("\n".join(self.problems))


def load_secret(path: Path, what: str = "token") -> str:
    """Read a secret (bearer token, routing key, Slack URL) from ``path``.

    Refused - :class:`ConfigError` - when the file is missing, empty, not a regular file, larger
    than 64 KiB, more than one line, world-readable (``mode & 0o004``) or writable by anyone but its
    owner (``mode & 0o022``: another user could swap the secret). Group-readable is fine (0640 lets a
    ``gpu-watchdog`` group of operators read it); 0600 is the default. The secret itself never
    appears in an error.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError([f"{path}: cannot read the {what} file: {e.strerror}"]) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError([f"{path}: the {what} file is not a regular file"])
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o004:
        raise ConfigError(
            [
                f"{path}: the {what} file is world-readable (mode {mode:04o}); "
                f"refusing to use it: run `chmod o-r {path}` (0600 or 0640 are fine)"
            ]
        )
    if mode & 0o022:
        who = "world" if mode & 0o002 else "group"
        raise ConfigError(
            [
                f"{path}: the {what} file is {who}-writable (mode {mode:04o}); "
                f"refusing to use it: run `chmod go-w {path}` (0600 or 0640 are fine)"
            ]
        )
    try:
        value = read_regular_file(path, MAX_SECRET_BYTES, f"{what} file").decode("utf-8").strip()
    except InputTooLarge as e:
        raise ConfigError([str(e)]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: cannot read the {what} file: {e}"]) from None
    if not value:
        raise ConfigError([f"{path}: the {what} file is empty"])
    if "\n" in value or "\r" in value:
        raise ConfigError([f"{path}: the {what} file has more than one line (it must hold the {what} alone)"])
    return value


__all__ = ["MAX_SECRET_BYTES", "ConfigError", "load_secret"]
