"""Read ``nvidia-smi --query-gpu=... --format=csv`` recordings as people really record them.

What a recording looks like::

    timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]
    2025/07/27 00:34:45.155, 72.36 W, 0 %, 131 MiB

* one row per GPU per query, GPUs in board order; an ``index`` column may say which GPU a row is,
  otherwise the row's position in its snapshot does (``gpu = position % gpus``, see
  :mod:`gpu_triage.recordings.gpu_count` for how ``gpus`` is found when nobody says);
* units in the header (``[W]``), in the cells (``72.36 W``), both, or neither (``nounits``), mixed
  within one file; no header at all with ``noheader`` (then the caller passes ``columns=``);
* ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``[GPU is lost]``, ``N/A`` and empty cells
  are missing values (NaN), not errors;
* blank lines are skipped; a last line cut short by a killed logger (no newline, fewer fields or a cut
  final field) is skipped with a warning, and so is an incomplete last snapshot where rows are GPUs by
  position (the logger killed mid-snapshot); a repeated header line (a logger restarted with ``>>``) is
  skipped with a warning; anything else malformed is a :class:`RecordingError`
  ``"{path}:{line}:{column}: {message}"`` where ``line`` is the 1-based line in the file and
  ``column`` the 1-based **field number** (0 when the message is about the whole file).

How it is read, one concern per module (each readable alone):

* :mod:`~gpu_triage.recordings.layout` - the header line, the column layout and units;
* :mod:`~gpu_triage.recordings.blocks` - blocks of complete lines read into one reused buffer, the
  file line of each row, the truncated-last-line rule, the line-by-line scan of the error path;
* :mod:`~gpu_triage.recordings.parse` - one block into arrays through ``pyarrow.csv`` (fast path,
  slow path, the column thread pool), which names a bad line and field; where the process has one
  CPU, first :mod:`~gpu_triage.recordings.direct` (the bytes decoded with numpy: separators, numbers
  and timestamps, no strings; the same arrays) for the blocks it vouches for;
* :mod:`~gpu_triage.recordings.cells` - one column of cells into numbers, timestamps or GPU indices;
* :mod:`~gpu_triage.recordings.gpu_assign` (with :mod:`~gpu_triage.recordings.gpu_count`) - the GPU
  count and each row's board index;
* :mod:`~gpu_triage.recordings.values` - what the reader hands out (:class:`RecordingHeader`,
  :class:`Chunk`); :mod:`~gpu_triage.recordings.errors` - :class:`RecordingError` and its warning.

This module puts them together: :class:`NvsmiCsvReader` reads the header, probes the first ~1 MiB for
the header facts (and keeps those rows' GPUs and times: :attr:`NvsmiCsvReader.head`), then yields
chunks. No Python code runs per row or per cell. Line numbers stay exact
across blocks: each block knows the line number of its first line and the file position of its first
row, so ``line`` and the GPU position carry over chunk boundaries.
"""

from __future__ import annotations

import warnings as _warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path

import numpy as np

from gpu_triage.model.limits import MAX_GPUS
from gpu_triage.recordings.blocks import Text, last_line, raw_blocks
from gpu_triage.recordings.cells import EARLIEST_TIME_S, LATEST_TIME_S, MISSING_TOKENS
from gpu_triage.recordings.errors import RecordingError, RecordingWarning
from gpu_triage.recordings.gpu_assign import GpuAssignment, infer_gpus
from gpu_triage.recordings.layout import KNOWN_FIELDS, NUMERIC_FIELDS, VALUE_FIELDS, read_header
from gpu_triage.recordings.parse import Block, BlockParser
from gpu_triage.recordings.values import (
    Chunk,
    RecordingHeader,
    concat_chunks,
    empty_chunk,
    gpu_model_name,
    slice_chunk,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "EARLIEST_TIME_S",
    "KNOWN_FIELDS",
    "LATEST_TIME_S",
    "MISSING_TOKENS",
    "NUMERIC_FIELDS",
    "PROBE_BYTES",
    "VALUE_FIELDS",
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

#: Default block size. Measured on the 2-core development machine with a 3M-row H100-style file
#: (benchmarks/bench_reader.py): peak RSS above the imports is about +70 MB with 4 MiB blocks, +130 MB
#: with 8 MiB and +340 MB with 32 MiB - every column's temporaries scale with the block - while
#: 4-8 MiB read at least as fast as 32 MiB (smaller working sets stay in cache).
DEFAULT_CHUNK_BYTES = 8 << 20
#: How much of the file the constructor parses to fill the header (GPU count, names, power limit).
PROBE_BYTES = 1 << 20


class NvsmiCsvReader:
    """Chunked, vectorised reader of one nvidia-smi CSV recording.

    ``gpus``: the GPU count when the file has no ``index`` (else inferred; see
    :mod:`gpu_triage.recordings.gpu_count`). ``columns``: the ``--query-gpu`` fields of a ``noheader``
    file (``"power.draw"`` or ``"power.draw [W]"``). ``chunk_bytes``: the block size read at a time.
    ``interval_s``: seconds between snapshots when the file has no timestamp column.

    The constructor reads the header and the first ~1 MiB (to fill :attr:`header`); it raises
    :class:`RecordingError` for a malformed file and ``OSError`` for an unreadable one. Skipped lines
    are reported in :attr:`warnings` (``"path:line: message"``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        gpus: int | None = None,
        columns: Sequence[str] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        interval_s: float = 1.0,
    ) -> None:
        if gpus is not None and not 1 <= gpus <= MAX_GPUS:
            raise ValueError(f"gpus must be between 1 and {MAX_GPUS}, not {gpus}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
        self.path = Path(path)
        self.chunk_bytes = int(chunk_bytes)
        self.interval_s = float(interval_s)
        self.warnings: list[str] = []
        self.dropped_rows = 0
        """Rows of an incomplete last snapshot that :meth:`chunks` dropped (see there)."""
        self._gpus_arg = gpus
        self._size = self.path.stat().st_size
        found = read_header(self.path, columns)
        self._layout, self._data_start, self._first_line = found.layout, found.data_start, found.first_line
        self._parser = BlockParser(self.path, self._layout, found.header_bytes, self._warn)
        self._gpu: GpuAssignment
        self.head: tuple[np.ndarray, np.ndarray]
        """(board index, time) of the first rows: the first block of :data:`PROBE_BYTES` that has rows,
        as the first chunk of ``chunks()`` with ``chunk_bytes=PROBE_BYTES`` gives them - unless rows
        are GPUs by :attr:`position` and fewer than ``gpus - 1`` rows follow that block in the file
        (then that chunk may lack a cut last snapshot: see :meth:`chunks`)."""
        self.header = self._probe()

    def _blocks(self, chunk_bytes: int, extra: bool) -> Generator[tuple[Block, int], None, None]:
        """Parsed blocks with their end offsets; applies the truncated-last-line rule."""
        parse = self._parser.parse
        for text, first_line, end_offset, newlines in raw_blocks(
            self.path, self._data_start, self._first_line, chunk_bytes
        ):
            if newlines >= 0:
                yield parse(text, first_line, extra, newlines), end_offset
                continue

            def parse_last(line: Text, first_line: int = first_line) -> Block:
                return parse(line, first_line, extra, 1)

            block = last_line(text, first_line, self._layout.ncols, parse_last, self.path, self._warn)
            if block is not None:
                yield block, end_offset

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def _probe(self) -> RecordingHeader:
        """The header facts from the first rows (GPU count, names, power limit)."""
        layout = self._layout
        probe: Block | None = None
        blocks = self._blocks(PROBE_BYTES, extra=True)
        try:
            for block, _ in blocks:
                if len(block):
                    probe = block
                    break
        finally:
            blocks.close()
        if probe is None:
            raise RecordingError(self.path, self._first_line, 0, "the recording has no data rows")
        self._gpu = infer_gpus(probe, layout, self._gpus_arg, self.path, self._first_line)
        gpus, source = self._gpu.gpus, self._gpu.source
        if layout.timestamp is None:
            self._warn(
                f"{self.path}:{self._first_line}: no timestamp column: snapshots are placed "
                f"interval_s={self.interval_s:g} s apart"
            )
        gpu = self._gpu.assign(probe, 0)
        time_s = probe.time_s
        if time_s is None:
            time_s = (np.arange(len(probe), dtype=np.int64) // gpus) * self.interval_s
        self.head = (gpu, time_s)
        gpu_names = None
        if probe.names is not None:
            names = probe.names.to_pylist()
            first_row: dict[int, int] = {}
            for row, g in enumerate(gpu[: gpus * 2 + 64].tolist()):
                first_row.setdefault(g, row)
            gpu_names = tuple(names[first_row[g]] if g in first_row else "" for g in range(gpus))
        limit = probe.values.get("power_limit_w")
        power_limit_w = None
        if limit is not None and np.isfinite(limit).any():
            # one of the recorded values (no mean of two): 1e308 stays 1e308 and is refused as such
            power_limit_w = float(np.nanpercentile(limit, 50, method="lower"))
        return RecordingHeader(
            path=str(self.path),
            columns=layout.names,
            gpus=gpus,
            has_index=layout.index is not None,
            gpu_names=gpu_names,
            power_limit_w=power_limit_w,
            size_bytes=self._size,
            has_timestamp=layout.timestamp is not None,
            gpus_from=source,
            units=layout.units,
        )

    # ------------------------------------------------------------------ public
    @property
    def positional(self) -> bool:
        """Whether a row's GPU is its position in its snapshot (no index or uuid/bus id column)."""
        return self._layout.index is None and self._gpu.labels is None and self.header.gpus > 1

    def chunks(self, progress: Callable[[int], None] | None = None) -> Iterator[Chunk]:
        """Yield the recording as chunks of about ``chunk_bytes``; ``progress(end_offset)`` is called
        after each (the file size is ``header.size_bytes``). Raises :class:`RecordingError`.

        Where rows are GPUs by their position in the snapshot (no index or uuid column), an incomplete
        last snapshot - a logger killed mid-snapshot - is dropped with a warning naming its first line
        (:attr:`dropped_rows` counts its rows): its rows would otherwise end some GPUs' series one
        sample later than the others'."""
        gpus = self.header.gpus
        positional = self.positional
        position = 0
        held: list[tuple[Chunk, int]] = []  # positional: the last gpus - 1 rows, until the end is known
        held_rows = 0
        for block, end_offset in self._blocks(self.chunk_bytes, extra=False):
            n = len(block)
            if n == 0:
                if progress is not None and not held:
                    progress(end_offset)
                continue
            gpu = self._gpu.assign(block, position)
            if block.time_s is not None:
                time_s = block.time_s
            else:
                snapshot = (position + np.arange(n, dtype=np.int64)) // gpus
                time_s = snapshot * self.interval_s
            position += n
            absent = np.full(n, np.nan)
            absent.flags.writeable = False
            arrays = {attribute: block.values.get(attribute, absent) for attribute in VALUE_FIELDS}
            chunk = Chunk(gpu=gpu, time_s=time_s, line=block.line, end_offset=end_offset, **arrays)
            if not positional:
                yield chunk
                if progress is not None:
                    progress(end_offset)
                continue
            held.append((chunk, end_offset))
            held_rows += n
            while held_rows - len(held[0][0]) >= gpus - 1:
                first, first_end = held.pop(0)
                held_rows -= len(first)
                yield first
                if progress is not None:
                    progress(first_end)
        cut = position % gpus if held else 0
        if cut:
            self.dropped_rows = cut
            tail = concat_chunks([c for c, _ in held])
            keep = len(tail) - cut
            self._warn(
                f"{self.path}:{int(tail.line[keep])}: the last snapshot has {cut} of {gpus} rows (the "
                f"logger stopped mid-snapshot): dropped"
            )
            held = [(slice_chunk(tail, keep), held[-1][1])]
        for chunk, end_offset in held:
            if len(chunk):
                yield chunk
            if progress is not None:
                progress(end_offset)

    def read_all(self) -> Chunk:
        """Every row as one chunk (needs memory for the whole recording)."""
        return concat_chunks(list(self.chunks()))


def read_recording(path: str | Path, **kw: object) -> tuple[RecordingHeader, Chunk]:
    """Read a whole recording into one :class:`Chunk` (small files, tests). Keyword arguments go to
    :class:`NvsmiCsvReader`; its warnings are re-issued as :class:`RecordingWarning`."""
    reader = NvsmiCsvReader(path, **kw)  # type: ignore[arg-type]
    chunk = reader.read_all()
    for message in reader.warnings:
        _warnings.warn(message, RecordingWarning, stacklevel=2)
    return reader.header, chunk
