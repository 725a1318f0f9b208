"""One block of complete lines -> a :class:`Block` of arrays, through ``pyarrow.csv`` or directly.

Where the process has one CPU (:func:`direct_first`), :mod:`gpu_triage.recordings.direct` first decodes
the block from its bytes with numpy (the usual nvidia-smi block: every line alike, no missing value);
a block it does not vouch for - and every block where there are more CPUs - takes the Arrow path:
``pyarrow.csv`` reads the block with every wanted column as a string (multi-threaded C++),
:func:`~gpu_triage.recordings.blocks.line_numbers` finds each row's file line with byte counts, and
:mod:`gpu_triage.recordings.cells` turns the columns into arrays - the columns on a small thread pool,
since pyarrow.compute and numpy release the GIL. Only when something is wrong - Arrow refuses
a line, a value does not parse, a lone carriage return - does the slow path
(:func:`~gpu_triage.recordings.blocks.scan`) look at the lines one by one, to name the exact line and
field, or to drop lines Arrow cannot know to skip (``"   "``, a repeated header). Of several bad cells
in a block, the one earliest in the file is reported.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from gpu_triage.recordings import cells
from gpu_triage.recordings.blocks import NeedsScan, Text, line_numbers, scan
from gpu_triage.recordings.direct import parse_direct, usable
from gpu_triage.recordings.errors import RecordingError
from gpu_triage.recordings.layout import Layout

DIRECT: bool | None = None
"""Try :mod:`gpu_triage.recordings.direct` (bytes to arrays with numpy) before ``pyarrow.csv``: True;
False (Arrow for every block, the parser before issue 30); None, the default: by the CPUs this process
may use (:func:`direct_first`)."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a cgroup's cpuset, ``taskset``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def direct_first() -> bool:
    """Whether a block goes to the direct decoder before Arrow (:data:`DIRECT`; None: on one CPU).

    ``pyarrow.csv`` parses on its own C++ threads without the GIL; the direct decoder is a series of
    numpy calls with the GIL held between them. With two CPUs or more Arrow wins the wall time
    (triage of the 4.8 M-row benchmark file, 2 idle cores: 4.9 M rows/s against 4.0 M), on one CPU
    its threads only take turns and the direct decoder wins (``taskset -c 0``: 3.9 M against 3.2 M)."""
    return DIRECT if DIRECT is not None else usable_cpus() < 2


@dataclass
class Block:
    """One parsed block before GPU assignment."""

    line: np.ndarray
    values: dict[str, np.ndarray]
    time_s: np.ndarray | None = None
    index: np.ndarray | None = None
    labels: pa.ChunkedArray | None = None
    names: pa.ChunkedArray | None = None

    def __len__(self) -> int:
        return len(self.line)


class BlockParser:
    """Parses blocks of one recording (its ``layout``); ``header_bytes`` is its header line, whose
    repetitions are skipped with a warning passed to ``warn``.

    ``extra=True`` also reads the ``name`` and uuid/bus id columns (for the header probe); otherwise
    only what rows need: the values, the timestamp, the index - or the uuid/bus id without one.
    """

    def __init__(self, path: Path, layout: Layout, header_bytes: bytes, warn: Callable[[str], None]) -> None:
        self.path = path
        self.layout = layout
        self.header_bytes = header_bytes
        self.warn = warn
        names = tuple(f"c{i}" for i in range(layout.ncols))
        self._read_options = pacsv.ReadOptions(column_names=names, use_threads=True, block_size=1 << 20)
        self._parse_options = pacsv.ParseOptions(
            delimiter=",", quote_char=False, double_quote=False, escape_char=False, ignore_empty_lines=True
        )
        self._convert = {extra: self._convert_options(extra) for extra in (False, True)}

    def _convert_options(self, extra: bool) -> pacsv.ConvertOptions:
        layout = self.layout
        wanted = {pos for pos, _, _, _ in layout.numeric.values()}
        wanted |= {p for p in (layout.timestamp, layout.index) if p is not None}
        if layout.label is not None and layout.index is None:
            wanted.add(layout.label)
        if extra:
            wanted |= {p for p in (layout.name, layout.label) if p is not None}
        include = [f"c{p}" for p in sorted(wanted)]
        return pacsv.ConvertOptions(
            column_types=dict.fromkeys(include, pa.string()),
            include_columns=include,
            check_utf8=True,
            null_values=[],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )

    def parse(self, text: Text, first_line: int, extra: bool, newlines: int) -> Block:
        """Rows of ``text`` (complete lines, ``newlines`` of them, the first being ``first_line``)."""
        if direct_first() and usable(self.layout, extra) and text.end:
            found = parse_direct(text.array(), text.buffer, newlines, self.layout)
            if found is not None:
                return Block(
                    line=np.arange(first_line, first_line + newlines, dtype=np.int64),
                    values=found.values,
                    time_s=found.time_s,
                    index=found.index,
                )
        try:
            table = self._read_table(text, extra)
            line = line_numbers(text, first_line, table.num_rows, newlines, self.layout.ncols)
            return self._convert_table(table, line, extra)
        except (NeedsScan, pa.ArrowException):
            pass
        except RecordingError:
            if not (self.header_bytes and text.contains(self.header_bytes)):
                raise
        # Slow path: one look at every line, to drop odd blank lines and repeated headers, and to
        # name the exact line and field of a structural error.
        clean, lines = scan(
            text.tobytes(), first_line, self.layout.names, self.header_bytes, self.path, self.warn
        )
        try:
            table = self._read_table(Text(clean), extra)
        except pa.ArrowException as error:  # the scan should have caught anything Arrow refuses
            raise RecordingError(self.path, int(lines[0]), 0, f"cannot parse: {error}") from None
        if table.num_rows != len(lines):
            raise RecordingError(self.path, first_line, 0, "cannot parse: the line count does not match")
        return self._convert_table(table, lines, extra)

    def _read_table(self, text: Text, extra: bool) -> pa.Table:
        if text.end == 0:
            return pa.table(
                {name: pa.array([], pa.string()) for name in self._convert[extra].include_columns}
            )
        return pacsv.read_csv(
            text.arrow(),
            read_options=self._read_options,
            parse_options=self._parse_options,
            convert_options=self._convert[extra],
        )

    def _convert_table(self, table: pa.Table, line: np.ndarray, extra: bool) -> Block:
        layout = self.layout
        path = self.path

        def column(pos: int) -> pa.ChunkedArray:
            return table.column(f"c{pos}")

        # The columns are independent and pyarrow.compute releases the GIL: convert them in parallel.
        # Every column is converted even when one fails, so the error reported is the first one in
        # the file (lowest line, then lowest field), whatever the thread timing.
        tasks: dict[str, Callable[[], object]] = {
            attribute: partial(cells.numbers, path, column(pos), suffix, scale, name, pos, line)
            for attribute, (pos, suffix, scale, name) in layout.numeric.items()
        }
        if layout.timestamp is not None:
            tasks["time_s"] = partial(
                cells.timestamps, path, column(layout.timestamp), layout.timestamp, line
            )
        if layout.index is not None:
            tasks["index"] = partial(cells.indices, path, column(layout.index), layout.index, line)
        results = _run_all(tasks)
        errors = [r for r in results.values() if isinstance(r, RecordingError)]
        if errors:
            raise min(errors, key=lambda e: (e.line, e.column))
        block = Block(
            line=line,
            values={attribute: results[attribute] for attribute in layout.numeric},  # type: ignore[misc]
            time_s=results.get("time_s"),  # type: ignore[arg-type]
            index=results.get("index"),  # type: ignore[arg-type]
        )
        if layout.label is not None and (extra or layout.index is None):
            block.labels = pc.ascii_trim_whitespace(column(layout.label))
        if extra and layout.name is not None:
            block.names = pc.ascii_trim_whitespace(column(layout.name))
        return block


#: Threads converting a block's columns (pyarrow.compute and numpy release the GIL).
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _run_all(tasks: dict[str, Callable[[], object]]) -> dict[str, object]:
    """Run ``tasks`` on a small shared thread pool; a task's RecordingError becomes its result."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="nvsmi-csv")

    def guarded(task: Callable[[], object]) -> object:
        try:
            return task()
        except RecordingError as error:
            return error

    if len(tasks) == 1 or _WORKERS == 1:
        return {key: guarded(task) for key, task in tasks.items()}
    futures = {key: _POOL.submit(guarded, task) for key, task in tasks.items()}
    return {key: future.result() for key, future in futures.items()}
