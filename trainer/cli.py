"""``ft-trainer``: the trainer's command line.

Subcommands register in :data:`COMMANDS` (name -> (adder, runner)); each runner imports what it needs
when it runs, so ``ft-trainer gate`` never loads torch or DeepSpeed (``train`` and ``scaling-report``
live in :mod:`ft_trainer.train.command`, which imports torch only when training starts).

Exit codes: 0 ok; 2 bad input, bad job file or a failed gate; 3 ``pretokenize`` stopped before the cache
was complete (``--max-shards``); 130 interrupted (Ctrl-C; ``pretokenize`` resumes on rerun).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ft_trainer import __version__
from ft_trainer.train import command as train_command  # light: torch loads only when `train` runs

if TYPE_CHECKING:
    from ft_trainer.config import JobConfig

EXIT_OK = 0
EXIT_BAD = 2
EXIT_INCOMPLETE = 3
EXIT_INTERRUPTED = 130

DESCRIPTION = """\
DeepSpeed ZeRO-3 full fine-tuning that cannot hit the epoch-end deadlock.

A job is one TOML file (reference: docs/trainer.md). The usual order:
  1. ft-trainer pretokenize --config job.toml   corpus -> memory-mapped token cache (resumable)
  2. ft-trainer gate --config job.toml          pre-launch invariants in seconds, no torch
                                                (exit 2 = do not launch)
  3. ft-trainer bench-data --config job.toml    can the data path feed the GPUs? (cache vs stream)
  4. deepspeed --hostfile H --no_local_rank --module ft_trainer.cli train --config job.toml
  5. ft-trainer scaling-report RUN_DIR...       strong-scaling table and PNG from several runs
"""


def _load(path: str) -> JobConfig | None:
    from ft_trainer.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"ft-trainer: {exc}", file=sys.stderr)
        return None


# ------------------------------------------------------------------------------------------ pretokenize
def _add_pretokenize(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "pretokenize",
        help="tokenize a corpus into a memory-mapped cache (resumable, multi-process)",
        description=textwrap.fill(
            "Tokenize JSONL (a text field), Parquet (a text column) or plain-text files into a local cache: "
            "token ids (uint16 when the vocabulary fits, else uint32), a document index and a manifest with "
            "counts, the largest token id and checksums. Give --config (data.source_dir, data.cache_dir, "
            "model.tokenizer, ...) or the explicit options; explicit options win. An interrupted run "
            "(Ctrl-C, a killed job) resumes: finished shards are kept and skipped."
        ),
        epilog=(
            "examples:\n"
            "  ft-trainer pretokenize --config job.toml\n"
            "  ft-trainer pretokenize --tokenizer /models/Qwen3-32B --out /data/cache /nfs/corpus\n"
            "  ft-trainer pretokenize --config job.toml --index-only   # stream mode: document index only\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs", nargs="*", type=Path, help="corpus files or directories (default: data.source_dir)"
    )
    p.add_argument("--config", help="job TOML supplying the defaults below")
    p.add_argument(
        "--tokenizer", type=Path, help="local tokenizer.json or directory holding one (model.tokenizer)"
    )
    p.add_argument("--out", type=Path, help="cache directory to write (data.cache_dir)")
    p.add_argument("--text-field", help="JSONL field / Parquet column holding the text (default 'text')")
    p.add_argument(
        "--text-unit", choices=("line", "file"), help=".txt files: a document per line or per file"
    )
    p.add_argument(
        "--eos-token", help="token appended to every document; '' for none (default <|endoftext|>)"
    )
    p.add_argument("--workers", type=int, help="worker processes (default: one per CPU, at most 8)")
    p.add_argument("--shard-mb", type=int, help="target MiB of source text per shard (default 128)")
    p.add_argument(
        "--index-only",
        action="store_true",
        help="write the document index but no token ids (enough for data.mode = 'stream')",
    )
    p.add_argument(
        "--max-shards",
        type=int,
        help="stop after this many new shards (staged runs); exit 3 if the cache is then incomplete",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _run_pretokenize(args: argparse.Namespace) -> int:
    from ft_trainer.config import DataConfig
    from ft_trainer.data.pretokenize import PretokenizeOptions, pretokenize
    from ft_trainer.data.sources import SourceError

    cfg = None
    if args.config:
        cfg = _load(args.config)
        if cfg is None:
            return EXIT_BAD
    d = getattr(cfg, "data", None)
    inputs = list(args.inputs) or ([d.source_dir] if d is not None and d.source_dir is not None else [])
    out = args.out or (d.cache_dir if d is not None else None)
    tok = args.tokenizer or (cfg.model.tokenizer if cfg is not None else None)
    missing = [
        n
        for n, v in (
            ("inputs (or data.source_dir)", inputs),
            ("--out (or data.cache_dir)", out),
            ("--tokenizer (or model.tokenizer)", tok),
        )
        if not v
    ]
    if missing:
        print(f"ft-trainer pretokenize: missing {', '.join(missing)}", file=sys.stderr)
        return EXIT_BAD
    assert out is not None and tok is not None  # both in `missing` otherwise

    def pick(arg: Any, key: str) -> Any:
        """The flag, else the job file's [data] value, else [data]'s default (written once, there)."""
        if arg is not None:
            return arg
        return getattr(d, key) if d is not None else DataConfig.__dataclass_fields__[key].default

    opts = PretokenizeOptions(
        inputs=inputs,
        out_dir=out,
        tokenizer=tok,
        text_field=pick(args.text_field, "text_field"),
        text_unit=pick(args.text_unit, "text_unit"),
        eos_token=pick(args.eos_token, "eos_token"),
        workers=pick(args.workers, "workers"),
        shard_bytes=int(pick(args.shard_mb, "shard_mb")) << 20,
        index_only=args.index_only,
        max_shards=args.max_shards,
        progress=not args.no_progress,
    )
    try:
        res = pretokenize(opts)
    except KeyboardInterrupt:
        print(
            "ft-trainer pretokenize: interrupted; finished shards are kept - "
            "rerun the same command to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except (SourceError, FileNotFoundError, ValueError) as exc:
        print(f"ft-trainer pretokenize: {exc}", file=sys.stderr)
        return EXIT_BAD
    done = f"{res.done_shards} shard(s) tokenized, {res.skipped_shards} already done (resumed)"
    if not res.complete:
        left = res.total_shards - res.skipped_shards - res.done_shards
        print(
            f"pretokenize: {done}; {left} of {res.total_shards} left: rerun to continue ({res.seconds:.1f} s)"
        )
        return EXIT_INCOMPLETE
    m = res.manifest or {}
    print(
        f"pretokenize: {done}; cache {res.out_dir}: {m.get('num_docs', 0):,} documents, "
        f"{m.get('num_tokens', 0):,} tokens, {m.get('dtype')}, largest id {m.get('max_token_id')} "
        f"({res.seconds:.1f} s)"
    )
    return EXIT_OK


# ------------------------------------------------------------------------------------------------- gate
def _add_gate(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "gate",
        help="check the job's invariants before launch (exit 0 pass, 2 fail); no torch, seconds",
        description=textwrap.fill(
            "Compute the exact per-rank plan training will use and check: equal micro-batches/steps on every "
            "rank in every epoch (the epoch-end deadlock), batch arithmetic, seq_len vs model positions, "
            "token "
            "ids vs vocabulary, cache vs manifest (sizes, headers, sampled checksums; --deep re-hashes "
            "everything), checkpoint directory writable with room for a full ZeRO-3 checkpoint, world size "
            "vs "
            "hostfile vs launcher, ZeRO-3 memory per GPU and per node. Each line: PASS/FAIL, name, seconds, "
            "the numbers, and for a failure the fix."
        ),
        epilog=(
            "examples:\n"
            "  ft-trainer gate --config job.toml && deepspeed --hostfile hostfile ... ft-trainer train ...\n"
            "  ft-trainer gate --config job.toml --json | jq '.invariants[] | select(.ok | not)'\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, help="job TOML")
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"ok", "seconds", "invariants": [{"name", "ok", "detail", "seconds"}]}',
    )
    p.add_argument(
        "--deep", action="store_true", help="re-hash every cache file and recompute the largest id"
    )
    return p


def _run_gate(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    from ft_trainer.config import ConfigError, load_config
    from ft_trainer.gate import config_error_report, dump_json, run_gate

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        report = config_error_report(args.config, str(exc), time.perf_counter() - t0)
        if args.json:
            print(dump_json(report))
        print(f"ft-trainer gate: {exc}", file=sys.stderr)
        return EXIT_BAD
    report = run_gate(cfg, deep=args.deep)
    report.seconds = time.perf_counter() - t0
    print(dump_json(report) if args.json else report.render())
    return EXIT_OK if report.ok else EXIT_BAD


# ------------------------------------------------------------------------------------------- bench-data
def _add_bench_data(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench-data",
        help="tokens/s of the cache and stream data paths vs the job's consumption",
        description=(
            "Iterate the job's real packed micro-batches (one rank's plan) for a few seconds in cache mode "
            "(memory-mapped ids) and stream mode (text read from data.source_dir and tokenized per step), "
            "and "
            "compare with what one rank consumes: job.expected_tokens_per_s / world_size. Headroom >= 2x is "
            "ample; below 1x the GPUs starve."
        ),
    )
    p.add_argument("--config", required=True, help="job TOML")
    p.add_argument("--seconds", type=float, default=2.0, help="measuring time per mode (default 2)")
    p.add_argument("--modes", default="cache,stream", help="comma-separated: cache, stream (default both)")
    p.add_argument("--rank", type=int, default=0, help="whose plan to read (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    return p


def _run_bench_data(args: argparse.Namespace) -> int:
    from ft_trainer.data.bench_data import bench_mode, verdict

    cfg = _load(args.config)
    if cfg is None:
        return EXIT_BAD
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("cache", "stream")]
    if bad or not modes:
        print(
            f"ft-trainer bench-data: --modes: expected cache and/or stream, got {args.modes!r}",
            file=sys.stderr,
        )
        return EXIT_BAD
    world = cfg.cluster.world_size
    if not 0 <= args.rank < world:
        print(f"ft-trainer bench-data: --rank {args.rank} outside 0..{world - 1}", file=sys.stderr)
        return EXIT_BAD
    results = [bench_mode(cfg, m, seconds=args.seconds, rank=args.rank) for m in modes]
    expected = cfg.expected_tokens_per_s
    need = expected / world if expected else None
    v, notes = verdict(results, need)
    if args.json:
        print(
            json.dumps(
                {
                    "config": args.config,
                    "rank": args.rank,
                    "need_tokens_per_s_per_rank": need,
                    "modes": {
                        r.mode: {
                            "tokens_per_s": r.tokens_per_s,
                            "tokens": r.tokens,
                            "seconds": r.seconds,
                            "micro_batches": r.micro_batches,
                            "error": r.error,
                            "headroom": (r.tokens_per_s / need) if need and r.error is None else None,
                        }
                        for r in results
                    },
                    "verdict": v,
                },
                indent=1,
            )
        )
    else:
        d = cfg.data
        print(
            f"bench-data: {args.config}: rank {args.rank} of {world}, seq_len {d.seq_len}, "
            f"micro_batch {d.micro_batch}"
        )
        for r in results:
            if r.error:
                print(f"  {r.mode:<7} unavailable: {r.error}")
            else:
                print(
                    f"  {r.mode:<7} {r.tokens_per_s:>14,.0f} tokens/s  ({r.micro_batches} micro-batches in "
                    f"{r.seconds:.2f} s)"
                )
        if need:
            print(
                f"  need    {need:>14,.0f} tokens/s per rank (job.expected_tokens_per_s {expected:,.0f} / "
                f"{world} ranks)"
            )
        for n in notes:
            print(f"  {n}")
        print(f"verdict: {v}")
    return EXIT_BAD if all(r.error for r in results) else EXIT_OK


# ------------------------------------------------------------------------------------------------ main
Adder = Callable[[argparse._SubParsersAction], argparse.ArgumentParser]
Runner = Callable[[argparse.Namespace], int]

# Order is the order of --help.
COMMANDS: list[tuple[str, Adder, Runner]] = [
    ("pretokenize", _add_pretokenize, _run_pretokenize),
    ("gate", _add_gate, _run_gate),
    ("bench-data", _add_bench_data, _run_bench_data),
    ("train", train_command.add_train, train_command.run_train),
    ("scaling-report", train_command.add_scaling_report, train_command.run_scaling_report),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ft-trainer", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"ft-trainer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add, run in COMMANDS:
        p = add(sub)
        p.set_defaults(_run=run, _name=name)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_BAD
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        return int(args._run(args))
    except ModuleNotFoundError as e:  # the base (client-only) wheel: say which extra, exit 2
        from gpu_triage.cli.extras import missing_extra_hint, trainer_command_extra

        hint = missing_extra_hint("ft-trainer", args.command, e, trainer_command_extra(args.command))
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return EXIT_BAD


if __name__ == "__main__":
    sys.exit(main())
