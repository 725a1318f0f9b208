"""Tokenizers from local files only (Hugging Face ``tokenizers``); never a hub download.

A tokenizer is named by a ``tokenizer.json`` file or a directory holding one (a Hugging Face model or
tokenizer directory). Its identity in the cache manifest is the SHA-256 of that file. Documents are
encoded without special tokens and each ends with the EOS token (``data.eos_token``), so packed blocks
carry document boundaries.

:func:`train_byte_bpe` builds a small byte-level BPE locally: what the tests, benchmarks and demos use
instead of downloading a real one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["encode_docs", "eos_id", "load_tokenizer", "tokenizer_file", "tokenizer_sha256", "train_byte_bpe"]


def tokenizer_file(path: Path) -> Path:
    """The ``tokenizer.json`` that ``path`` names (the file itself, or ``path/tokenizer.json``)."""
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise FileNotFoundError(
            f"{p}: no tokenizer.json there (a local tokenizer file or directory is needed; "
            "nothing is downloaded)"
        )
    return f


def tokenizer_sha256(path: Path) -> str:
    with open(tokenizer_file(path), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def load_tokenizer(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_file(path)))


def eos_id(tok: Tokenizer, eos_token: str) -> int | None:
    """The id of ``eos_token`` (None when ``eos_token`` is empty: no separator appended)."""
    if not eos_token:
        return None
    i = tok.token_to_id(eos_token)
    if i is None:
        raise ValueError(
            f"eos_token {eos_token!r} is not in the tokenizer's vocabulary; set data.eos_token to "
            'the tokenizer\'s end-of-document token, or to "" to append none'
        )
    return int(i)


def encode_docs(tok: Tokenizer, texts: list[str], eos: int | None) -> list[list[int]]:
    """Token ids of each text (no special tokens), each followed by ``eos`` when given. Encoding each
    document on its own makes the cache and stream modes produce identical ids."""
    encs = tok.encode_batch(texts, add_special_tokens=False)
    if eos is None:
        return [e.ids for e in encs]
    return [[*e.ids, eos] for e in encs]


def train_byte_bpe(
    texts: Iterable[str], out_dir: Path, *, vocab_size: int = 512, eos_token: str = "<|endoftext|>"
) -> Path:
    """Train a byte-level BPE on ``texts`` and save it as a Hugging Face tokenizer directory
    (``tokenizer.json`` + ``tokenizer_config.json``) in ``out_dir``. Returns the directory.

    The vocabulary is at most ``vocab_size`` (256 byte symbols + merges + ``eos_token`` as id 0); with a
    small corpus it may end up smaller."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": eos_token,
                "pad_token": eos_token,
                "model_max_length": 1_000_000,
            },
            indent=1,
        )
        + "\n"
    )
    return out
