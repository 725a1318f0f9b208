"""Stack evidence (pure): parse a ``py-spy dump --json`` and infer where a rank is.

A rank's Python stack says what no counter can: *waiting in a collective* (which op, from which call
site), *inside a checkpoint save* (DeepSpeed ``save_checkpoint``, HF ``_save_checkpoint``,
``torch.save``, safetensors, ``torch.distributed.checkpoint``), *in eval*, *waiting for data*
(``DataLoader``), or in forward / backward / the optimizer step. A save wins over a collective (the
ranks that do not write wait in the save's barrier), eval wins over a collective (a distributed eval
gathers), and a collective wins over forward/backward (ZeRO-3 gathers parameters in forward and
reduce-scatters gradients in backward).

:func:`parse_dump` turns py-spy's JSON (a list of threads, innermost frame first) into
:class:`ThreadStack` values, bounded; :func:`classify` picks the thread that matters and returns a
:class:`StackInfo`; :func:`stack_pattern` compares the ranks of one job (frozen time from
:class:`RankStack`, the sampler's per-rank record): every rank frozen in a collective, ranks in
different collectives (the minority named), ranks in a save or eval. No I/O here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MAX_DUMP_BYTES = 4 << 20
"""A dump larger than this is refused (py-spy's output for a few hundred deep threads is far less)."""
MAX_THREADS = 512
MAX_FRAMES = 256


AVAILABLE = "available"
DISABLED = "disabled"
PY_SPY_MISSING = "py_spy_missing"
PTRACE_DENIED = "ptrace_denied"


class StackPhase(StrEnum):
    COLLECTIVE = "collective"
    CHECKPOINT = "checkpoint"
    EVAL = "eval"
    DATA = "data"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class StackError(ValueError):
    """A dump that is not py-spy's JSON form (the message says what is wrong)."""


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    filename: str
    line: int

    @property
    def func(self) -> str:
        """The bare function name (py-spy >= 0.4 writes ``Class.method`` on Python 3.11+)."""
        return self.name.rsplit(".", 1)[-1]

    def short(self) -> str:
        return f"{_short_path(self.filename)}:{self.line} {self.name}"


@dataclass(frozen=True, slots=True)
class ThreadStack:
    thread_name: str
    os_thread_id: int | None
    frames: tuple[Frame, ...]
    """Innermost first, as py-spy writes them."""


@dataclass(frozen=True, slots=True)
class StackInfo:
    """Where one rank is, from one dump."""

    phase: StackPhase
    op: str | None
    """The collective (``barrier``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``...) or the
    save function (``save_checkpoint``, ``torch.save``...)."""
    call_site: str | None
    """The innermost frame outside the libraries (the user's line), ``file:line function``."""
    fingerprint: str
    """A digest of the chosen thread's frames (function, file, line): same stack, same digest."""
    thread: str
    top: tuple[str, ...]
    """The innermost frames of the chosen thread, short form (at most 8)."""
    collective: str | None = None
    """The collective the thread blocks in, whatever its phase: for a rank in a save or an eval,
    a collective *inside* that save or eval (the ranks that do not write wait in the save's barrier;
    an eval gathers its losses)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": str(self.phase),
            "op": self.op,
            "collective": self.collective,
            "call_site": self.call_site,
            "thread": self.thread,
            "fingerprint": self.fingerprint,
            "top": list(self.top),
        }


# -- parsing ---------------------------------------------------------------------------------------


def parse_dump(data: bytes | str) -> list[ThreadStack]:
    """py-spy's ``dump --json`` output -> threads. Raises :class:`StackError` naming what is wrong."""
    if len(data) > MAX_DUMP_BYTES:
        raise StackError(f"py-spy dump is {len(data)} bytes, more than the {MAX_DUMP_BYTES} accepted")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise StackError(f"py-spy dump is not JSON: {e}") from None
    if not isinstance(doc, list):
        raise StackError(f"py-spy dump: expected a list of threads, got {type(doc).__name__}")
    out = []
    for i, t in enumerate(doc[:MAX_THREADS]):
        if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
            raise StackError(f"py-spy dump: thread {i} has no 'frames' list")
        frames = []
        for j, f in enumerate(t["frames"][:MAX_FRAMES]):
            if not isinstance(f, dict):
                raise StackError(f"py-spy dump: thread {i} frame {j} is not an object")
            line = f.get("line")
            frames.append(
                Frame(
                    name=str(f.get("name") or "?")[:200],
                    filename=str(f.get("filename") or f.get("short_filename") or "?")[:500],
                    line=line if isinstance(line, int) else 0,
                )
            )
        tid = t.get("os_thread_id")
        out.append(
            ThreadStack(
                str(t.get("thread_name") or "")[:100], tid if isinstance(tid, int) else None, tuple(frames)
            )
        )
    return out


# -- classification --------------------------------------------------------------------------------

COLLECTIVE_OPS = frozenset(
    {
        "barrier",
        "monitored_barrier",
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_coalesced",
        "_all_gather_base",
        "all_gather_object",
        "all_gather_base",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "reduce_scatter_base",
        "reduce_scatter_fn",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "all_to_all",
        "all_to_all_single",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "wait",
        "synchronize",
        "inference_all_reduce",
        "allgather_fn",
    }
)
"""Function names that block in a collective when found in a communication module below."""

COMM_MODULES = (
    "torch/distributed/distributed_c10d.py",
    "torch/distributed/c10d_logger.py",
    "torch/distributed/_functional_collectives.py",
    "torch/distributed/fsdp/",
    "torch/distributed/_composable/fsdp/",
    "torch/nn/parallel/distributed.py",
    "deepspeed/comm/",
    "deepspeed/runtime/comm/",
    "deepspeed/runtime/zero/partition_parameters.py",
    "deepspeed/utils/groups.py",
    "accelerate/utils/operations.py",
    "megatron/core/tensor_parallel/mappings.py",
    "megatron/core/parallel_state.py",
)

SAVE_FUNCS: tuple[tuple[str, str], ...] = (
    # (path fragment, function) - a frame matching both means "inside a checkpoint save"
    ("deepspeed/", "save_checkpoint"),
    ("deepspeed/", "_save_checkpoint"),
    ("deepspeed/", "_save_zero_checkpoint"),
    ("deepspeed/", "save_16bit_model"),
    ("transformers/trainer.py", "_save_checkpoint"),
    ("transformers/trainer.py", "save_model"),
    ("transformers/trainer.py", "_save"),
    ("transformers/modeling_utils.py", "save_pretrained"),
    ("accelerate/", "save_state"),
    ("accelerate/", "save_model"),
    ("lightning/", "save_checkpoint"),
    ("pytorch_lightning/", "save_checkpoint"),
    ("torch/serialization.py", "save"),
    ("safetensors/", "save_file"),
    ("safetensors/", "save"),
    ("torch/distributed/checkpoint/", "save"),
    ("torch/distributed/checkpoint/", "save_state_dict"),
    ("torch/distributed/checkpoint/", "async_save"),
    ("megatron/", "save_checkpoint"),
    ("torchtitan/", "save"),
)

EVAL_FUNCS: tuple[tuple[str, str], ...] = (
    ("transformers/trainer.py", "evaluate"),
    ("transformers/trainer.py", "evaluation_loop"),
    ("transformers/trainer.py", "prediction_step"),
    ("transformers/trainer.py", "predict"),
    ("lightning/", "_evaluation_loop"),
    ("lightning/", "validation_step"),
    ("lightning/", "_run_validation"),
    ("pytorch_lightning/", "validation_step"),
    ("megatron/", "evaluate"),
    ("", "evaluate"),
    ("", "validate"),
    ("", "run_eval"),
    ("", "eval_loop"),
)
"""Eval functions: library ones, and the common names a plain script gives its eval (any file)."""

DATA_FUNCS: tuple[tuple[str, str], ...] = (
    ("torch/utils/data/dataloader.py", "__next__"),
    ("torch/utils/data/dataloader.py", "_next_data"),
    ("torch/utils/data/dataloader.py", "_get_data"),
)
OPTIMIZER_FUNCS: tuple[tuple[str, str], ...] = (
    ("torch/optim/", "step"),
    ("deepspeed/runtime/engine.py", "step"),
    ("deepspeed/runtime/zero/stage3.py", "step"),
    ("deepspeed/runtime/zero/stage_1_and_2.py", "step"),
    ("accelerate/optimizer.py", "step"),
)
BACKWARD_FUNCS: tuple[tuple[str, str], ...] = (
    ("torch/autograd/", "backward"),
    ("torch/autograd/graph.py", "_engine_run_backward"),
    ("torch/_tensor.py", "backward"),
    ("deepspeed/runtime/engine.py", "backward"),
    ("accelerate/accelerator.py", "backward"),
)
FORWARD_FUNCS: tuple[tuple[str, str], ...] = (
    ("torch/nn/modules/module.py", "_call_impl"),
    ("torch/nn/modules/module.py", "_wrapped_call_impl"),
    ("deepspeed/runtime/engine.py", "forward"),
)

LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def _short_path(path: str) -> str:
    p = _norm(path)
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            return p.split(marker, 1)[1]
    parts = p.rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 2 else p


def _matches(frame: Frame, table: Iterable[tuple[str, str]]) -> bool:
    path = _norm(frame.filename)
    return any(frag in path and frame.func == func for frag, func in table)


def _is_library(frame: Frame) -> bool:
    path = _norm(frame.filename)
    return any(m in path for m in LIBRARY_MARKERS)


def _collective_op(frames: Sequence[Frame]) -> tuple[int, str] | None:
    """(index, op) of the outermost collective call in the innermost run of communication frames."""
    found: tuple[int, str] | None = None
    for i, f in enumerate(frames):
        path = _norm(f.filename)
        if any(m in path for m in COMM_MODULES) and f.func in COLLECTIVE_OPS:
            found = (i, f.func)
        elif found is not None:
            break
    return found


def _first(frames: Sequence[Frame], table: Iterable[tuple[str, str]]) -> int | None:
    table = tuple(table)
    for i, f in enumerate(frames):
        if _matches(f, table):
            return i
    return None


def _call_site(frames: Sequence[Frame], start: int = 0) -> str | None:
    for f in frames[start:]:
        if not _is_library(f):
            return f"{_short_path(f.filename)}:{f.line} {f.name}"
    return None


def fingerprint(frames: Sequence[Frame]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for f in frames:
        h.update(f"{f.name}\0{f.filename}\0{f.line}\n".encode())
    return h.hexdigest()


def _classify_thread(t: ThreadStack) -> StackInfo:
    frames = t.frames
    save_at = _first(frames, SAVE_FUNCS)
    eval_at = _first(frames, EVAL_FUNCS)
    coll = _collective_op(frames)
    phase: StackPhase
    op: str | None = None
    site_from = 0
    if save_at is not None:
        phase, op, site_from = StackPhase.CHECKPOINT, frames[save_at].name, save_at
    elif eval_at is not None and _is_library(frames[eval_at]):
        phase, op, site_from = StackPhase.EVAL, frames[eval_at].name, eval_at
    elif coll is not None:
        phase, op, site_from = StackPhase.COLLECTIVE, coll[1], coll[0]
    elif eval_at is not None:
        phase, op, site_from = StackPhase.EVAL, frames[eval_at].name, eval_at
    elif (i := _first(frames, DATA_FUNCS)) is not None:
        phase, op, site_from = StackPhase.DATA, "DataLoader", i
    elif (i := _first(frames, OPTIMIZER_FUNCS)) is not None:
        phase, site_from = StackPhase.OPTIMIZER, i
    elif (i := _first(frames, BACKWARD_FUNCS)) is not None:
        phase, site_from = StackPhase.BACKWARD, i
    elif (i := _first(frames, FORWARD_FUNCS)) is not None:
        phase, site_from = StackPhase.FORWARD, i
    else:
        phase = StackPhase.OTHER
    # the collective the thread waits in, when it lies inside the phase's own frames (innermost first)
    collective = coll[1] if coll is not None and coll[0] <= site_from else None
    return StackInfo(
        phase=phase,
        op=op,
        call_site=_call_site(frames, site_from),
        fingerprint=fingerprint(frames),
        thread=t.thread_name,
        top=tuple(f.short() for f in frames[:8]),
        collective=collective,
    )


_PRIORITY = {
    StackPhase.CHECKPOINT: 0,
    StackPhase.COLLECTIVE: 1,
    StackPhase.EVAL: 2,
    StackPhase.DATA: 3,
    StackPhase.OPTIMIZER: 4,
    StackPhase.BACKWARD: 5,
    StackPhase.FORWARD: 6,
    StackPhase.OTHER: 7,
}


def classify(threads: Sequence[ThreadStack]) -> StackInfo:
    """The rank's place: its main thread's, unless another thread is in a save or a collective (an
    async checkpoint writer, an autograd thread running ZeRO hooks) while the main thread is not."""
    if not threads:
        raise StackError("py-spy dump has no threads")
    infos = [(t, _classify_thread(t)) for t in threads if t.frames]
    if not infos:
        raise StackError("py-spy dump has no thread with Python frames")
    main = next((i for t, i in infos if t.thread_name == "MainThread"), infos[0][1])
    best = min((i for _, i in infos), key=lambda i: _PRIORITY[i.phase])
    if _PRIORITY[best.phase] < _PRIORITY[main.phase] and best.phase in (
        StackPhase.CHECKPOINT,
        StackPhase.COLLECTIVE,
    ):
        return best
    return main


# -- across samples and ranks ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankStack:
    """The sampler's record of one rank: its latest stack and since when it has not changed."""

    rank: int
    pid: int
    info: StackInfo
    sampled_at: float
    """When the latest dump was taken."""
    same_since: float
    """When the first dump showing this same stack was taken."""
    samples: int = 1
    """How many dumps in a row showed it."""

    def frozen_s(self) -> float:
        return max(0.0, self.sampled_at - self.same_since) if self.samples > 1 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            **self.info.to_dict(),
            "sampled_at": self.sampled_at,
            "same_since": self.same_since,
            "same_samples": self.samples,
            "frozen_s": round(self.frozen_s(), 1),
        }


@dataclass(frozen=True, slots=True)
class StackGroup:
    key: str
    """``phase op @ call site``."""
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StackPattern:
    """What the ranks' stacks say together (pure, from fresh samples)."""

    sampled: tuple[int, ...]
    in_save: tuple[int, ...]
    in_eval: tuple[int, ...]
    in_collective: tuple[int, ...]
    frozen: tuple[int, ...]
    """Ranks whose stack stayed the same for at least ``frozen_s``."""
    groups: tuple[StackGroup, ...]
    """Ranks grouped by where they are, largest first."""
    odd: tuple[int, ...]
    """The minority where the ranks disagree (empty when they all agree or tie without a majority
    of one group)."""
    all_frozen_in_collective: bool
    frozen_since: float | None
    """Since when every sampled rank has shown its current stack (max of the ranks' same_since)."""
    save_since: float | None
    in_phase_collective: tuple[int, ...] = ()
    """Ranks inside a save or an eval, waiting in a collective there (not writing, not computing)."""
    in_step: tuple[int, ...] = ()
    """Ranks inside a training step: in a collective outside any save or eval, or in forward,
    backward or the optimizer step (DDP's gradient all-reduce waits in C++ under ``backward``)."""

    @property
    def different(self) -> bool:
        return len(self.groups) > 1


STEP_PHASES = frozenset(
    {StackPhase.COLLECTIVE, StackPhase.FORWARD, StackPhase.BACKWARD, StackPhase.OPTIMIZER}
)
"""Where a rank inside a training step is (outside any save, eval or data wait)."""


def group_key(info: StackInfo) -> str:
    op = f" {info.op}" if info.op else ""
    return f"{info.phase}{op} @ {info.call_site or '?'}"


def stack_pattern(
    ranks: Mapping[int, RankStack], *, now: float, fresh_s: float, frozen_s: float
) -> StackPattern:
    """Compare the ranks' latest stacks taken within ``fresh_s`` of ``now``. The same fresh stacks give
    the same pattern: it is made again only when a dump arrives or a stack ages out (the detector asks
    every process period; the stacks change once a minute on a healthy job)."""
    fresh = {r: s for r, s in sorted(ranks.items()) if now - s.sampled_at <= fresh_s}
    key = (frozen_s, *((r, id(s)) for r, s in fresh.items()))
    known = _PATTERNS.get(key)
    if known is not None:
        return known[0]
    pattern = _pattern(fresh, frozen_s)
    if len(_PATTERNS) >= _PATTERNS_MAX:
        _PATTERNS.clear()
    _PATTERNS[key] = (pattern, tuple(fresh.values()))  # the stacks held: their ids name no other
    return pattern


_PATTERNS_MAX = 256
_PATTERNS: dict[tuple[object, ...], tuple[StackPattern, tuple[RankStack, ...]]] = {}
"""The patterns of the latest fresh stacks (keyed by the stacks' identities: RankStack is frozen, a
new dump is a new one)."""


def _pattern(fresh: dict[int, RankStack], frozen_s: float) -> StackPattern:
    by_key: dict[str, list[int]] = {}
    for r, s in fresh.items():
        by_key.setdefault(group_key(s.info), []).append(r)
    groups = tuple(
        StackGroup(k, tuple(v)) for k, v in sorted(by_key.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    )
    odd: tuple[int, ...] = ()
    if len(groups) > 1 and len(groups[0].ranks) > len(groups[1].ranks):
        odd = tuple(sorted(r for g in groups[1:] for r in g.ranks))
    phase = {r: s.info.phase for r, s in fresh.items()}
    in_save = tuple(r for r, p in phase.items() if p is StackPhase.CHECKPOINT)
    in_coll = tuple(r for r, p in phase.items() if p is StackPhase.COLLECTIVE)
    frozen = tuple(r for r, s in fresh.items() if s.frozen_s() >= frozen_s)
    all_frozen = bool(fresh) and len(in_coll) == len(fresh) and len(frozen) == len(fresh)
    frozen_since = max((s.same_since for s in fresh.values()), default=None) if fresh else None
    save_since = min((fresh[r].same_since for r in in_save), default=None)
    in_phase_coll = tuple(
        r
        for r, s in fresh.items()
        if s.info.phase in (StackPhase.CHECKPOINT, StackPhase.EVAL) and s.info.collective is not None
    )
    in_step = tuple(r for r, p in phase.items() if p in STEP_PHASES)
    return StackPattern(
        sampled=tuple(fresh),
        in_save=in_save,
        in_eval=tuple(r for r, p in phase.items() if p is StackPhase.EVAL),
        in_collective=in_coll,
        frozen=frozen,
        groups=groups,
        odd=odd,
        all_frozen_in_collective=all_frozen,
        frozen_since=frozen_since,
        save_since=save_since,
        in_phase_collective=in_phase_coll,
        in_step=in_step,
    )


@dataclass(frozen=True, slots=True)
class StackSummary:
    """One job's stacks as the detector sees them (immutable)."""

    ranks: Mapping[int, RankStack]
    world_size: int | None
    errors: Mapping[int, str] = field(default_factory=dict)
    sampler: str = AVAILABLE

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampler": self.sampler,
            "world_size": self.world_size,
            "ranks": {str(r): s.to_dict() for r, s in sorted(self.ranks.items())},
            "errors": {str(r): e for r, e in sorted(self.errors.items())},
        }


def describe(ranks: Mapping[int, RankStack]) -> str:
    """One line per group: where the ranks wait (for alerts and logs)."""
    by_key: dict[str, list[int]] = {}
    for r, s in sorted(ranks.items()):
        by_key.setdefault(group_key(s.info), []).append(r)
    return "; ".join(f"rank {','.join(map(str, rs))}: {k}" for k, rs in by_key.items())


__all__ = [
    "STEP_PHASES",
    "Frame",
    "RankStack",
    "StackError",
    "StackGroup",
    "StackInfo",
    "StackPattern",
    "StackPhase",
    "StackSummary",
    "ThreadStack",
    "classify",
    "describe",
    "fingerprint",
    "group_key",
    "parse_dump",
    "stack_pattern",
]
