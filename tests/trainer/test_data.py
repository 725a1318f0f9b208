"""Packed micro-batches: cache and stream modes give identical blocks; blocks are the rank's documents
concatenated in plan order; resume from the middle; the stream mode notices a changed corpus."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ft_trainer.config import load_config
from ft_trainer.data.cache import CacheError
from ft_trainer.data.data import JobData
from ft_trainer.devtools.synthetic import synthetic_texts, write_text_lines
from tests.trainer.conftest import JobWriter, build_corpus, concat_rank_tokens, make_cache


def test_cache_and_stream_modes_produce_identical_blocks(write_job: JobWriter) -> None:
    cfg = load_config(
        write_job(data={"seq_len": 48, "micro_batch": 3, "grad_accum": 2}, cluster={"gpus_per_node": 3})
    )
    cache, stream = JobData.open(cfg, mode="cache"), JobData.open(cfg, mode="stream")
    compared = 0
    for epoch in range(2):
        pc, ps = cache.epoch_plan(epoch), stream.epoch_plan(epoch)
        assert np.array_equal(pc.order, ps.order) and np.array_equal(pc.micro_batches, ps.micro_batches)
        for rank in range(3):
            n = int(pc.micro_batches[rank])
            a = list(cache.rank_stream(pc, rank).iter_micro_batches(n))
            b = list(stream.rank_stream(ps, rank).iter_micro_batches(n))
            assert len(a) == len(b) == n > 0
            for x, y in zip(a, b, strict=True):
                assert x.shape == (3, 48) and x.dtype == np.int64
                assert np.array_equal(x, y)
            compared += n
    assert compared > 50


def test_blocks_are_the_rank_documents_concatenated(write_job: JobWriter) -> None:
    cfg = load_config(write_job(data={"seq_len": 40, "micro_batch": 2}))
    data = JobData.open(cfg)
    plan = data.epoch_plan(1)
    src = data.source()
    seen_docs: list[np.ndarray] = []
    for rank in range(2):
        docs = plan.rank_docs(rank)
        seen_docs.append(docs)
        stream = data.rank_stream(plan, rank)
        flat = concat_rank_tokens(src.doc_tokens, docs)
        assert flat.size == int(plan.rank_tokens[rank])
        blocks = np.concatenate(list(stream.iter_blocks()))
        assert np.array_equal(blocks, flat[: blocks.size])
        assert stream.num_blocks == flat.size // 40
        assert stream.num_micro_batches == int(plan.local_micro_batches[rank])
    # every document read by exactly one rank in the epoch
    assert sorted(np.concatenate(seen_docs).tolist()) == list(range(data.index.num_docs))


def test_resume_mid_epoch_matches_the_uninterrupted_stream(write_job: JobWriter) -> None:
    cfg = load_config(write_job(data={"seq_len": 32, "micro_batch": 2}))
    data = JobData.open(cfg)
    plan = data.epoch_plan(0)
    stream = data.rank_stream(plan, 1)
    n = int(plan.micro_batches[1])
    full = list(stream.iter_micro_batches(n))
    for start in (0, 1, n // 2, n - 1):
        tail = list(data.rank_stream(plan, 1).iter_micro_batches(n, start=start))
        assert len(tail) == n - start
        assert all(np.array_equal(a, b) for a, b in zip(full[start:], tail, strict=True))
    with pytest.raises(IndexError):
        next(stream.iter_micro_batches(stream.num_micro_batches + 1))


def test_stream_mode_from_an_index_only_cache(
    tmp_path: Path, write_job: JobWriter, corpus: tuple[Path, list[str]], tokenizer_dir: Path
) -> None:
    idx = make_cache(corpus[0], tmp_path / "index", tokenizer_dir, index_only=True)
    full = load_config(write_job())
    cfg = load_config(write_job(name="s.toml", data={"cache_dir": str(idx), "mode": "stream"}))
    a, b = JobData.open(full), JobData.open(cfg)
    pa, pb = a.epoch_plan(0), b.epoch_plan(0)
    x = list(a.rank_stream(pa, 0).iter_micro_batches(int(pa.micro_batches[0])))
    y = list(b.rank_stream(pb, 0).iter_micro_batches(int(pb.micro_batches[0])))
    assert all(np.array_equal(u, v) for u, v in zip(x, y, strict=True)) and len(x) == len(y)
    with pytest.raises(CacheError, match="index-only"):
        JobData.open(cfg, mode="cache").source()


def test_stream_mode_refuses_a_changed_corpus(
    tmp_path: Path, tokenizer_dir: Path, write_job: JobWriter
) -> None:
    corpus = tmp_path / "corpus"
    build_corpus(corpus, n_docs=90)
    cache = make_cache(corpus, tmp_path / "c", tokenizer_dir)
    cfg = load_config(write_job(data={"cache_dir": str(cache), "source_dir": str(corpus), "mode": "stream"}))
    # the same file name with other documents: locations now point into different text
    texts = synthetic_texts(30, seed=1234, mean_words=40)
    write_text_lines(corpus / "b.txt", texts)
    data = JobData.open(cfg)
    plan = data.epoch_plan(0)
    with pytest.raises(CacheError, match="the corpus changed since pretokenize"):
        for r in range(2):
            for _ in data.rank_stream(plan, r).iter_micro_batches():
                pass


def test_stream_mode_needs_the_index_tokenizer(
    tmp_path: Path, write_job: JobWriter, corpus: tuple[Path, list[str]]
) -> None:
    from ft_trainer.data.tokenization import train_byte_bpe

    other = train_byte_bpe(synthetic_texts(200, seed=4), tmp_path / "other", vocab_size=300)
    cfg = load_config(write_job(model={"tokenizer": str(other)}, data={"mode": "stream"}))
    with pytest.raises(CacheError, match=r"SHA-256 .* differs from the one the index was built with"):
        JobData.open(cfg).source()


def test_source_dir_can_move(tmp_path: Path, write_job: JobWriter, corpus: tuple[Path, list[str]]) -> None:
    """The index records paths relative to the corpus root: the stream reads from data.source_dir, which may
    be another mount of the same files."""
    moved = tmp_path / "mnt" / "corpus"
    shutil.copytree(corpus[0], moved)
    cfg = load_config(write_job(data={"mode": "stream", "source_dir": str(moved)}))
    data = JobData.open(cfg)
    plan = data.epoch_plan(0)
    assert sum(1 for _ in data.rank_stream(plan, 0).iter_micro_batches(int(plan.micro_batches[0]))) > 0
