"""Checkpoints: DeepSpeed ZeRO-3 save/load under a marker of our own that never names a half checkpoint.

Layout of ``checkpoint.dir``::

    latest                       the tag of the newest complete checkpoint (text, as DeepSpeed writes it,
                                 so DeepSpeed's own tools such as zero_to_fp32.py read it too)
    step-000000120/              one tag: DeepSpeed's files (every rank writes its ZeRO partition) plus
        trainer_rank00000.pt     per rank: its RNG states and tokens consumed
        trainer_state.json       written last, by rank 0, once every rank has finished: "complete"

**Protocol** (every rank): DeepSpeed ``save_checkpoint(save_latest=False)`` into the tag directory, then
each rank writes its own state file and fsyncs what it wrote; an all-reduce of the bytes written (sum) and
seconds taken (max) is the barrier; only then rank 0 writes ``trainer_state.json`` and replaces
``latest`` atomically (temp file, fsync, rename, fsync of the directory). A crash at any point before the
rename leaves ``latest`` on the previous tag; the next start deletes tags without ``trainer_state.json``.
Pruning keeps the newest ``keep_last`` complete tags and never the one ``latest`` names.

**Leases** (:func:`save_lease_s`): a save announces ``factor x expected bytes / measured bytes-per-second
+ slack``, clamped. The first save, with nothing measured, uses
:func:`ft_trainer.planning.estimates.checkpoint_bytes` and a configured conservative throughput; later
ones the bytes and aggregate throughput of the previous save (all ranks' bytes over the slowest
rank's seconds).

The functions above the ``runtime`` line are pure (paths and numbers); :class:`CheckpointManager` drives
a DeepSpeed engine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "COMPLETE_FILE",
    "LATEST_FILE",
    "CheckpointInfo",
    "CheckpointManager",
    "SaveResult",
    "duration_lease_s",
    "list_checkpoints",
    "parse_fault",
    "prune_selection",
    "read_latest",
    "save_lease_s",
    "step_of_tag",
    "tag_for_step",
    "write_latest",
]

log = logging.getLogger("ft_trainer.train.checkpoint")

LATEST_FILE = "latest"
COMPLETE_FILE = "trainer_state.json"
TAG_RE = re.compile(r"^step-(\d{9,})$")
FAULT_ENV = "FT_TRAINER_FAULT"
FAULT_EXIT_CODE = 86


# ------------------------------------------------------------------------------------------------ pure
def tag_for_step(step: int) -> str:
    return f"step-{step:09d}"


def step_of_tag(tag: str) -> int | None:
    m = TAG_RE.match(tag)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class CheckpointInfo:
    tag: str
    step: int
    path: Path
    complete: bool


def list_checkpoints(directory: Path) -> list[CheckpointInfo]:
    """Tag directories under ``directory``, oldest first (by step)."""
    if not directory.is_dir():
        return []
    out = []
    for p in directory.iterdir():
        step = step_of_tag(p.name)
        if step is not None and p.is_dir():
            out.append(CheckpointInfo(p.name, step, p, (p / COMPLETE_FILE).is_file()))
    return sorted(out, key=lambda c: c.step)


def read_latest(directory: Path) -> str | None:
    """The tag ``latest`` names, if it names a complete checkpoint (else None, with a warning)."""
    try:
        tag = (directory / LATEST_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if step_of_tag(tag) is None or not (directory / tag / COMPLETE_FILE).is_file():
        log.warning(
            "%s names %r, which is not a complete checkpoint; ignoring it", directory / LATEST_FILE, tag
        )
        return None
    return tag


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_latest(directory: Path, tag: str) -> None:
    """Point ``latest`` at ``tag`` atomically (temp + fsync + rename + directory fsync)."""
    _atomic_write(directory / LATEST_FILE, tag.encode())


def prune_selection(
    checkpoints: list[CheckpointInfo], latest: str | None, keep_last: int
) -> list[CheckpointInfo]:
    """Complete checkpoints to delete: all but the newest ``keep_last``, never ``latest``."""
    complete = [c for c in checkpoints if c.complete]
    keep = {c.tag for c in complete[-keep_last:]} if keep_last > 0 else set()
    if latest is not None:
        keep.add(latest)
    return [c for c in complete if c.tag not in keep]


def save_lease_s(
    expected_bytes: float,
    bytes_per_s: float,
    *,
    factor: float = 2.0,
    slack_s: float = 30.0,
    min_s: float = 30.0,
    max_s: float = 7200.0,
) -> float:
    """How long a save may take before its lease expires: ``factor x bytes / throughput + slack``."""
    if bytes_per_s <= 0:
        raise ValueError(f"throughput must be > 0, got {bytes_per_s}")
    return min(max_s, max(min_s, factor * expected_bytes / bytes_per_s + slack_s))


def duration_lease_s(
    measured_s: float | None,
    first_s: float,
    *,
    factor: float = 2.0,
    slack_s: float = 30.0,
    min_s: float = 30.0,
    max_s: float = 7200.0,
) -> float:
    """A lease for a phase whose last duration was measured (``first_s`` until one was)."""
    if measured_s is None:
        return min(max_s, max(min_s, first_s))
    return min(max_s, max(min_s, factor * measured_s + slack_s))


def parse_fault(value: str | None) -> tuple[int, int] | None:
    """``FT_TRAINER_FAULT=crash_in_save:STEP[:RANK]`` (tests and demos): that rank exits mid-save at the
    save of optimizer step STEP, after DeepSpeed wrote its first file. Returns (step, rank)."""
    if not value:
        return None
    parts = value.split(":")
    if parts[0] != "crash_in_save" or len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"{FAULT_ENV}={value!r}: expected crash_in_save:STEP[:RANK]")
    return int(parts[1]), int(parts[2]) if len(parts) == 3 else 0


# --------------------------------------------------------------------------------------------- runtime
@dataclass(frozen=True)
class SaveResult:
    tag: str
    step: int
    bytes_total: int  # all ranks
    seconds: float  # the slowest rank's save
    pruned: tuple[str, ...]

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_total / max(self.seconds, 1e-6)


def _rank_file(rank: int) -> str:
    return f"trainer_rank{rank:05d}.pt"


def _own_files(tag_dir: Path, rank: int) -> list[Path]:
    """Files of ``tag_dir`` this rank wrote: its ZeRO partition and state file; rank 0 also the rest."""
    mine = []
    for p in tag_dir.iterdir():
        if not p.is_file():
            continue
        name = p.name
        m = re.search(r"zero_pp_rank_(\d+)_", name) or re.match(r"trainer_rank(\d+)\.pt$", name)
        owner = int(m.group(1)) if m else 0
        if owner == rank and name != COMPLETE_FILE:
            mine.append(p)
    return mine


class CheckpointManager:
    """Save and load through a DeepSpeed engine with the protocol of the module docstring."""

    def __init__(
        self,
        directory: Path,
        engine: Any,
        *,
        rank: int,
        world_size: int,
        keep_last: int,
        fault: tuple[int, int] | None = None,
    ):
        self.directory = Path(directory)
        self.engine = engine
        self.rank = rank
        self.world_size = world_size
        self.keep_last = keep_last
        self.fault = fault

    # -- start-up
    def latest(self) -> str | None:
        return read_latest(self.directory)

    def remove_partial(self) -> list[str]:
        """Rank 0, before training: delete tags a crashed save left without ``trainer_state.json``."""
        removed: list[str] = []
        if self.rank != 0:
            return removed
        for c in list_checkpoints(self.directory):
            if not c.complete:
                log.warning("removing %s: an incomplete checkpoint (a save was interrupted)", c.path)
                shutil.rmtree(c.path, ignore_errors=True)
                removed.append(c.tag)
        return removed

    # -- save
    def save(self, step: int, client_state: dict[str, Any], rank_state: dict[str, Any]) -> SaveResult:
        import torch
        import torch.distributed as dist

        tag = tag_for_step(step)
        tag_dir = self.directory / tag
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            if (tag_dir / COMPLETE_FILE).exists():
                raise RuntimeError(f"{tag_dir} is already a complete checkpoint; it is never overwritten")
            if tag_dir.exists():  # a leftover of an interrupted save of this very step
                shutil.rmtree(tag_dir)
        restore = self._arm_fault(step)
        t0 = time.perf_counter()
        try:
            self.engine.save_checkpoint(
                str(self.directory), tag=tag, client_state=client_state, save_latest=False
            )
        finally:
            restore()
        torch.save(rank_state, tag_dir / _rank_file(self.rank))
        own = _own_files(tag_dir, self.rank)
        for p in own:
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        own_bytes = sum(p.stat().st_size for p in own)
        seconds = time.perf_counter() - t0
        totals = torch.tensor([float(own_bytes)], dtype=torch.float64)
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)  # doubles as the "every rank finished" barrier
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        result_bytes, result_s = int(totals.item()), float(slowest.item())
        pruned: tuple[str, ...] = ()
        if self.rank == 0:
            _fsync_dir(tag_dir)
            state = dict(
                client_state,
                tag=tag,
                bytes_total=result_bytes,
                save_seconds=result_s,
                saved_unix_s=time.time(),
            )
            _atomic_write(tag_dir / COMPLETE_FILE, (json.dumps(state, indent=1, default=str) + "\n").encode())
            write_latest(self.directory, tag)
            pruned = tuple(self._prune(tag))
        return SaveResult(tag=tag, step=step, bytes_total=result_bytes, seconds=result_s, pruned=pruned)

    def _prune(self, latest: str) -> list[str]:
        doomed = prune_selection(list_checkpoints(self.directory), latest, self.keep_last)
        for c in doomed:
            shutil.rmtree(c.path, ignore_errors=True)
        return [c.tag for c in doomed]

    def _arm_fault(self, step: int) -> Callable[[], None]:
        """Test hook (FT_TRAINER_FAULT): exit this process right after DeepSpeed's first file of the save
        of ``step`` - a crash in the middle of a checkpoint."""
        if self.fault is None or self.fault != (step, self.rank):
            return lambda: None
        ce = self.engine.checkpoint_engine
        original = ce.save

        def save_then_die(*args: Any, **kwargs: Any) -> Any:
            original(*args, **kwargs)
            log.error(
                "%s: crashing in the middle of the save of step %d (rank %d)", FAULT_ENV, step, self.rank
            )
            os._exit(FAULT_EXIT_CODE)

        ce.save = save_then_die

        def restore() -> None:
            ce.save = original

        return restore

    # -- load
    def load(self, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load ``tag`` into the engine (weights, optimizer); returns (loop state, this rank's state)."""
        import torch

        tag_dir = self.directory / tag
        state = json.loads((tag_dir / COMPLETE_FILE).read_text(encoding="utf-8"))
        saved_world = int(state.get("world_size", self.world_size))
        if saved_world != self.world_size:
            raise RuntimeError(
                f"{tag_dir}: saved by {saved_world} ranks, this run has {self.world_size}: ZeRO-3 partitions "
                "and the data plan depend on the world size (convert with DeepSpeed's universal checkpoint "
                "tools, or set train.resume = 'never')"
            )
        path, _client = self.engine.load_checkpoint(
            str(self.directory), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if path is None:
            raise RuntimeError(f"{tag_dir}: DeepSpeed could not load this checkpoint")
        rank_file = tag_dir / _rank_file(self.rank)
        rank_state: dict[str, Any] = {}
        with contextlib.suppress(FileNotFoundError):
            rank_state = torch.load(rank_file, weights_only=False)
        return state, rank_state
