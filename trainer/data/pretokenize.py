"""``ft-trainer pretokenize``: a corpus to a memory-mapped token cache (format in
:mod:`ft_trainer.data.cache`).

The corpus is cut into work units (:func:`ft_trainer.data.sources.plan_units`); a pool of worker processes
tokenizes one unit into one shard each. A shard is done when its marker ``shard-NNNNN.json`` exists: it
is written (atomically) after the shard's arrays, and records the unit it came from and the settings
(tokenizer hash, dtype, EOS, text field). A rerun after an interruption skips every shard whose marker
matches the current unit and settings and whose files have the recorded sizes, and redoes the rest; the
manifest is written last, so a cache without one is visibly incomplete.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from ft_trainer.data.cache import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    atomic_save_npy,
    atomic_write_json,
    file_entry,
)
from ft_trainer.data.sources import WorkUnit, discover, iter_unit_docs, plan_units
from ft_trainer.data.tokenization import encode_docs, eos_id, load_tokenizer, tokenizer_file, tokenizer_sha256

__all__ = ["PretokenizeOptions", "PretokenizeResult", "pretokenize", "token_dtype"]

log = logging.getLogger("ft_trainer.data.pretokenize")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocabulary <= 65536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class PretokenizeOptions:
    inputs: list[Path]
    out_dir: Path
    tokenizer: Path
    text_field: str = "text"
    text_unit: str = "line"
    eos_token: str = "<|endoftext|>"
    workers: int = 0  # 0: one per CPU, at most 8 and at most one per pending shard
    shard_bytes: int = 128 << 20
    index_only: bool = False
    max_shards: int | None = None  # stop after this many new shards (staged runs; tests)
    progress: bool = True


@dataclass
class PretokenizeResult:
    out_dir: Path
    total_shards: int
    skipped_shards: int
    done_shards: int
    complete: bool
    seconds: float
    manifest: dict[str, Any] | None = None
    new_tokens: int = 0
    shard_names: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ worker
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_path: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one worker process per core already
    _WORKER["tok"] = load_tokenizer(Path(tokenizer_path))


def _process_unit(job: dict[str, Any]) -> dict[str, Any]:
    """Tokenize one unit into one shard; returns the shard's manifest entry (also written as its marker)."""
    unit: WorkUnit = job["unit"]
    out = Path(job["out_dir"])
    tok = _WORKER.get("tok") or load_tokenizer(Path(job["tokenizer"]))
    _WORKER["tok"] = tok
    eos = job["settings"]["eos_id"]
    dtype = np.dtype(job["settings"]["dtype"])
    lengths: list[np.ndarray] = []
    chunks: list[np.ndarray] = []
    locs: list[np.ndarray] = []
    for texts, where in iter_unit_docs(Path(job["root"]), unit, job["settings"]["text_field"]):
        ids = encode_docs(tok, texts, eos)
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        lengths.append(lens)
        chunks.append(np.fromiter(chain.from_iterable(ids), dtype=np.uint32, count=int(lens.sum())))
        locs.append(np.asarray(where, dtype=np.int64).reshape(-1, 2))
    lens_all = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint32)
    max_id = int(tokens.max()) if tokens.size else -1
    if max_id >= np.iinfo(dtype).max + 1:
        raise ValueError(f"token id {max_id} does not fit {dtype}")
    offsets = np.zeros(lens_all.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens_all, out=offsets[1:])
    files: dict[str, dict[str, Any]] = {}
    arrays = [("docs", offsets), ("src", np.concatenate(locs) if locs else np.zeros((0, 2), dtype=np.int64))]
    if not job["settings"]["index_only"]:
        arrays.insert(0, ("tokens", tokens.astype(dtype)))
    for kind, arr in arrays:
        path = out / f"{unit.name}.{kind}.npy"
        atomic_save_npy(path, arr)
        files[kind] = file_entry(path)
    entry = {
        "name": unit.name,
        "unit": unit.identity(),
        "settings": job["settings"],
        "source": unit.source,
        "format": unit.format,
        "num_docs": int(lens_all.shape[0]),
        "num_tokens": int(tokens.shape[0]),
        "max_token_id": max_id,
        "files": files,
    }
    atomic_write_json(out / f"{unit.name}.json", entry)
    return entry


# ------------------------------------------------------------------------------------------------ driver
def _marker_ok(out: Path, unit: WorkUnit, settings: dict[str, Any]) -> dict[str, Any] | None:
    import json

    path = out / f"{unit.name}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if entry.get("unit") != unit.identity() or entry.get("settings") != settings:
        return None
    for rec in entry.get("files", {}).values():
        f = out / rec["file"]
        if not f.is_file() or f.stat().st_size != rec["bytes"]:
            return None
    return entry


def _cleanup(out: Path, names: set[str]) -> None:
    """Remove temporaries of an interrupted run and shards of units the corpus no longer has."""
    for f in out.glob(".shard-*.tmp"):
        f.unlink(missing_ok=True)
    for f in out.glob(".manifest.json.*.tmp"):
        f.unlink(missing_ok=True)
    for f in out.glob("shard-*"):
        if f.name.split(".")[0] not in names:
            f.unlink(missing_ok=True)


def _tokenize_units(
    jobs: list[dict[str, Any]],
    todo: list[WorkUnit],
    workers: int,
    tok_file: Path,
    entries: dict[int, dict[str, Any]],
    *,
    progress: bool,
) -> int:
    """Tokenize the pending shards (in this process, or a spawn pool of ``workers``), adding each
    finished shard's entry to ``entries``; the number of new tokens."""
    new_tokens = 0
    from tqdm import tqdm

    with tqdm(
        total=sum(u.size_bytes for u in todo),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"pretokenize {len(todo)} shard(s)",
        disable=not progress,
        dynamic_ncols=True,
    ) as bar:
        if workers == 1:
            for job in jobs:
                e = _process_unit(job)
                entries[job["unit"].index] = e
                new_tokens += e["num_tokens"]
                bar.update(job["unit"].size_bytes)
        elif jobs:
            ctx = mp.get_context("spawn")
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(str(tok_file),))
            try:
                by_name = {u.name: u for u in todo}
                for e in pool.imap_unordered(_process_unit, jobs):
                    u = by_name[e["name"]]
                    entries[u.index] = e
                    new_tokens += e["num_tokens"]
                    bar.update(u.size_bytes)
                pool.close()
            except BaseException:
                pool.terminate()
                raise
            finally:
                pool.join()
    return new_tokens


def pretokenize(opts: PretokenizeOptions) -> PretokenizeResult:
    """Build (or resume) the cache. Raises :class:`ft_trainer.data.sources.SourceError`,
    ``FileNotFoundError`` or ``ValueError`` on bad input; ``KeyboardInterrupt`` propagates after the
    pool is stopped (finished shards stay and a rerun resumes)."""
    t0 = time.perf_counter()
    tok_file = tokenizer_file(opts.tokenizer)
    tok = load_tokenizer(tok_file)
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    eos = eos_id(tok, opts.eos_token)
    dtype = token_dtype(vocab)
    settings = {
        "tokenizer_sha256": tokenizer_sha256(tok_file),
        "dtype": dtype.name,
        "eos_id": eos,
        "text_field": opts.text_field,
        "index_only": opts.index_only,
        "format_version": FORMAT_VERSION,
    }
    root, files = discover(opts.inputs)
    units = plan_units(root, files, text_unit=opts.text_unit, shard_bytes=opts.shard_bytes)
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _cleanup(out, {u.name for u in units})

    entries: dict[int, dict[str, Any]] = {}
    pending: list[WorkUnit] = []
    for u in units:
        e = _marker_ok(out, u, settings)
        if e is None:
            pending.append(u)
        else:
            entries[u.index] = e
    skipped = len(entries)
    if pending:
        (out / MANIFEST).unlink(missing_ok=True)  # the cache is incomplete until every shard is done
    todo = pending if opts.max_shards is None else pending[: max(0, opts.max_shards)]
    if skipped:
        log.info("pretokenize: %d of %d shards already done, resuming", skipped, len(units))

    jobs: list[dict[str, Any]] = [
        {"unit": u, "root": str(root), "out_dir": str(out), "tokenizer": str(tok_file), "settings": settings}
        for u in todo
    ]
    workers = opts.workers or min(os.cpu_count() or 1, 8)
    workers = max(1, min(workers, len(jobs)))
    new_tokens = _tokenize_units(jobs, todo, workers, tok_file, entries, progress=opts.progress)

    complete = len(entries) == len(units)
    manifest = None
    if complete:
        shards = [entries[i] for i in range(len(units))]
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "complete": True,
            "created_unix_s": time.time(),
            "has_tokens": not opts.index_only,
            "dtype": dtype.name,
            "num_docs": sum(s["num_docs"] for s in shards),
            "num_tokens": sum(s["num_tokens"] for s in shards),
            "max_token_id": max((s["max_token_id"] for s in shards), default=-1),
            "tokenizer": {
                "file": str(tok_file.resolve()),
                "sha256": settings["tokenizer_sha256"],
                "vocab_size": vocab,
                "eos_token": opts.eos_token,
                "eos_id": eos,
            },
            "source": {
                "root": str(root),
                "text_field": opts.text_field,
                "text_unit": opts.text_unit,
                "files": len(files),
            },
            "shards": shards,
        }
        atomic_write_json(out / MANIFEST, manifest)
    return PretokenizeResult(
        out_dir=out,
        total_shards=len(units),
        skipped_shards=skipped,
        done_shards=len(todo),
        complete=complete,
        seconds=time.perf_counter() - t0,
        manifest=manifest,
        new_tokens=new_tokens,
        shard_names=[u.name for u in todo],
    )
