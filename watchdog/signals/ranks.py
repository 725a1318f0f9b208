"""Rank processes as values, and the pure rules that find them (no process table, no ``/proc``): which
environment names a rank and its job (:func:`rank_env`, :func:`job_key`), which GPU a local rank drives
(:func:`gpu_for_local_rank`, :func:`choose_gpu`), what a launcher looks like (:func:`is_launcher`,
:func:`local_rank_from_cmdline`), whether a progress file's claim on a process holds
(:func:`judge_claim`), which of a parent and child is the rank (:func:`pick_ranks`), the kernel's name
for a job (:func:`kernel_scope`) and each group's final job name (:func:`name_groups`). The inspector
that reads the node with psutil is :mod:`gpu_triage.signals.processes`; what it reports per rank is
:class:`RankProcess`."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_triage.model.names import safe_job_key
from gpu_triage.model.samples import quick_init
from gpu_triage.signals.cgroups import parse_cgroup_path
from gpu_triage.signals.slurm_identity import job_name as slurm_job_name

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.launch")
LAUNCHER_NAMES = ("torchrun",)


# ------------------------------------------------------------------------------------------ pure


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    return int(value) if value.isdigit() else None


@dataclass(frozen=True, slots=True)
class RankEnv:
    """What a process's environment says about its place in a distributed job."""

    rank: int | None
    local_rank: int | None
    world_size: int | None
    cuda_visible_devices: str | None
    job: str | None


def job_key(environ: Mapping[str, str]) -> str | None:
    """A name shared by every rank of one job, from the environment; None if nothing identifies it.
    The environment is its owner's to write: the name is made safe (bounded, printable) here."""
    key = _raw_job_key(environ)
    return None if key is None else safe_job_key(key)


def _raw_job_key(environ: Mapping[str, str]) -> str | None:
    if environ.get("GPU_WATCHDOG_JOB"):
        return environ["GPU_WATCHDOG_JOB"]
    slurm = slurm_job_name(environ)  # slurm-<job>, or slurm-<job>.<step> inside an srun step
    if slurm is not None:
        return slurm
    run_id = environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"torchelastic-{run_id}"
    if environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        return f"master-{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    return None


def rank_env(environ: Mapping[str, str]) -> RankEnv | None:
    """The rank facts of a process, or None when it is no rank (no ``RANK`` nor ``LOCAL_RANK``)."""
    rank = _int_or_none(environ.get("RANK"))
    local_rank = _int_or_none(environ.get("LOCAL_RANK"))
    if rank is None and local_rank is None:
        return None
    return RankEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=_int_or_none(environ.get("WORLD_SIZE")),
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        job=job_key(environ),
    )


def gpu_for_local_rank(
    local_rank: int | None,
    cuda_visible_devices: str | None,
    uuid_to_index: Mapping[str, int] | None = None,
) -> int | None:
    """The physical GPU index a rank uses: entry ``local_rank`` of ``CUDA_VISIBLE_DEVICES`` (indices or
    UUIDs), or its only entry when the launcher gave each rank one device; ``local_rank`` itself when
    the variable is unset. None when it cannot be told."""
    if local_rank is None:
        return None
    if cuda_visible_devices is None:
        return local_rank
    devices = [d.strip() for d in cuda_visible_devices.split(",") if d.strip()]
    if not devices:
        return None
    device = devices[0] if len(devices) == 1 else (devices[local_rank] if local_rank < len(devices) else None)
    if device is None:
        return None
    if device.isdigit():
        return int(device)
    uuids = uuid_to_index or {}
    if device in uuids:
        return uuids[device]
    matches = [i for uuid, i in uuids.items() if uuid.startswith(device)]  # CUDA accepts UUID prefixes
    return matches[0] if len(matches) == 1 else None


def local_rank_from_cmdline(cmdline: Sequence[str]) -> int | None:
    """``--local_rank=N`` / ``--local-rank=N`` / ``--local_rank N`` (deepspeed and torch.distributed.launch
    pass it to each rank)."""
    for i, arg in enumerate(cmdline):
        for flag in ("--local_rank", "--local-rank"):
            if arg.startswith(flag + "="):
                return _int_or_none(arg[len(flag) + 1 :])
            if arg == flag and i + 1 < len(cmdline):
                return _int_or_none(cmdline[i + 1])
    return None


def is_launcher(cmdline: Sequence[str]) -> bool:
    """A per-node launcher whose children are ranks (``torchrun``, ``python -m torch.distributed.run``,
    ``python -m deepspeed.launcher.launch``). The ``deepspeed`` runner is not one: its child is."""
    head = list(cmdline[:4])
    if any(os.path.basename(a) in LAUNCHER_NAMES for a in head[:2]):
        return True
    return any(a in LAUNCHER_MODULES for a in head)


@quick_init  # built for every rank at every discovery (and copied when a progress file claims it)
@dataclass(frozen=True, slots=True)
class Candidate:
    """A process that looks like a rank, before measurement."""

    pid: int
    ppid: int | None
    job: str
    rank: int | None
    local_rank: int | None
    world_size: int | None
    gpu: int | None
    gpus: tuple[int, ...]
    found_by: str
    """'progress', 'nvml', 'environ' or 'launcher'."""
    proof: tuple[str, ...] = ()
    """What ties the process to a job: 'rank_env', 'gpu_context', 'launcher_child', 'progress_file'."""
    uid: int | None = None
    nspid: int | None = None
    """Its pid in its own (innermost) PID namespace, when that differs from ours (a container)."""
    scope: str | None = None
    """Its kernel-level job identity (:func:`kernel_scope`): ``slurm:<id>`` from its Slurm job cgroup,
    ``container:<id>`` from its container's cgroup; None when neither."""
    create_time: float | None = None
    sid: int | None = None
    """Its session (the launcher's process tree where no cgroup names the job)."""


@quick_init  # built once a rank (or a GPU) every process period
@dataclass(frozen=True, slots=True)
class ProgressClaim:
    """What a progress file says about its process: rank ``rank`` of ``job`` is ``pid``."""

    job: str
    rank: int
    pid: int
    local_rank: int | None = None
    host_is_local: bool = True
    """The file's ``host`` is this node's name (else its pid may live in a container's namespace)."""
    owner_uid: int | None = None
    """The file's owner (None: unknown)."""


@dataclass(frozen=True, slots=True)
class UntrustedClaim:
    """A progress file whose pid names a process that is not proven to be the rank it claims."""

    job: str
    rank: int
    pid: int
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"job": self.job, "rank": self.rank, "pid": self.pid, "reason": self.reason}


def judge_claim(claim: ProgressClaim, cand: Candidate, env: RankEnv | None) -> str | None:
    """Why ``cand`` is NOT the process ``claim`` names (None: it is). Pure.

    A progress file is only a claim: anyone in the training group can write one. The process it names
    is believed to be the rank when it carries a rank environment that agrees with the file (``RANK``,
    or ``LOCAL_RANK`` where ``RANK`` is unset), or holds a GPU context, or descends from a launcher -
    and belongs to the file's owner (or the file to root). A readable environment that contradicts
    the file refutes it whatever else holds.
    """
    if env is not None:
        if env.rank is not None and env.rank != claim.rank:
            return f"pid {cand.pid}'s environment says RANK={env.rank}, the file says rank {claim.rank}"
        if env.rank is None and claim.local_rank is not None and env.local_rank != claim.local_rank:
            return (
                f"pid {cand.pid}'s environment says LOCAL_RANK={env.local_rank}, "
                f"the file says local_rank {claim.local_rank}"
            )
    proof = set(cand.proof) & {"rank_env", "gpu_context", "launcher_child"}
    if not proof:
        return f"pid {cand.pid} has no rank environment, no GPU context and no launcher parent"
    if claim.owner_uid not in (None, 0) and cand.uid is not None and cand.uid != claim.owner_uid:
        return f"pid {cand.pid} belongs to uid {cand.uid}, the file to uid {claim.owner_uid}"
    return None


def pick_ranks(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Of a parent and child with the same job and rank, keep one: the one a progress file names
    (a wrapper - ``unshare``, a shell - may carry the rank's environment too), else the parent (the
    child is a data-loader worker)."""
    cands = list(candidates)
    by_pid = {c.pid: c for c in cands}
    drop: set[int] = set()
    for c in cands:
        parent = by_pid.get(c.ppid) if c.ppid is not None else None
        if parent is None or parent.job != c.job or parent.rank != c.rank:
            continue
        if "progress_file" in c.proof and "progress_file" not in parent.proof:
            drop.add(parent.pid)
        else:
            drop.add(c.pid)
    return [c for c in cands if c.pid not in drop]


def choose_gpu(nvml_gpus: Sequence[int], env_gpu: int | None) -> int | None:
    """NVML is authoritative; a rank that also holds a stray context on another GPU (every rank on
    GPU 0, a classic) is placed by its environment when that agrees with one of them."""
    if env_gpu is not None and (not nvml_gpus or env_gpu in nvml_gpus):
        return env_gpu
    if len(nvml_gpus) == 1:
        return nvml_gpus[0]
    return None


@quick_init  # built 16 at a time (model/samples.quick_init)
@dataclass(frozen=True, slots=True)
class RankProcess:
    job: str
    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    gpu: int | None
    """The GPU this rank drives (NVML, else LOCAL_RANK + CUDA_VISIBLE_DEVICES)."""
    gpus: tuple[int, ...]
    """Every GPU NVML lists the pid on."""
    found_by: str
    alive: bool
    status: str | None
    """psutil status: 'running', 'sleeping', 'disk-sleep' (D-state), 'stopped', 'zombie'...; None if gone."""
    pgid: int | None
    cpu_time_s: float | None
    """User + system CPU seconds since the process started."""
    cpu_time_delta_s: float | None
    read_bytes_delta: int | None
    write_bytes_delta: int | None
    read_chars_delta: int | None
    write_chars_delta: int | None
    interval_s: float | None
    """Seconds the deltas cover (None on the first measurement of this process)."""
    gone_since_s: float | None = None
    proof: tuple[str, ...] = ()
    """What ties it to the job (see :class:`Candidate`); a process without proof is never signalled."""
    uid: int | None = None
    create_time: float | None = None
    """With ``pid`` and ``uid``, the identity a signal is checked against (a recycled pid never matches)."""
    scope: str | None = None


def launcher_above(
    ppid: int | None, infos: Mapping[int, tuple[int | None, list[str], object]], launchers: set[int]
) -> int | None:
    """The launcher among the first three ancestors (a rank may sit under a wrapper), or None."""
    seen = 0
    while ppid is not None and seen < 3:
        if ppid in launchers:
            return ppid
        info = infos.get(ppid)
        ppid = info[0] if info is not None else None
        seen += 1
    return None


def group_identity(c: Candidate) -> tuple[str, int | None, str | None]:
    """What a group of candidates shares: (environment job name, owner uid, kernel scope)."""
    return (c.job, c.uid, c.scope)


def name_groups(
    cands: Sequence[Candidate],
    renames: Mapping[tuple[str, int | None, str | None], str],
    claimed_trees: Mapping[tuple[str, int | None, str | None], set[tuple[str, int]]] | None = None,
) -> list[Candidate]:
    """Final job names (pure). Candidates are grouped by (environment job name, owner uid, kernel
    scope). A process a progress file claimed (with proof) is in the claim's job; so is the rest of its
    group (``renames``) - where no cgroup names the job, only the processes that share a claimed
    process's session or parent (``claimed_trees``: the launcher's process tree), so a same-named job
    of the same user started elsewhere stays apart. A name that two groups would share goes to one of
    them: the claimed group first, else the one with the oldest process (a later process cannot take a
    running job's name); each other group gets the name with ``@uid<uid>`` (another owner), ``@<scope>`` or
    ``@sid<session>`` appended, so no group ever joins another's job."""
    final: dict[tuple[str, int | None, str | None, bool], list[Candidate]] = {}
    for c in cands:
        ident = group_identity(c)
        if "progress_file" in c.proof:
            name, claimed = c.job, True
        elif ident in renames and (
            c.scope is not None
            or claimed_trees is None
            or bool(tree_marks(c) & claimed_trees.get(ident, set()))
        ):
            name, claimed = renames[ident], True
        else:
            name, claimed = c.job, False
        final.setdefault((name, c.uid, c.scope, claimed), []).append(c)
    best: dict[str, tuple[tuple[int, float], tuple[int | None, str | None, bool]]] = {}
    for (name, uid, scope, claimed), members in final.items():
        oldest = min((c.create_time if c.create_time is not None else float("inf")) for c in members)
        rank = (0 if claimed else 1, oldest)
        if name not in best or rank < best[name][0]:
            best[name] = (rank, (uid, scope, claimed))
    out = []
    for (name, uid, scope, claimed), members in final.items():
        w_uid, w_scope, w_claimed = best[name][1]
        job = name
        if (uid, scope, claimed) != (w_uid, w_scope, w_claimed) and not claimed:
            if uid != w_uid:
                job = f"{name}@uid{uid}"
            elif scope != w_scope:
                job = f"{name}@{scope}"
            else:
                sids = [c.sid for c in members if c.sid is not None]
                job = f"{name}@sid{min(sids)}" if sids else f"{name}@other"
        for c in members:
            keep = "progress_file" in c.proof or c.job == job
            out.append(c if keep else dataclasses.replace(c, job=job))
    return out


def kernel_scope(cgroup_text: str | None) -> str | None:
    """The kernel-level job identity in ``/proc/PID/cgroup`` text (pure): the Slurm job cgroup
    (``.../job_<id>/...``, made by slurmd) or a container's cgroup; None for neither."""
    if not cgroup_text:
        return None
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUP_JOB.search(path)
        if m is not None:
            return f"slurm:{m.group(1)}"
    for line in cgroup_text.splitlines():
        pod = parse_cgroup_path(line.split(":", 2)[-1])
        if pod is not None:
            return f"container:{(pod.container_id or pod.pod_uid)[:16]}"
    return None


_CGROUP_JOB = re.compile(r"/job_(\d{1,20})(?:/|$)")


def tree_marks(c: Candidate) -> set[tuple[str, int]]:
    """Where ``c`` sits in the process tree: its session and its parent (not init)."""
    out: set[tuple[str, int]] = set()
    if c.sid is not None and c.sid > 1:
        out.add(("sid", c.sid))
    if c.ppid is not None and c.ppid > 1:
        out.add(("ppid", c.ppid))
    return out


__all__ = [
    "Candidate",
    "ProgressClaim",
    "RankEnv",
    "RankProcess",
    "UntrustedClaim",
    "choose_gpu",
    "gpu_for_local_rank",
    "group_identity",
    "is_launcher",
    "job_key",
    "judge_claim",
    "kernel_scope",
    "launcher_above",
    "local_rank_from_cmdline",
    "name_groups",
    "pick_ranks",
    "rank_env",
    "tree_marks",
]
