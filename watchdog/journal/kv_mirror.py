"""A copy of the event store's small key/value table in a file of its own, written atomically.

The kv table holds the few records that keep the daemon safe across a restart: silences, the kill
budget (kill times), the deterministic-hang signatures, the alerts still firing. When the event store
is found corrupt it is moved aside and started anew (eventstore module docstring); without this copy
those records would reset with it - a silenced issue would page again, the kill budget would refill.
So every change of the kv table also rewrites ``<state_dir>/kv-mirror.json`` (temp file, fsync,
``os.replace``: a reader sees the old copy or the new one, never half of one), and a fresh store
(after a corrupt one, or a memory-only one when the disk is full) starts from it.

The file is small by construction (a handful of keys); it is read with a bound
(:data:`MAX_MIRROR_BYTES`) and anything unexpected in it is ignored with a warning, never raised.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIRROR_NAME = "kv-mirror.json"
MAX_MIRROR_BYTES = 4 << 20
"""Refuse to read a mirror larger than this (it holds a few small records)."""


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename).
    Raises OSError (a full disk); the previous file is then untouched."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class KvMirror:
    """Keeps ``state_dir/kv-mirror.json`` equal to the kv table (``{key: JSON text of the value}``)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / MIRROR_NAME
        self._written: str | None = None
        self.failures_total = 0

    def write(self, items: dict[str, str]) -> None:
        """Rewrite the mirror if ``items`` differ from what was last written; never raises."""
        text = json.dumps(items, sort_keys=True, separators=(",", ":"))
        if text == self._written:
            return
        try:
            write_atomic(self.path, text.encode())
            self._written = text
        except OSError as e:
            self.failures_total += 1
            log.warning(
                "could not write the safety-state copy %s: %s (the event store still has it)", self.path, e
            )

    def read(self) -> dict[str, str]:
        """The mirrored items, or {} (no file, unreadable, too large, not the expected shape: logged)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_MIRROR_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.warning("cannot read the safety-state copy %s: %s", self.path, e)
            return {}
        if len(data) > MAX_MIRROR_BYTES:
            log.warning("safety-state copy %s is larger than %d bytes; ignored", self.path, MAX_MIRROR_BYTES)
            return {}
        try:
            obj: Any = json.loads(data)
        except (ValueError, RecursionError) as e:
            log.warning("safety-state copy %s is not JSON (%s); ignored", self.path, e)
            return {}
        if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in obj.items()
        ):
            log.warning("safety-state copy %s does not hold {key: text}; ignored", self.path)
            return {}
        self._written = json.dumps(obj, sort_keys=True, separators=(",", ":"))
        return obj
