"""Bounds on every size that input controls, in one place (issue 11: hostile and broken input).

A recording, a progress file, a table file or a config file is input; whatever it says, the memory
and the time spent on it stay bounded and a breach is a clear error (exit 2), never an exhausted
machine. Each limit is far above what a real file needs:

- :data:`MAX_GPUS` - GPUs per node (an nvidia-smi ``index`` must be below it; ``--gpus`` at most it).
  The largest nodes have 8-16 GPUs (72 for an NVL72 rack seen as one host); per-GPU state is
  allocated by index, so index 1000000 once meant 1.5 GB.
- :data:`MAX_LINE_BYTES` - one line of a recording (nvidia-smi writes < 1 KiB).
- :data:`MAX_TABLE_BYTES`, :data:`MAX_CONFIG_BYTES` - a power table / config file (a few KiB); only
  regular files are read (``/dev/zero`` is refused, not read until memory runs out).
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

MAX_GPUS = 1024
MAX_LINE_BYTES = 1 << 20
MAX_TABLE_BYTES = 1 << 20
MAX_CONFIG_BYTES = 1 << 20
MIN_POWER_LIMIT_W = 1.0
MAX_POWER_LIMIT_W = 5000.0
"""An enforced power limit outside this range is no GPU's (the largest are ~1.4 kW): 1e308 W from a
CSV or ``--power-limit`` once scaled every power band out of reach and hid a deadlock."""


def power_limit_problem(value_w: float) -> str | None:
    """Why ``value_w`` cannot be a GPU's power limit (None: it can)."""
    if not math.isfinite(value_w) or not MIN_POWER_LIMIT_W <= value_w <= MAX_POWER_LIMIT_W:
        return (
            f"{value_w!r} W is outside {MIN_POWER_LIMIT_W:g}-{MAX_POWER_LIMIT_W:g} W (no GPU's power limit)"
        )
    return None


class InputTooLarge(ValueError):
    """A file over its bound, or not a regular file."""


def read_regular_file(path: str | Path, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``.

    Raises FileNotFoundError, OSError (unreadable) or :class:`InputTooLarge`, whose message names the
    file and the bound. Never reads more than ``max_bytes + 1`` bytes, whatever the file is.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputTooLarge(f"{path}: the {what} is not a regular file")
        if st.st_size > max_bytes:
            raise InputTooLarge(f"{path}: the {what} is {st.st_size} bytes, more than {max_bytes}")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:  # it grew while being read
        raise InputTooLarge(f"{path}: the {what} is more than {max_bytes} bytes")
    return b"".join(chunks)


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (so ``--json`` output is JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value
