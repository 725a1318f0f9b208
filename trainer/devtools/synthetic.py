"""Deterministic synthetic corpora for tests, benchmarks and demos (nothing is downloaded).

Texts are sentences of pseudo-words drawn from a fixed seeded lexicon; document lengths follow a
log-normal spread, like real fine-tuning corpora (many short documents, a few long ones).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["lexicon", "synthetic_texts", "write_jsonl", "write_parquet", "write_text_lines"]


def lexicon(size: int = 400, seed: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    p = np.linspace(2.0, 0.2, letters.size)
    p /= p.sum()
    words: set[str] = set()
    while len(words) < size:
        n = int(rng.integers(1, 9))
        words.add("".join(rng.choice(letters, size=n, p=p)))
    return sorted(words)


def synthetic_texts(
    n_docs: int, seed: int = 0, *, mean_words: float = 60.0, sigma: float = 0.9, max_words: int = 4000
) -> list[str]:
    """``n_docs`` documents with log-normal word counts (median ``mean_words``), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    words = np.array(lexicon())
    counts = np.clip(rng.lognormal(np.log(mean_words), sigma, n_docs).astype(np.int64), 1, max_words)
    flat = rng.integers(0, words.size, int(counts.sum()))
    out, pos = [], 0
    for c in counts:
        seg = words[flat[pos : pos + c]]
        pos += int(c)
        out.append(" ".join(seg) + ".")
    return out


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, field: t}) + "\n")
    return path


def write_text_lines(path: Path, texts: list[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(t.replace("\n", " ") + "\n")
    return path


def write_parquet(path: Path, texts: list[str], field: str = "text", row_group_size: int = 1000) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({field: texts}), path, row_group_size=row_group_size)
    return path
