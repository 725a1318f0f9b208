"""Corpus files: discovery, splitting into work units, and reading documents - shared by ``pretokenize``
(sequential reads of a unit) and the stream mode (random reads of one document by its location), so both
see exactly the same text for a document.

Formats, by file suffix:
- ``.jsonl``: one JSON object per line; the document is the string field ``data.text_field``; blank lines
  are skipped. Location = (byte offset, byte length) of the line.
- ``.txt``: ``data.text_unit = "line"``: each non-blank line is a document, location as for JSONL;
  ``"file"``: the whole file is one document, location (0, size).
- ``.parquet``: one document per row, column ``data.text_field``. Location = (row group, row in group).

Large JSONL/text files are cut into units of about ``shard_bytes`` at line boundaries; Parquet files into
runs of row groups. One unit becomes one cache shard.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SUFFIX_FORMATS",
    "SourceError",
    "SourceReader",
    "WorkUnit",
    "discover",
    "iter_unit_docs",
    "plan_units",
]

SUFFIX_FORMATS = {".jsonl": "jsonl", ".txt": "text", ".parquet": "parquet"}


class SourceError(ValueError):
    """A corpus problem, naming the file (and line or row) and what was wrong."""


@dataclass(frozen=True)
class WorkUnit:
    index: int
    source: str  # path relative to the corpus root, POSIX separators
    format: str  # jsonl | text | parquet
    start: int  # byte offset (jsonl/text) or first row group (parquet)
    end: int  # exclusive byte offset or row group
    source_bytes: int
    source_mtime_ns: int

    @property
    def name(self) -> str:
        """Content-addressed (source, range): a unit keeps its shard name when other files are added,
        removed or grow, so a rerun only redoes what changed."""
        key = f"{self.source}\0{self.format}\0{self.start}\0{self.end}".encode()
        return f"shard-{hashlib.sha1(key, usedforsecurity=False).hexdigest()[:16]}"

    @property
    def size_bytes(self) -> int:
        """Work estimate for the progress bar (bytes of source, whole file for Parquet units)."""
        return self.end - self.start if self.format != "parquet" else max(1, self.source_bytes)

    def identity(self) -> dict[str, Any]:
        """What a finished shard must match to be reused (its position in the corpus is not part of it)."""
        d = asdict(self)
        d.pop("index")
        return d


def discover(inputs: list[Path]) -> tuple[Path, list[Path]]:
    """(root, files): every corpus file under ``inputs`` (files or directories, searched recursively),
    sorted by path relative to the root. The root is the single input directory, or the deepest directory
    containing every input."""
    if not inputs:
        raise SourceError("no input given: name corpus files or directories (or data.source_dir)")
    resolved = [Path(p).resolve() for p in inputs]
    for p in resolved:
        if not p.exists():
            raise SourceError(f"{p}: no such file or directory")
    if len(resolved) == 1 and resolved[0].is_dir():
        root = resolved[0]
    else:
        root = Path(os.path.commonpath([p if p.is_dir() else p.parent for p in resolved]))
    files: set[Path] = set()
    for p in resolved:
        if p.is_dir():
            files.update(f for f in p.rglob("*") if f.is_file() and f.suffix in SUFFIX_FORMATS)
        elif p.suffix in SUFFIX_FORMATS:
            files.add(p)
        else:
            raise SourceError(
                f"{p}: unsupported file type {p.suffix!r}; expected one of " + ", ".join(SUFFIX_FORMATS)
            )
    if not files:
        raise SourceError(f"{root}: no corpus files ({', '.join(SUFFIX_FORMATS)}) found")
    return root, sorted(files, key=lambda f: f.relative_to(root).as_posix())


def _line_splits(path: Path, size: int, shard_bytes: int) -> list[int]:
    """Byte offsets cutting a line-oriented file into pieces of about ``shard_bytes``, each at a line
    start."""
    cuts = [0]
    with open(path, "rb") as f:
        pos = shard_bytes
        while pos < size:
            f.seek(pos - 1)
            f.readline()  # to the end of the line holding byte pos-1: the next cut starts a line
            nxt = f.tell()
            if nxt >= size:
                break
            if nxt > cuts[-1]:
                cuts.append(nxt)
            pos = nxt + shard_bytes
    cuts.append(size)
    return cuts


def plan_units(
    root: Path, files: list[Path], *, text_unit: str = "line", shard_bytes: int = 128 << 20
) -> list[WorkUnit]:
    """Split the corpus into work units (one per future shard), in a fixed order."""
    units: list[WorkUnit] = []
    for f in files:
        st = f.stat()
        rel = f.relative_to(root).as_posix()
        fmt = SUFFIX_FORMATS[f.suffix]
        if fmt == "parquet":
            import pyarrow.parquet as pq

            md = pq.ParquetFile(f).metadata
            run_start, run_bytes = 0, 0
            for rg in range(md.num_row_groups):
                run_bytes += md.row_group(rg).total_byte_size
                if run_bytes >= shard_bytes or rg == md.num_row_groups - 1:
                    units.append(
                        WorkUnit(len(units), rel, fmt, run_start, rg + 1, st.st_size, st.st_mtime_ns)
                    )
                    run_start, run_bytes = rg + 1, 0
            continue
        if fmt == "text" and text_unit == "file":
            units.append(WorkUnit(len(units), rel, "text-file", 0, st.st_size, st.st_size, st.st_mtime_ns))
            continue
        cuts = _line_splits(f, st.st_size, shard_bytes) if st.st_size else [0, 0]
        for a, b in itertools.pairwise(cuts):
            units.append(WorkUnit(len(units), rel, fmt, a, b, st.st_size, st.st_mtime_ns))
    return units


def _line_number(path: Path, offset: int) -> int:
    with open(path, "rb") as f:
        return f.read(offset).count(b"\n") + 1


def decode_record(fmt: str, raw: bytes, text_field: str, where: str) -> str:
    """The document text of one line/file's bytes (shared by pretokenize and stream)."""
    if fmt == "jsonl":
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise SourceError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict) or text_field not in obj:
            raise SourceError(f"{where}: no field {text_field!r} (set data.text_field)")
        text = obj[text_field]
        if not isinstance(text, str):
            raise SourceError(f"{where}: field {text_field!r} is {type(text).__name__}, expected a string")
        return text
    return raw.decode("utf-8", errors="replace").rstrip("\r")


def _is_blank(raw: bytes) -> bool:
    return not raw.strip()


def iter_unit_docs(
    root: Path, unit: WorkUnit, text_field: str, batch_docs: int = 1024
) -> Iterator[tuple[list[str], list[tuple[int, int]]]]:
    """Batches of (texts, locations) of a unit's documents, in file order."""
    path = root / unit.source
    st = path.stat()
    if st.st_size != unit.source_bytes:
        raise SourceError(
            f"{path}: {st.st_size} bytes now, {unit.source_bytes} when planned: the corpus changed "
            "during pretokenize"
        )
    if unit.format == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        for rg in range(unit.start, unit.end):
            col = pf.read_row_group(rg, columns=[text_field]).column(text_field).to_pylist()
            texts: list[str] = []
            locs: list[tuple[int, int]] = []
            for i, t in enumerate(col):
                if not isinstance(t, str):
                    raise SourceError(
                        f"{path}: row group {rg} row {i}: column {text_field!r} is "
                        f"{type(t).__name__}, expected a string"
                    )
                texts.append(t)
                locs.append((rg, i))
                if len(texts) >= batch_docs:
                    yield texts, locs
                    texts, locs = [], []
            if texts:
                yield texts, locs
        return
    with open(path, "rb") as f:
        f.seek(unit.start)
        data = f.read(unit.end - unit.start)
    if unit.format == "text-file":
        yield [decode_record("text", data, text_field, str(path))], [(0, len(data))]
        return
    texts, locs = [], []
    pos = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        end = n if nl < 0 else nl
        raw = data[pos:end]
        if not _is_blank(raw):
            off = unit.start + pos
            try:
                texts.append(decode_record(unit.format, raw, text_field, ""))
            except SourceError as exc:
                where = f"{path}:{_line_number(path, off)}"
                raise SourceError(f"{where}{exc}") from None
            locs.append((off, end - pos))
            if len(texts) >= batch_docs:
                yield texts, locs
                texts, locs = [], []
        pos = end + 1
    if texts:
        yield texts, locs


class SourceReader:
    """Random access to one document's text by (shard entry, location): the stream mode's reader.

    Keeps up to ``max_open`` files open and, for Parquet, the ``max_row_groups`` most recent row groups."""

    def __init__(self, root: Path, text_field: str, *, max_open: int = 64, max_row_groups: int = 4):
        self.root = Path(root)
        self.text_field = text_field
        self._files: OrderedDict[str, Any] = OrderedDict()
        self._groups: OrderedDict[tuple[str, int], list[Any]] = OrderedDict()
        self.max_open, self.max_row_groups = max_open, max_row_groups

    def _file(self, rel: str) -> Any:
        f = self._files.get(rel)
        if f is None:
            f = open(self.root / rel, "rb")  # noqa: SIM115 - kept open in the LRU, closed by close()
            self._files[rel] = f
            if len(self._files) > self.max_open:
                self._files.popitem(last=False)[1].close()
        else:
            self._files.move_to_end(rel)
        return f

    def text(self, source: str, fmt: str, loc0: int, loc1: int) -> str:
        if fmt == "parquet":
            key = (source, loc0)
            col = self._groups.get(key)
            if col is None:
                import pyarrow.parquet as pq

                col = (
                    pq.ParquetFile(self.root / source)
                    .read_row_group(loc0, columns=[self.text_field])
                    .column(self.text_field)
                    .to_pylist()
                )
                self._groups[key] = col
                if len(self._groups) > self.max_row_groups:
                    self._groups.popitem(last=False)
            else:
                self._groups.move_to_end(key)
            return col[loc1]
        f = self._file(source)
        f.seek(loc0)
        raw = f.read(loc1)
        if len(raw) != loc1:
            raise SourceError(
                f"{self.root / source}: short read at byte {loc0} ({len(raw)} of {loc1} bytes): "
                "the source file changed since pretokenize"
            )
        return decode_record(
            "text" if fmt == "text-file" else fmt, raw, self.text_field, f"{self.root / source}:byte {loc0}"
        )

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self._groups.clear()
