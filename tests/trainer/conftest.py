"""Fixtures for the trainer's data tests: a locally trained byte-level BPE (vocabulary 512, matching the
``tiny-qwen3`` preset), small corpora in every supported format, caches built by the real
``pretokenize``, and a job-file writer. Nothing is downloaded."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ft_trainer.data.pretokenize import PretokenizeOptions, pretokenize
from ft_trainer.data.tokenization import train_byte_bpe
from ft_trainer.devtools.synthetic import synthetic_texts, write_jsonl, write_parquet, write_text_lines

TEXTS_SEED = 5
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that build a tokenizer need the ``tokenizers`` package (the trainer extra): mark them
    ``trainer`` so ``make test-fast`` (base install) deselects them."""
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents and "tokenizer_dir" in getattr(
            item, "fixturenames", ()
        ):
            item.add_marker(pytest.mark.trainer)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    return train_byte_bpe(synthetic_texts(1500, seed=99), out, vocab_size=512)


def build_corpus(root: Path, n_docs: int = 900, seed: int = TEXTS_SEED) -> list[str]:
    """JSONL + text lines + Parquet under ``root``; returns the texts in corpus (document) order."""
    texts = synthetic_texts(n_docs, seed=seed, mean_words=40)
    a, b = n_docs // 3, 2 * n_docs // 3
    write_jsonl(root / "a.jsonl", texts[:a])
    write_text_lines(root / "b.txt", texts[a:b])
    write_parquet(root / "sub" / "c.parquet", texts[b:], row_group_size=100)
    return texts


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("corpus")
    return root, build_corpus(root)


def make_cache(corpus_dir: Path, out: Path, tokenizer: Path, **kw: Any) -> Path:
    opts = PretokenizeOptions(
        inputs=[corpus_dir],
        out_dir=out,
        tokenizer=tokenizer,
        workers=1,
        progress=False,
        shard_bytes=kw.pop("shard_bytes", 16 << 10),
        **kw,
    )
    res = pretokenize(opts)
    assert res.complete
    return out


@pytest.fixture(scope="session")
def cache_dir(
    tmp_path_factory: pytest.TempPathFactory, corpus: tuple[Path, list[str]], tokenizer_dir: Path
) -> Path:
    return make_cache(corpus[0], tmp_path_factory.mktemp("cache") / "cache", tokenizer_dir)


@pytest.fixture
def cache_copy(tmp_path: Path, cache_dir: Path) -> Path:
    """A private copy of the session cache, for tests that damage it."""
    dst = tmp_path / "cache"
    shutil.copytree(cache_dir, dst)
    return dst


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


JobWriter = Callable[..., Path]


@pytest.fixture
def write_job(
    tmp_path: Path, cache_dir: Path, tokenizer_dir: Path, corpus: tuple[Path, list[str]]
) -> JobWriter:
    """``write_job(data={...}, cluster={...}, ...)`` writes a valid tiny job TOML with the given overrides
    (a value of None removes the key) and returns its path."""

    def write(name: str = "job.toml", **sections: dict[str, Any]) -> Path:
        base: dict[str, dict[str, Any]] = {
            "job": {"name": "tiny", "seed": 3, "epochs": 2},
            "model": {"preset": "tiny-qwen3", "tokenizer": str(tokenizer_dir)},
            "data": {
                "cache_dir": str(cache_dir),
                "source_dir": str(corpus[0]),
                "seq_len": 32,
                "micro_batch": 2,
                "grad_accum": 2,
            },
            "cluster": {"nodes": 1, "gpus_per_node": 2, "launcher": "local"},
            "checkpoint": {"dir": str(tmp_path / "ckpt")},
        }
        for sec, kv in sections.items():
            base.setdefault(sec, {})
            for k, v in kv.items():
                if v is None:
                    base[sec].pop(k, None)
                else:
                    base[sec][k] = v
        lines = []
        for sec, kv in base.items():
            lines.append(f"[{sec}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in kv.items()]
            lines.append("")
        path = tmp_path / name
        path.write_text("\n".join(lines))
        return path

    return write


def concat_rank_tokens(doc_tokens: Callable[[int], np.ndarray], doc_ids: np.ndarray) -> np.ndarray:
    parts = [np.asarray(doc_tokens(int(d)), dtype=np.int64) for d in doc_ids]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
