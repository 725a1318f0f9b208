"""A Hugging Face Trainer job that reports to the watchdog: one callback.

Runs anywhere, CPU included (a tiny random GPT-2 and a tokenizer built here - nothing from a hub)::

    export GPU_WATCHDOG_PROGRESS_DIR=/tmp/progress      # default /run/gpu-watchdog/progress
    torchrun --nproc-per-node 2 docs/examples/hf_trainer.py --out /tmp/hf-example
    cat /tmp/progress/hf-example/rank-*.json

The only lines the watchdog needs are the import and ``callbacks=[WatchdogCallback(...)]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, Trainer, TrainingArguments

from gpu_triage.integrations.hf import WatchdogCallback

TEXT = "the quick brown fox jumps over the lazy dog while the watchdog reads every progress file " * 8


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([TEXT], trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


class Blocks(torch.utils.data.Dataset):
    def __init__(self, ids: list[int], length: int, count: int) -> None:
        self.items = [ids[i % (len(ids) - length) :][:length] for i in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.tensor(self.items[i])
        return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x}


def build(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> Trainer:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="checkpoints go here")
    ap.add_argument("--job", default="hf-example", help="the job name the watchdog shows")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=64, help="training samples per epoch (all ranks)")
    ap.add_argument("--save-steps", type=int, default=4)
    ap.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps (0: never)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=32,
            n_embd=32,
            n_layer=1,
            n_head=2,
            bos_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.pad_token_id,
        )
    )
    ids = tokenizer(TEXT)["input_ids"]
    training = TrainingArguments(
        output_dir=args.out,
        use_cpu=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        per_device_train_batch_size=4,
        num_train_epochs=args.epochs,
        save_strategy="steps",
        save_steps=args.save_steps,
        eval_strategy="steps" if args.eval_steps else "no",
        eval_steps=args.eval_steps or None,
        per_device_eval_batch_size=4,
        logging_steps=10_000,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return Trainer(
        model=model,
        args=training,
        train_dataset=Blocks(ids, 16, args.samples),
        eval_dataset=Blocks(ids, 16, 8) if args.eval_steps else None,
        callbacks=[WatchdogCallback(args.job), *callbacks],  # <- the watchdog integration
    )


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> int:
    build(argv, callbacks).train()
    # The Trainer leaves the process group up; one torn down at interpreter exit instead can abort
    # (gloo's threads: "terminate called without an active exception", SIGABRT after a good run).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
