"""``ft-trainer train`` and ``ft-trainer scaling-report``: argument parsers and runners for the COMMANDS
table of :mod:`ft_trainer.cli`. Nothing heavy is imported until a runner runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
import time
import traceback
import warnings
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD = 2

TRAIN_EPILOG = """\
examples:
  # one node, 8 GPUs
  torchrun --nproc-per-node 8 -m ft_trainer.cli train --config job.toml
  # two nodes x 8 GPUs (hostfile: "node-a slots=8" per line); --no_local_rank: ranks read LOCAL_RANK
  deepspeed --hostfile hostfile --no_local_rank --module ft_trainer.cli train --config job.toml
  # CPU, 2 ranks (tests, demos): DS_ACCELERATOR=cpu, gloo
  DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 -m ft_trainer.cli train --config tiny-cpu.toml
"""


def add_train(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "train",
        help="DeepSpeed ZeRO-3 full fine-tuning (run under torchrun or deepspeed, one process per GPU)",
        description=textwrap.fill(
            "Train the job's model with DeepSpeed ZeRO-3 on its packed, equalized data. Each process is "
            "one rank (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher). Writes "
            "progress files for gpu-watchdog, checkpoints with an atomic 'latest' marker (resumes from "
            "it), and a JSONL metrics log (tokens/s, MFU, GPU-hours). Reference: docs/training.md."
        ),
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, help="job TOML")
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    return p


def _configure_logging(rank: int, verbose: bool) -> None:
    level = logging.INFO if (rank == 0 or verbose) else logging.WARNING
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    logging.basicConfig(level=level, format=f"%(asctime)s [rank {rank}] %(name)s %(levelname)s %(message)s")
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*requires_grad=True to a scalar.*")


def run_train(args: argparse.Namespace) -> int:
    """Run one rank. Exit 0 done, 1 training failed, 2 bad job file or launch."""
    from ft_trainer.config import ConfigError, load_config
    from ft_trainer.train.loop import Trainer
    from ft_trainer.train.rank import RankEnv, TrainError
    from ft_trainer.train.settings import train_settings

    rank = int(os.environ.get("RANK", "0"))
    _configure_logging(rank, bool(getattr(args, "verbose", False)))
    log = logging.getLogger("ft_trainer.train")
    try:
        cfg = load_config(args.config)
        settings = train_settings(cfg)
        RankEnv.from_env(os.environ)
    except (ConfigError, TrainError) as exc:
        print(f"ft-trainer train: {exc}", file=sys.stderr)
        return EXIT_BAD
    t0 = time.perf_counter()
    trainer = None
    try:
        trainer = Trainer(cfg, settings)
        trainer.setup()
        result = trainer.run()
    except (ConfigError, TrainError) as exc:
        print(f"ft-trainer train: rank {rank}: {exc}", file=sys.stderr)
        return EXIT_BAD
    except KeyboardInterrupt:
        log.warning("interrupted")
        return 130
    except Exception:
        log.error("training failed on rank %d:\n%s", rank, traceback.format_exc())
        return EXIT_FAILED
    finally:
        if trainer is not None:
            trainer.close()
    log.info(
        "done: %d optimizer steps, epoch %d, %d tokens, last loss %s, %d checkpoint(s), %.1f s",
        result.steps,
        result.epoch,
        result.tokens,
        "n/a" if result.last_loss is None else f"{result.last_loss:.4f}",
        result.saves,
        time.perf_counter() - t0,
    )
    return EXIT_OK


def add_scaling_report(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "scaling-report",
        help="strong-scaling table and PNG from runs at different GPU counts",
        description=textwrap.fill(
            "Read the metrics directories (run.json + metrics.jsonl) of runs of the same job at different "
            "GPU counts and print a strong-scaling table: tokens/s, tokens/s per GPU, speed-up and "
            "efficiency against the smallest run, step time, MFU, GPU-hours and wall hours per epoch. "
            "Throughput is the median over logged steps after --skip-steps (start-up excluded)."
        ),
        epilog=(
            "examples:\n"
            "  ft-trainer scaling-report runs/4gpu runs/8gpu runs/16gpu --png scaling.png\n"
            "  ft-trainer scaling-report runs/* --json\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", type=Path, help="metrics directories (metrics.dir of each run)")
    p.add_argument("--png", type=Path, help="write the plots here")
    p.add_argument("--skip-steps", type=int, default=None, help="logged steps to skip (default: 10%%, >= 1)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument(
        "--allow-mixed",
        action="store_true",
        help="report runs that differ in job, model, seq_len, micro_batch, tokens per step per GPU or "
        "dtype anyway, with a warning (by default they are refused: their ratio is not strong scaling)",
    )
    return p


def run_scaling_report(args: argparse.Namespace) -> int:
    import json

    from ft_trainer.train.scaling import (
        RunError,
        load_run,
        plot_scaling,
        render_table,
        run_differences,
        scaling_rows,
    )

    try:
        runs = [load_run(r, skip_steps=args.skip_steps) for r in args.runs]
    except RunError as exc:
        print(f"ft-trainer scaling-report: {exc}", file=sys.stderr)
        return EXIT_BAD
    differences = run_differences(runs)
    for line in differences:
        level = "warning" if args.allow_mixed else "error"
        print(f"ft-trainer scaling-report: {level}: {line}", file=sys.stderr)
    if differences and not args.allow_mixed:
        print(
            "ft-trainer scaling-report: these runs are not one job at different GPU counts, so speed-up and "
            "efficiency would compare unrelated throughputs; pass --allow-mixed to report them anyway",
            file=sys.stderr,
        )
        return EXIT_BAD
    rows = scaling_rows(runs)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=1))
    else:
        print(render_table(rows))
    if args.png:
        plot_scaling(rows, args.png)
        if not args.json:
            print(f"plot: {args.png}")
    return EXIT_OK
