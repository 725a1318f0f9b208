"""Packed micro-batches for one rank and epoch, in cache mode or stream mode. No torch: batches are numpy
int64 arrays of shape (micro_batch, seq_len); ``torch.from_numpy`` turns one into a tensor without a copy.

Both modes share the cache's document index (so the plan is identical) and differ only in where a
document's token ids come from:
- ``cache``: memory-mapped token ids written by ``pretokenize``;
- ``stream``: the document's text read from the corpus directory (``data.source_dir``, e.g. on NFS) at its
  recorded location and tokenized on the spot. The index may be index-only (``pretokenize
  --index-only``). A document whose fresh token count differs from the index stops the run: the corpus
  or tokenizer changed since the index was built, and packing would drift.

Typical use by ``train`` (every rank)::

    data = JobData.open(cfg)
    for epoch in range(start_epoch, cfg.epochs):
        plan = data.epoch_plan(epoch)
        eq = equalize_epoch(int(plan.local_micro_batches[rank]), grad_accum=..., micro_batch=...,
                            seq_len=..., epoch=epoch, expected=int(plan.micro_batches[rank]))
        count = eq.micro_batches if cfg.data.equalize else int(plan.micro_batches[rank])
        for mb in data.rank_stream(plan, rank).iter_micro_batches(count, start=resume_micro_batch):
            ...
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from ft_trainer.config import JobConfig
from ft_trainer.data.cache import CacheError, CacheIndex, CacheTokens
from ft_trainer.planning.plan import EpochPlan, build_epoch_plan

__all__ = ["DocSource", "JobData", "RankStream", "StreamTokens"]


class DocSource(Protocol):
    def doc_tokens(self, doc_id: int) -> np.ndarray: ...


class StreamTokens:
    """Token ids of a document tokenized from its source text on demand (stream mode)."""

    def __init__(self, index: CacheIndex, source_root: Path, tokenizer: Path, text_field: str | None = None):
        from ft_trainer.data.sources import SourceReader
        from ft_trainer.data.tokenization import load_tokenizer, tokenizer_sha256

        m = index.manifest
        sha = tokenizer_sha256(tokenizer)
        if sha != m["tokenizer"]["sha256"]:
            raise CacheError(
                f"{tokenizer}: tokenizer SHA-256 {sha[:12]} differs from the one the index was built "
                f"with ({m['tokenizer']['sha256'][:12]}, {m['tokenizer']['file']}): the stream "
                "would tokenize differently; rebuild the index or point model.tokenizer at it"
            )
        self.index = index
        self.tok = load_tokenizer(tokenizer)
        self.eos = m["tokenizer"]["eos_id"]
        self.reader = SourceReader(source_root, text_field or m["source"]["text_field"])
        self._src = [
            np.load(index.cache_dir / s["files"]["src"]["file"], mmap_mode="r") for s in index.shards
        ]

    def doc_tokens(self, doc_id: int) -> np.ndarray:
        s, d = self.index.shard_of(doc_id)
        shard = self.index.shards[s]
        loc = self._src[s][d]
        text = self.reader.text(shard["source"], shard["format"], int(loc[0]), int(loc[1]))
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if self.eos is not None:
            ids.append(self.eos)
        want = int(self.index.doc_lengths[doc_id])
        if len(ids) != want:
            raise CacheError(
                f"{self.reader.root / shard['source']}: document at {tuple(int(x) for x in loc)} "
                f"tokenizes to {len(ids)} tokens, the index says {want}: the corpus changed since "
                "pretokenize; rebuild the index"
            )
        return np.asarray(ids, dtype=np.int64)

    def close(self) -> None:
        self.reader.close()


class RankStream:
    """One rank's documents of one epoch, packed: block ``b`` is tokens ``[b L, (b+1) L)`` of the
    concatenation of the rank's documents in plan order (L = seq_len)."""

    def __init__(
        self,
        source: DocSource,
        doc_ids: np.ndarray,
        doc_lengths: np.ndarray,
        seq_len: int,
        micro_batch: int = 1,
    ):
        self.source = source
        self.doc_ids = doc_ids
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.cum = np.concatenate(([0], np.cumsum(doc_lengths, dtype=np.int64)))

    @property
    def num_blocks(self) -> int:
        return int(self.cum[-1]) // self.seq_len

    @property
    def num_micro_batches(self) -> int:
        return self.num_blocks // self.micro_batch

    def iter_blocks(self, start: int = 0, count: int | None = None) -> Iterator[np.ndarray]:
        """Blocks ``start .. start+count-1`` as int64 arrays of ``seq_len`` tokens."""
        L = self.seq_len
        stop = self.num_blocks if count is None else start + count
        if start < 0 or stop > self.num_blocks:
            raise IndexError(f"blocks {start}..{stop} outside 0..{self.num_blocks}")
        pos = start * L
        k = int(np.searchsorted(self.cum, pos, side="right")) - 1
        cur: np.ndarray | None = None
        cur_k = -1
        for _ in range(start, stop):
            out = np.empty(L, dtype=np.int64)
            filled = 0
            while filled < L:
                end_k = int(self.cum[k + 1])
                if pos >= end_k:  # past this document (or an empty one)
                    k += 1
                    continue
                if cur_k != k:
                    cur = self.source.doc_tokens(int(self.doc_ids[k]))
                    cur_k = k
                assert cur is not None
                inner = pos - int(self.cum[k])
                take = min(L - filled, end_k - pos)
                out[filled : filled + take] = cur[inner : inner + take]
                filled += take
                pos += take
            yield out

    def iter_micro_batches(self, count: int | None = None, start: int = 0) -> Iterator[np.ndarray]:
        """Micro-batches ``start .. start+count-1`` (default: all), each int64 (micro_batch, seq_len).
        ``count`` is what equalize decided; ``start`` resumes mid-epoch."""
        mb = self.micro_batch
        n = self.num_micro_batches - start if count is None else count - start
        if n < 0 or start + n > self.num_micro_batches:
            raise IndexError(f"micro-batches {start}..{start + n} outside 0..{self.num_micro_batches}")
        blocks = self.iter_blocks(start * mb, n * mb)
        for _ in range(n):
            yield np.stack([next(blocks) for _ in range(mb)])


class JobData:
    """The data of a job: its cache index, its plan per epoch, and the packed stream of any rank."""

    def __init__(self, cfg: JobConfig, index: CacheIndex, mode: str | None = None):
        self.cfg = cfg
        self.index = index
        self.mode = mode or cfg.data.mode
        self.params = cfg.packing_params()
        self._source: DocSource | None = None
        self._plans: dict[int, EpochPlan] = {}

    @classmethod
    def open(cls, cfg: JobConfig, mode: str | None = None) -> JobData:
        """Open and verify (sizes, headers, sampled checksums) the job's cache; :class:`CacheError` if
        unsound."""
        return cls(cfg, CacheIndex.open(cfg.data.cache_dir), mode)

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` - the very function the gate evaluates."""
        plan = self._plans.get(epoch)
        if plan is None:
            plan = build_epoch_plan(self.index.doc_lengths, self.params, epoch)
            self._plans = {epoch: plan}  # keep one epoch: the order array is 8 bytes per document
        return plan

    def source(self) -> DocSource:
        if self._source is None:
            if self.mode == "cache":
                self._source = CacheTokens(self.index)
            else:
                d = self.cfg.data
                root = d.source_dir or Path(self.index.manifest["source"]["root"])
                if self.cfg.model.tokenizer is None:
                    raise CacheError(
                        "stream mode needs model.tokenizer (the tokenizer the index was built with)"
                    )
                self._source = StreamTokens(self.index, root, self.cfg.model.tokenizer, d.text_field)
        return self._source

    def rank_stream(self, plan: EpochPlan, rank: int) -> RankStream:
        if not 0 <= rank < plan.world_size:
            raise IndexError(f"rank {rank} outside 0..{plan.world_size - 1}")
        docs = plan.rank_docs(rank)
        return RankStream(
            self.source(), docs, self.index.doc_lengths[docs], self.params.seq_len, self.params.micro_batch
        )
