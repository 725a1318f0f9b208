"""Which GPU each row is: the count from the first rows, then a board index per row.

The count comes from the caller (``--gpus``), else an ``index`` column, else the rhythm of the first
rows (:mod:`gpu_triage.recordings.gpu_count`: a uuid/bus id column repeating, the timestamp gaps, the
repeated readings). Each row's board index is then its ``index`` cell, else its uuid/bus id's position
among the first rows' ones, else its position in its snapshot (``gpu = position % gpus``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_triage.recordings import gpu_count
from gpu_triage.recordings.errors import RecordingError, short
from gpu_triage.recordings.layout import Layout
from gpu_triage.recordings.parse import Block


@dataclass(frozen=True)
class GpuAssignment:
    """The GPU count of a recording, where it came from, and how rows map to board indices."""

    path: Path
    layout: Layout
    gpus: int
    source: str
    """caller, index, uuid, pci.bus_id, timestamps or values."""
    labels: pa.Array | None
    """The first rows' uuid/bus ids, per board index (None with an index column or no labels)."""

    def assign(self, block: Block, position: int) -> np.ndarray:
        """Board index per row of ``block``, whose first row is the ``position``-th of the file."""
        gpus = self.gpus
        if block.index is not None:
            too_big = block.index >= gpus
            if too_big.any():
                row = int(np.argmax(too_big))
                raise RecordingError(
                    self.path,
                    int(block.line[row]),
                    (self.layout.index or 0) + 1,
                    f"index {block.index[row]} but the recording has {gpus} GPUs "
                    f"({'--gpus' if self.source == 'caller' else 'from the first rows'})",
                )
            return block.index.astype(np.int32, copy=False)
        if block.labels is not None and self.labels is not None:
            found = pc.index_in(block.labels, value_set=self.labels)
            if found.null_count:
                row = int(np.argmax(np.asarray(pc.is_null(found))))
                raise RecordingError(
                    self.path,
                    int(block.line[row]),
                    (self.layout.label or 0) + 1,
                    f"{short(block.labels[row].as_py())} is not one of the {gpus} GPUs of the first rows",
                )
            return found.to_numpy().astype(np.int32)
        return ((position + np.arange(len(block), dtype=np.int64)) % gpus).astype(np.int32)


def infer_gpus(
    probe: Block, layout: Layout, gpus_arg: int | None, path: Path, first_line: int
) -> GpuAssignment:
    """The GPU count from ``gpus_arg`` (the caller's) or the first rows ``probe`` (see the module doc);
    raises :class:`RecordingError` when it cannot be inferred or the first rows contradict it."""
    gpus: int | None
    if gpus_arg is not None:
        gpus, source = gpus_arg, "caller"
    elif probe.index is not None:
        gpus, source = int(probe.index.max()) + 1, "index"
    else:
        gpus, source = None, ""
        if probe.labels is not None:
            labels = probe.labels.slice(0, 2 * gpu_count.MAX_GPUS + 1).to_pylist()
            found = gpu_count.period_from_labels(labels[0], labels)
            if found is not None and (found < len(labels) or len(labels) == len(probe)):
                assert layout.label is not None  # labels are read only from a label column
                gpus, source = found, layout.names[layout.label]
        if gpus is None and probe.time_s is not None:
            found = gpu_count.period_from_gaps(probe.time_s)
            if found is not None:
                gpus, source = found, "timestamps"
        if gpus is None:
            found = gpu_count.period_from_values(probe.values["power_w"])
            if found is not None:
                gpus, source = found, "values"
        if gpus is None:
            raise RecordingError(
                path,
                first_line,
                0,
                "cannot infer the GPU count (no index column, and neither the timestamps nor the "
                "values repeat clearly): pass --gpus (gpus=)",
            )
    assert gpus is not None
    first_labels: pa.Array | None = None
    if layout.label is not None and layout.index is None and probe.labels is not None:
        first = probe.labels.slice(0, gpus)
        distinct = pc.count_distinct(first).as_py()
        if len(first) < gpus or distinct != gpus:
            raise RecordingError(
                path,
                first_line,
                layout.label + 1,
                f"the first {gpus} rows should name {gpus} different GPUs, they name {distinct}: "
                "check --gpus",
            )
        first_labels = first.combine_chunks()
    return GpuAssignment(path=path, layout=layout, gpus=gpus, source=source, labels=first_labels)
