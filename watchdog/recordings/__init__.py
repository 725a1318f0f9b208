"""Recorded GPU telemetry: reading nvidia-smi CSV logs (``nvsmi_csv``), vectorised and chunked.

``nvsmi_csv`` is the public reader; it composes one module per concern: ``layout`` (header, columns,
units), ``blocks`` (blocks of lines and their line numbers), ``parse`` (a block into arrays: pyarrow.csv,
or on one CPU first ``direct`` - the bytes decoded with numpy),
``cells`` (a column into arrays), ``timestamps``, ``gpu_assign`` and ``gpu_count`` (which GPU a row
is), ``values`` (what the reader hands out) and ``errors``.

pyarrow is imported only where recordings are read, never by the daemon's cycle, so this package
exports the reader lazily: ``import gpu_triage.recordings`` alone does not
pull pyarrow in, while ``from gpu_triage.recordings import NvsmiCsvReader`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_triage.recordings.nvsmi_csv import (
        Chunk,
        NvsmiCsvReader,
        RecordingError,
        RecordingHeader,
        RecordingWarning,
        concat_chunks,
        empty_chunk,
        gpu_model_name,
        read_recording,
    )

__all__ = [
    "Chunk",
    "NvsmiCsvReader",
    "RecordingError",
    "RecordingHeader",
    "RecordingWarning",
    "concat_chunks",
    "empty_chunk",
    "gpu_model_name",
    "read_recording",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("gpu_triage.recordings.nvsmi_csv"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
