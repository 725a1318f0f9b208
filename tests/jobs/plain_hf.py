"""A plain Hugging Face Trainer job (tiny random GPT-2, CPU, gloo, DDP), written the way users write
one - not this project's: no watchdog callback, no progress files, no phase announcements.

    RANK=.. LOCAL_RANK=.. WORLD_SIZE=2 MASTER_ADDR=.. MASTER_PORT=.. python plain_hf.py MODE OUT_DIR

MODE ``eval_deadlock``: uneven shards (each rank builds its own training loader: rank 0 has 2
batches, rank 1 has 4) and an evaluation at every epoch end. Rank 0 finishes its batches and enters
the epoch-end evaluation, which gathers the losses across ranks (a collective inside ``evaluate``);
rank 1 is still in its third step, waiting in DDP's gradient all-reduce. Neither ever returns.

Each rank writes ``OUT_DIR/ready-<rank>`` when training begins and ``OUT_DIR/epoch-end-<rank>`` at
its epoch end.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

SEQ = 16
VOCAB = 64


class Blocks(torch.utils.data.Dataset):
    def __init__(self, count: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.randint(0, VOCAB, (SEQ,), generator=g) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.items[i]
        return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x}


class UnevenTrainer(Trainer):
    """Each rank reads its own shard, sized by hand - nobody equalised the epoch."""

    def __init__(self, *args: Any, batches: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches = batches

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        data = Blocks(self.batches * self.args.per_device_train_batch_size, seed=int(os.environ["RANK"]))
        return torch.utils.data.DataLoader(data, batch_size=self.args.per_device_train_batch_size)


class Markers(TrainerCallback):
    def __init__(self, out: Path, rank: int) -> None:
        self.out, self.rank = out, rank

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        (self.out / f"ready-{self.rank}").write_text(str(os.getpid()))

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        (self.out / f"epoch-end-{self.rank}").write_text("")


def main() -> int:
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode != "eval_deadlock":
        raise SystemExit(f"unknown mode {mode!r}")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
        )
    )
    args = TrainingArguments(
        output_dir=str(out / "hf"),
        use_cpu=True,
        ddp_backend="gloo",
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        num_train_epochs=2,
        eval_strategy="epoch",
        save_strategy="no",
        logging_steps=10_000,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = UnevenTrainer(
        model=model,
        args=args,
        train_dataset=Blocks(8, seed=0),
        eval_dataset=Blocks(8, seed=1),
        callbacks=[Markers(out, rank)],
        batches=2 if rank == 0 else 4,
    )
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
