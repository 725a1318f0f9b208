"""What stays low of the configuration: :class:`ConfigError` (every config problem; the CLI maps it to
exit code 2) and :func:`load_secret`, the one way a secret file (bearer token, routing key, Slack URL) is
read. The sections live beside their components; the aggregate and the loader in
:mod:`gpu_triage.daemon.config`."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpu_triage.model.limits import InputTooLarge, read_regular_file

MAX_SECRET_BYTES = 64 * 1024


class ConfigError(ValueError):
    """One or more configuration problems; ``str()`` lists them one per line."""

    def __init__(self, problems: Sequence[object]) -> None:
        self.problems = tuple(str(p) for p in problems)
        super().__init__("\n".join(self.problems))


def load_secret(path: Path, what: str = "token", *, forbidden_gids: Iterable[int] = ()) -> str:
    """Read a secret (bearer token, routing key, Slack URL) from ``path``.

    Refused - :class:`ConfigError` - when the file is missing, empty, not a regular file, larger
    than 64 KiB, more than one line, world-readable (``mode & 0o004``) or writable by anyone but its
    owner (``mode & 0o022``: another user could swap the secret). Group-readable (0640) only when the
    group lets no one else read it (:func:`secret_group_problem`): its members are at most root, the
    file's owner and the daemon's own user, and it is none of ``forbidden_gids`` (the progress
    directory's group: the training users). 0600 is the default. The secret never appears in an error.
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
    if mode & 0o040:
        problem = secret_group_problem(st.st_gid, st.st_uid, forbidden_gids)
        if problem is not None:
            raise ConfigError(
                [
                    f"{path}: the {what} file is group-readable (mode {mode:04o}) and {problem}; "
                    f"refusing to use it: run `chmod g-r {path}` or give it a group of operators only"
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


def secret_group_problem(gid: int, owner_uid: int, forbidden_gids: Iterable[int] = ()) -> str | None:
    """Why a group may not read a secret (None: it may). The group must not be a training group (one
    of ``forbidden_gids``) and must hold no user other than root, the file's owner and the daemon's
    own user - as members (``/etc/group``) or as their primary group (``/etc/passwd``)."""
    import grp
    import pwd

    if gid in set(forbidden_gids):
        return f"its group (gid {gid}) is the progress directory's group: every training user could read it"
    allowed = {0, owner_uid, os.geteuid()}
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return f"its group (gid {gid}) is unknown here, so who can read it cannot be told"
    others: list[str] = []
    for name in group.gr_mem:
        try:
            if pwd.getpwnam(name).pw_uid not in allowed:
                others.append(name)
        except KeyError:
            others.append(name)
    others += [p.pw_name for p in pwd.getpwall() if p.pw_gid == gid and p.pw_uid not in allowed]
    if others:
        names = ", ".join(sorted(set(others))[:5])
        return f"its group {group.gr_name} has other members ({names})"
    return None


__all__ = ["MAX_SECRET_BYTES", "ConfigError", "load_secret", "secret_group_problem"]
