"""A simulated training job for the demo, tests and benchmarks: real processes, real progress files,
simulated GPUs.

:func:`start` (what ``gpu-watchdog demo-run``, i.e. ``make run``, calls) or ``python -m
gpu_triage.demo.simjob`` starts a launcher process that starts one process per local rank. Each follows
the same scripted scenario as the daemon's ``sim`` telemetry source (``watchdog/telemetry/scenarios/``;
both anchored at ``--start-epoch``) and behaves as a real rank would: it writes its progress file
through the client contract (:mod:`gpu_triage.contract`, what every training job uses) on every step and
phase change, holds a lease during a checkpoint (rank 0 really writes to disk while it saves), and when
the scenario hangs it simply stops reporting - as a rank stuck in a collective does. Ranks whose
scenario phase is ``epoch_end`` announce it once with a short lease and then go silent too: the
epoch-end deadlock, where some ranks ran out of batches while others wait in ``train``.

The processes carry the environment a launcher sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``GPU_WATCHDOG_JOB``), so the daemon's process inspector finds them like real ranks, and they are
real targets for the kill ladder (they run in their own process group).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from gpu_triage.contract import Flusher, ProgressWriter

MODULE = "gpu_triage.demo.simjob"  # the rank processes run this module (not __name__: "__main__" there)
CHECKPOINT_CHUNK_BYTES = 2 << 20
EPOCH_END_LEASE_S = 30.0


def run_rank(args: argparse.Namespace) -> int:
    from gpu_triage.telemetry.sim import Scenario

    scenario = Scenario.load(args.scenario)
    if args.ignore_sigterm:  # a rank blocked in a collective often never gets to run its handler
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    world = int(os.environ.get("WORLD_SIZE", args.ranks))
    writer = ProgressWriter(args.job, rank, local_rank, world, directory=Path(args.progress_dir))
    if args.heartbeat_s:  # as the real trainer does: the file is rewritten while the rank is blocked
        Flusher(writer, heartbeat_s=args.heartbeat_s).start()
    scratch = Path(args.scratch_dir) / f"ckpt-rank{rank}.bin" if args.scratch_dir else None
    phase_key: tuple[int, int] | None = None
    last_step: int | None = None
    tokens_per_step = 8 * 4096
    while True:
        truth = scenario.truth(time.time() - args.start_epoch, args.ranks)
        phase = truth.job_phases[local_rank] if local_rank < len(truth.job_phases) else truth.job_phase
        key = (truth.loop, truth.phase_index)
        if key != phase_key:  # a new scripted phase: announce it
            phase_key = key
            if phase == "train":
                writer.phase("train")
            elif phase == "checkpoint":
                writer.phase(
                    "checkpoint", lease_s=max(10.0, 1.5 * (truth.phase_elapsed_s + truth.phase_remaining_s))
                )
            elif phase == "epoch_end":
                writer.phase("epoch_end", lease_s=EPOCH_END_LEASE_S)
            else:
                writer.phase(phase, lease_s=60.0)
        if phase == "train" and truth.step != last_step:
            last_step = truth.step
            writer.step(truth.step, epoch=truth.loop, tokens=truth.step * tokens_per_step)
        if phase == "checkpoint" and rank == 0 and scratch is not None:
            with open(scratch, "wb") as f:  # the writer rank really writes (overwritten: bounded disk use)
                f.write(os.urandom(CHECKPOINT_CHUNK_BYTES))
                f.flush()
                os.fsync(f.fileno())
        writer.flush()
        time.sleep(args.interval_s)


def launch(args: argparse.Namespace) -> int:
    """The launcher: one child process per rank, in a new process group; waits, forwards SIGTERM."""
    env_base = dict(os.environ)
    children: list[subprocess.Popen[bytes]] = []
    for rank in range(args.ranks):
        env = dict(
            env_base,
            RANK=str(args.rank_offset + rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(args.world_size or args.ranks),
            GPU_WATCHDOG_JOB=args.job,
            GPU_WATCHDOG_PROGRESS_DIR=str(args.progress_dir),
        )
        cmd = [
            sys.executable,
            "-m",
            MODULE,
            "--rank-process",
            "--scenario",
            args.scenario,
            "--job",
            args.job,
            "--progress-dir",
            str(args.progress_dir),
            "--start-epoch",
            str(args.start_epoch),
            "--ranks",
            str(args.ranks),
            "--interval-s",
            str(args.interval_s),
        ]
        if args.scratch_dir:
            cmd += ["--scratch-dir", str(args.scratch_dir)]
        if args.heartbeat_s:
            cmd += ["--heartbeat-s", str(args.heartbeat_s)]
        if args.ignore_sigterm:
            cmd.append("--ignore-sigterm")
        children.append(subprocess.Popen(cmd, env=env))

    def forward(signum: int, _frame: FrameType | None) -> None:
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [c.wait() for c in children]
    return max((abs(c) for c in codes), default=0)


def start(
    progress_dir: Path,
    start_epoch: float,
    *,
    scratch_dir: Path | None = None,
    scenario: str = "reference-b300",
    ranks: int = 8,
    world_size: int = 16,
    interval_s: float = 0.25,
    job: str = "qwen3-32b-ft",
    heartbeat_s: float = 0.0,
    ignore_sigterm: bool = False,
) -> subprocess.Popen[bytes]:
    """Start the simulated job in its own session (so ``os.killpg(proc.pid, ...)`` stops every rank) and
    return its launcher process. ``start_epoch``: the wall-clock second its scenario starts at - the
    same anchor the daemon's ``--source sim`` gets, so the ranks' progress and the simulated GPUs agree.
    The other arguments are the command line's (``--help``)."""
    argv = [
        "--job",
        job,
        "--progress-dir",
        str(progress_dir),
        "--start-epoch",
        str(start_epoch),
        "--scenario",
        scenario,
        "--ranks",
        str(ranks),
        "--world-size",
        str(world_size),
        "--interval-s",
        str(interval_s),
    ]
    if scratch_dir is not None:
        argv += ["--scratch-dir", str(scratch_dir)]
    if heartbeat_s:
        argv += ["--heartbeat-s", str(heartbeat_s)]
    if ignore_sigterm:
        argv.append("--ignore-sigterm")
    return subprocess.Popen([sys.executable, "-m", MODULE, *argv], start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="reference-b300")
    p.add_argument("--job", default="qwen3-32b-ft")
    p.add_argument("--progress-dir", required=True)
    p.add_argument("--scratch-dir", help="where rank 0 writes during checkpoints (real I/O)")
    p.add_argument("--start-epoch", type=float, required=True, help="epoch seconds the scenario starts at")
    p.add_argument("--ranks", type=int, default=8, help="local ranks (one per simulated GPU)")
    p.add_argument("--rank-offset", type=int, default=0, help="global rank of local rank 0 (node 2: 8)")
    p.add_argument("--world-size", type=int, default=16)
    p.add_argument("--interval-s", type=float, default=0.25)
    p.add_argument(
        "--heartbeat-s",
        type=float,
        default=0.0,
        help="run the progress flusher: rewrite each file this often even while the rank hangs "
        "(the trainer's flusher does every 30 s; 0: no flusher)",
    )
    p.add_argument(
        "--ignore-sigterm",
        action="store_true",
        help="the ranks ignore SIGTERM (as a rank stuck in a collective may): only SIGKILL ends them",
    )
    p.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    Path(args.progress_dir).mkdir(parents=True, exist_ok=True)
    if args.scratch_dir:
        Path(args.scratch_dir).mkdir(parents=True, exist_ok=True)
    try:
        return run_rank(args) if args.rank_process else launch(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
