"""The token cache on disk: format, atomic writes, verification and memory-mapped reading. No torch.

Layout of a cache directory (format version 1)::

    manifest.json    written last, atomically: the cache is complete iff it exists
    S.tokens.npy     token ids of the shard's documents, concatenated (uint16 or uint32); absent in
                     an index-only cache (stream mode)
    S.docs.npy       int64 (num_docs + 1,): document d spans tokens [docs[d], docs[d+1])
    S.src.npy        int64 (num_docs, 2): where document d lives in the source file (JSONL/text: byte
                     offset, byte length of its line; Parquet: row group, row in group)
    S.json           the shard's manifest entry: written after its .npy files, it marks the shard done
                     for a resumed ``pretokenize``

where ``S`` is ``shard-`` + 16 hex digits of SHA-1 over the shard's source file, format and range (so a
shard keeps its name when other files change). The manifest lists shards in corpus order: global
document ids number the documents shard by shard in that order.

Every file is written to a temporary name, fsynced and renamed. The manifest records per file its size,
its full SHA-256 (checked with ``gate --deep``) and a sampled SHA-256 over eight 16 KiB windows spread
over the file (checked by every ``gate``), and per shard the document and token counts and the largest
token id.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "CacheError",
    "CacheIndex",
    "CacheTokens",
    "atomic_save_npy",
    "atomic_write_json",
    "file_entry",
    "load_manifest",
    "npy_header",
    "sample_sha256",
    "verify_cache",
]

FORMAT = "gpu-triage-token-cache"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SAMPLE_WINDOWS = 8
SAMPLE_WINDOW_BYTES = 16 * 1024
FILE_KINDS = ("tokens", "docs", "src")


class CacheError(RuntimeError):
    """The cache is missing, incomplete or inconsistent; the message says which file and what to do."""


# ---------------------------------------------------------------------------------------------- writing
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, and rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    """``numpy.save`` through a temporary file and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------- checksums
def sample_windows(size_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of the sampled windows of a file of ``size_bytes``: the whole file when small,
    else eight 16 KiB windows evenly spread from the first byte to the last (header and tail included)."""
    if size_bytes <= SAMPLE_WINDOWS * SAMPLE_WINDOW_BYTES:
        return [(0, size_bytes)]
    last = size_bytes - SAMPLE_WINDOW_BYTES
    offsets = sorted({round(i * last / (SAMPLE_WINDOWS - 1)) for i in range(SAMPLE_WINDOWS)})
    return [(o, SAMPLE_WINDOW_BYTES) for o in offsets]


def sample_sha256(path: Path, size_bytes: int | None = None) -> str:
    size = os.path.getsize(path) if size_bytes is None else size_bytes
    h = hashlib.sha256()
    h.update(str(size).encode())
    with open(path, "rb") as f:
        for off, n in sample_windows(size):
            f.seek(off)
            h.update(f.read(n))
    return h.hexdigest()


def full_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """The manifest record of one file: name, bytes, full and sampled SHA-256."""
    size = os.path.getsize(path)
    return {
        "file": Path(path).name,
        "bytes": size,
        "sha256": full_sha256(path),
        "sample_sha256": sample_sha256(path, size),
    }


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) from a .npy header, without reading the data."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        if fortran and len(shape) > 1:
            raise ValueError("Fortran-ordered array")
        return tuple(shape), np.dtype(dtype), f.tell()


# ---------------------------------------------------------------------------------------------- reading
def load_manifest(cache_dir: Path) -> dict[str, Any]:
    """The manifest of a complete cache, or :class:`CacheError` saying why there is none."""
    cache_dir = Path(cache_dir)
    path = cache_dir / MANIFEST
    if not cache_dir.is_dir():
        raise CacheError(
            f"{cache_dir}: no such cache directory: run `ft-trainer pretokenize --config JOB.toml`"
        )
    if not path.is_file():
        done = len(list(cache_dir.glob("shard-*.json")))
        raise CacheError(
            f"{path}: missing: the cache is incomplete ({done} shard(s) finished, no manifest): an "
            "interrupted "
            "pretokenize? rerun `ft-trainer pretokenize` with the same arguments to resume"
        )
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CacheError(f"{path}: unreadable manifest ({exc}): rebuild the cache with pretokenize") from None
    if m.get("format") != FORMAT:
        raise CacheError(f"{path}: not a gpu-triage token cache manifest (format={m.get('format')!r})")
    if m.get("format_version") != FORMAT_VERSION:
        raise CacheError(
            f"{path}: format_version {m.get('format_version')!r}, this trainer reads {FORMAT_VERSION}: "
            "rebuild the cache with this version's pretokenize"
        )
    if not m.get("complete", False):
        raise CacheError(f"{path}: manifest marks the cache incomplete: rerun pretokenize to finish it")
    return m


@dataclass
class CacheIndex:
    """A cache's manifest plus its document index: the input of the packing plan.

    ``doc_lengths[d]`` is the token count of global document ``d`` (documents numbered shard by shard,
    in manifest order)."""

    cache_dir: Path
    manifest: dict[str, Any]
    doc_offsets: list[np.ndarray]  # per shard, int64 (n+1,), memory-mapped
    shard_first_doc: np.ndarray  # int64 (num_shards + 1,)
    doc_lengths: np.ndarray  # int64 (num_docs,)
    problems: list[str] = field(default_factory=list)

    @property
    def num_docs(self) -> int:
        return int(self.manifest["num_docs"])

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    @property
    def has_tokens(self) -> bool:
        return bool(self.manifest.get("has_tokens", True))

    @property
    def shards(self) -> list[dict[str, Any]]:
        return list(self.manifest["shards"])

    def shard_of(self, doc_id: int) -> tuple[int, int]:
        """(shard index, document index within the shard) of a global document id."""
        s = int(np.searchsorted(self.shard_first_doc, doc_id, side="right")) - 1
        return s, doc_id - int(self.shard_first_doc[s])

    @classmethod
    def open(cls, cache_dir: Path) -> CacheIndex:
        """Load the manifest and the document index; raise :class:`CacheError` on the first problem."""
        idx = check_cache(cache_dir)
        if idx.problems:
            raise CacheError("; ".join(idx.problems))
        return idx


def _entry_problems(
    cache_dir: Path,
    shard: dict[str, Any],
    kind: str,
    want_shape: tuple[int, ...],
    want_dtype: np.dtype | None,
    deep: bool,
) -> list[str]:
    rec = shard["files"][kind]
    path = cache_dir / rec["file"]
    if not path.is_file():
        return [f"{path}: missing (listed in the manifest): the cache is incomplete; rerun pretokenize"]
    size = path.stat().st_size
    if size != rec["bytes"]:
        what = "truncated" if size < rec["bytes"] else "longer than recorded"
        return [
            f"{path}: {size} bytes, manifest says {rec['bytes']}: the file is {what} (an interrupted copy "
            "or a concurrent writer?); copy it again or rerun pretokenize into a fresh directory"
        ]
    try:
        shape, dtype, _ = npy_header(path)
    except (OSError, ValueError) as exc:
        return [f"{path}: bad .npy header ({exc}): the file is corrupt; rerun pretokenize"]
    problems = []
    if shape != want_shape:
        problems.append(
            f"{path}: header shape {shape}, manifest implies {want_shape}: the file does not belong "
            "to this manifest"
        )
    if want_dtype is not None and dtype != want_dtype:
        problems.append(f"{path}: header dtype {dtype}, manifest says {want_dtype}")
    if deep:
        if full_sha256(path) != rec["sha256"]:
            problems.append(
                f"{path}: SHA-256 differs from the manifest (--deep): the content changed; rerun pretokenize"
            )
    elif sample_sha256(path, size) != rec["sample_sha256"]:
        problems.append(
            f"{path}: sampled checksum differs from the manifest: the content changed; rerun "
            "pretokenize (or run gate --deep for a full re-hash)"
        )
    return problems


def check_cache(cache_dir: Path, *, deep: bool = False) -> CacheIndex:
    """Verify a cache against its manifest and load its document index, collecting every problem.

    Checks: manifest present, complete and of this format version; every listed file present with the
    recorded size, a .npy header of the recorded dtype and shape, and the sampled SHA-256 (the full
    SHA-256 with ``deep``); each shard's document offsets start at 0, never decrease and end at its token
    count; shard counts add up to the totals. ``deep`` also recomputes the largest token id per shard.
    Raises :class:`CacheError` only when there is no usable manifest."""
    cache_dir = Path(cache_dir)
    m = load_manifest(cache_dir)
    problems: list[str] = []
    token_dtype = np.dtype(m["dtype"])
    has_tokens = bool(m.get("has_tokens", True))
    offsets: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    firsts = [0]
    tot_docs = tot_tokens = 0
    max_id = -1
    for shard in m["shards"]:
        n, t = int(shard["num_docs"]), int(shard["num_tokens"])
        tot_docs += n
        tot_tokens += t
        max_id = max(max_id, int(shard["max_token_id"]))
        firsts.append(firsts[-1] + n)
        kinds = [("docs", (n + 1,), np.dtype(np.int64)), ("src", (n, 2), np.dtype(np.int64))]
        if has_tokens:
            kinds.insert(0, ("tokens", (t,), token_dtype))
        shard_problems: list[str] = []
        bad_kinds: set[str] = set()
        for kind, shape, dt in kinds:
            if kind not in shard["files"]:
                shard_problems.append(f"{shard['name']}: manifest lists no {kind} file")
                bad_kinds.add(kind)
                continue
            found = _entry_problems(cache_dir, shard, kind, shape, dt, deep)
            if found:
                bad_kinds.add(kind)
                shard_problems += found
        if "docs" not in bad_kinds:
            off = np.load(cache_dir / shard["files"]["docs"]["file"], mmap_mode="r")
            lens = np.diff(off)
            if off.shape[0] == 0 or off[0] != 0 or off[-1] != t or (lens.size and lens.min() < 0):
                shard_problems.append(
                    f"{cache_dir / shard['files']['docs']['file']}: document offsets are not a valid index "
                    f"(first {int(off[0]) if off.size else None}, last {int(off[-1]) if off.size else None}, "
                    f"expected 0..{t} non-decreasing)"
                )
            offsets.append(off)
            lengths.append(lens)
        else:
            offsets.append(np.zeros(n + 1, dtype=np.int64))
            lengths.append(np.zeros(n, dtype=np.int64))
        if deep and has_tokens and not shard_problems and t:
            tok = np.load(cache_dir / shard["files"]["tokens"]["file"], mmap_mode="r")
            real_max = int(tok.max())
            if real_max != int(shard["max_token_id"]):
                shard_problems.append(
                    f"{shard['name']}: largest token id is {real_max}, manifest says "
                    f"{shard['max_token_id']} (--deep)"
                )
        problems += shard_problems
    if tot_docs != int(m["num_docs"]) or tot_tokens != int(m["num_tokens"]):
        problems.append(
            f"{cache_dir / MANIFEST}: shards add up to {tot_docs} documents / {tot_tokens} tokens, "
            f"the totals say {m['num_docs']} / {m['num_tokens']}"
        )
    if m["shards"] and max_id != int(m["max_token_id"]):
        problems.append(
            f"{cache_dir / MANIFEST}: shards' largest token id is {max_id}, total says {m['max_token_id']}"
        )
    return CacheIndex(
        cache_dir=cache_dir,
        manifest=m,
        doc_offsets=offsets,
        shard_first_doc=np.asarray(firsts, dtype=np.int64),
        doc_lengths=np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64),
        problems=problems,
    )


def verify_cache(cache_dir: Path, *, deep: bool = False) -> list[str]:
    """Every problem :func:`check_cache` finds, as messages (empty: the cache is sound)."""
    try:
        return check_cache(cache_dir, deep=deep).problems
    except CacheError as exc:
        return [str(exc)]


class CacheTokens:
    """Token ids of any document of a cache, from memory-mapped shard files (cache mode)."""

    def __init__(self, index: CacheIndex):
        if not index.has_tokens:
            raise CacheError(
                f"{index.cache_dir}: index-only cache (built with --index-only): it has no token "
                "ids; use data.mode = 'stream' or rebuild without --index-only"
            )
        self.index = index
        self._tokens = [
            np.load(index.cache_dir / s["files"]["tokens"]["file"], mmap_mode="r") for s in index.shards
        ]

    def doc_tokens(self, doc_id: int) -> np.ndarray:
        s, d = self.index.shard_of(doc_id)
        off = self.index.doc_offsets[s]
        return self._tokens[s][int(off[d]) : int(off[d + 1])]
