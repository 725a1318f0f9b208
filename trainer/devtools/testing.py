"""Run real tiny training jobs locally: the helpers the trainer's tests, the benchmark and the end-to-end
demo (the watchdog watching a real deadlock) share. Nothing is downloaded.

- :func:`prepare_tiny_data` trains a byte-level BPE (vocabulary 512, the ``tiny-qwen3`` preset's) and
  pretokenizes a synthetic corpus - balanced, or imbalanced so that packing gives ranks different
  micro-batch counts (the epoch-end deadlock's data);
- :func:`write_tiny_job` writes a job TOML for the tiny model on CPU;
- :func:`launch_local` starts the ranks of a job as subprocesses with the environment torchrun would set
  (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` on a free port,
  ``DS_ACCELERATOR=cpu``) in one new process group, and returns a :class:`LocalRun` that can wait, read
  the logs and kill the whole group.

``python -m ft_trainer.devtools.testing prepare DIR [--imbalanced]`` makes the data of
``deploy/examples/tiny-cpu.toml``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LocalRun",
    "TinyData",
    "free_port",
    "launch_local",
    "prepare_tiny_data",
    "toml_value",
    "write_tiny_job",
]

TOKENIZER_TEXTS = 1500


@dataclass(frozen=True)
class TinyData:
    tokenizer_dir: Path
    cache_dir: Path
    corpus_dir: Path


def prepare_tiny_data(
    root: Path,
    *,
    imbalanced: bool = False,
    n_docs: int = 120,
    mean_words: float = 12.0,
    long_doc_words: int = 700,
    seed: int = 11,
    tokenizer_dir: Path | None = None,
) -> TinyData:
    """A tokenizer (unless given) and a pretokenized cache under ``root`` (reused if already there).

    ``imbalanced`` adds one long document to ``n_docs`` short ones: the rank that packs it gets more
    micro-batches than the others in most epochs (check with ``JobData.epoch_plan``)."""
    from ft_trainer.data.pretokenize import PretokenizeOptions, pretokenize
    from ft_trainer.data.tokenization import train_byte_bpe
    from ft_trainer.devtools.synthetic import synthetic_texts, write_jsonl

    root = Path(root)
    tok = tokenizer_dir or root / "tokenizer"
    if not (Path(tok) / "tokenizer.json").is_file():
        train_byte_bpe(synthetic_texts(TOKENIZER_TEXTS, seed=99), Path(tok), vocab_size=512)
    corpus = root / "corpus"
    cache = root / "cache"
    if not (cache / "manifest.json").is_file():
        texts = synthetic_texts(n_docs, seed=seed, mean_words=mean_words, sigma=0.4)
        if imbalanced:
            texts.insert(
                n_docs // 3, synthetic_texts(1, seed=seed + 1, mean_words=long_doc_words, sigma=0.01)[0]
            )
        write_jsonl(corpus / "docs.jsonl", texts)
        res = pretokenize(
            PretokenizeOptions(
                inputs=[corpus],
                out_dir=cache,
                tokenizer=Path(tok),
                workers=1,
                progress=False,
                shard_bytes=1 << 20,
            )
        )
        if not res.complete:
            raise RuntimeError(f"{cache}: pretokenize did not complete")
    return TinyData(tokenizer_dir=Path(tok), cache_dir=cache, corpus_dir=corpus)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_tiny_job(
    path: Path,
    *,
    cache_dir: Path,
    tokenizer_dir: Path,
    checkpoint_dir: Path,
    world_size: int = 2,
    **sections: dict[str, Any],
) -> Path:
    """A job TOML for ``tiny-qwen3`` on CPU with ``world_size`` ranks; ``sections`` override keys
    (``data={"equalize": False}``; a value of None removes the key)."""
    base: dict[str, dict[str, Any]] = {
        "job": {"name": "tiny-cpu", "seed": 5, "epochs": 2},
        "model": {"preset": "tiny-qwen3", "tokenizer": str(tokenizer_dir), "gradient_checkpointing": False},
        "data": {"cache_dir": str(cache_dir), "seq_len": 64, "micro_batch": 2, "grad_accum": 2},
        "cluster": {"nodes": 1, "gpus_per_node": world_size, "launcher": "local"},
        "checkpoint": {"dir": str(checkpoint_dir), "keep_last": 2},
        "zero": {"zero_init": True},
        "train": {"device": "cpu", "cpu_threads": 1, "collective_timeout_s": 600.0},
        "optim": {"lr": 3e-3, "warmup_steps": 2, "min_lr_ratio": 0.1, "weight_decay": 0.0},
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalRun:
    """The ranks of one local job, in one process group (``pgid``)."""

    procs: list[subprocess.Popen]
    pgid: int
    logs: list[Path]
    progress_dir: Path
    job: str
    started_s: float = field(default_factory=time.time)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def returncodes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def alive(self) -> list[bool]:
        return [rc is None for rc in self.returncodes()]

    def wait(self, timeout_s: float) -> list[int]:
        """Exit codes of every rank; ``TimeoutError`` (the group is left running) if not all exit in time."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            left = deadline - time.monotonic()
            try:
                p.wait(timeout=max(0.01, left))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"ranks still running after {timeout_s:.0f} s: {self.alive()}") from None
        return [int(p.returncode) for p in self.procs]

    def output(self, rank: int) -> str:
        try:
            return self.logs[rank].read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 30) -> str:
        out = []
        for r in range(len(self.procs)):
            text = self.output(r).splitlines()[-lines:]
            out.append(f"--- rank {r} (rc {self.procs[r].poll()}) ---\n" + "\n".join(text))
        return "\n".join(out)

    def progress_file(self, rank: int) -> Path:
        return self.progress_dir / self.job / f"rank-{rank}.json"

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM the process group, SIGKILL after ``grace_s``, and reap every rank.

        The group is signalled only while one of its ranks is still unreaped (alive or a zombie), so the
        group id cannot have been recycled for someone else's processes."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if all(rc is not None for rc in self.returncodes()):
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(self.alive()):
                time.sleep(0.05)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def __enter__(self) -> LocalRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def launch_local(
    config: Path,
    *,
    world_size: int = 2,
    log_dir: Path,
    progress_dir: Path,
    job: str = "tiny-cpu",
    env: dict[str, str] | None = None,
    threads: int = 1,
    args: tuple[str, ...] = (),
    command: list[str] | None = None,
) -> LocalRun:
    """Start ``ft-trainer train --config CONFIG [ARGS]`` (or ``command``) as ``world_size`` rank processes
    in a new process group (rank 0 leads it). Returns at once; the caller must ``kill()`` (or use
    ``with``)."""
    port = free_port()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    base = dict(os.environ)
    base.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "GPU_WATCHDOG_PROGRESS_DIR": str(progress_dir),
            "GPU_WATCHDOG_JOB": job,
        }
    )
    base.update(env or {})
    cmd = command or [sys.executable, "-m", "ft_trainer.cli", "train", "--config", str(config), *args]
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []
    pgid = 0
    try:
        for rank in range(world_size):
            rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            log_path = log_dir / f"rank-{rank}.log"
            logs.append(log_path)
            with open(log_path, "wb") as out:
                kwargs: dict[str, Any] = {"process_group": 0 if rank == 0 else pgid}
                p = subprocess.Popen(
                    cmd,
                    env=rank_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    **kwargs,
                )
            if rank == 0:
                pgid = p.pid
            procs.append(p)
    except BaseException:
        run = LocalRun(procs, pgid, logs, Path(progress_dir), job)
        run.kill()
        raise
    return LocalRun(procs, pgid, logs, Path(progress_dir), job)


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ft_trainer.devtools.testing", description="tiny local data for the CPU example"
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="tokenizer + pretokenized cache under DIR")
    prep.add_argument("dir", type=Path)
    prep.add_argument("--imbalanced", action="store_true", help="one long document: unequal per-rank counts")
    a = p.parse_args(argv)
    try:
        data = prepare_tiny_data(a.dir, imbalanced=a.imbalanced)
    except ModuleNotFoundError as e:  # after `make run` alone: no tokenizers/torch; say so, exit 2
        from gpu_triage.cli.extras import checkout_extra_hint

        hint = checkout_extra_hint(p.prog, f"{p.prog} {a.cmd}", e, "trainer")
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return 2
    print(f"tokenizer: {data.tokenizer_dir}\ncache:     {data.cache_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
