"""The process inspector: find each job's rank processes on this node and measure them (psutil).

Finding ranks (a *discovery*, at most every ``discovery_interval_s`` unless a new pid shows up):

1. progress files: ``{job: {rank: pid}}`` (the reader's :meth:`JobProgress.pids`) - names the job;
2. NVML compute pids per GPU (``{gpu: [pid, ...]}``) - ties a pid to its GPU(s);
3. the environment of every process (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
   ``CUDA_VISIBLE_DEVICES``, and the job from ``GPU_WATCHDOG_JOB``, ``SLURM_JOB_ID``,
   ``TORCHELASTIC_RUN_ID`` or ``MASTER_ADDR``/``MASTER_PORT``). Reading another user's
   ``/proc/<pid>/environ`` needs ``CAP_SYS_PTRACE``; a denied read is counted, not an error. Data
   loader workers inherit their rank's environment: of a parent and child with the same job and rank,
   only the parent is the rank. A scan reads every process's environment (about 150 us a process
   here), so by default it runs only when NVML reported no pids (``--source none``, CPU jobs) and at
   most every ``environ_scan_interval_s`` (30 s); in between, discoveries look only at listed pids;
4. the launcher's process tree: the children of ``torchrun`` / ``torch.distributed.run`` /
   ``deepspeed.launcher.launch`` are ranks even when their environment cannot be read (the local rank
   then comes from ``--local_rank=N`` in the command line).

A job found only through 3 or 4 is named by the environment (``slurm-<id>[.<step>]``, ``master-<addr>:<port>``
...) or ``launcher-<pid>``; when any of its pids is in a progress file the whole group takes the
progress file's job name.

Measuring (every call, cheap): for each known rank, inside ``psutil.Process.oneshot()``: status
(``disk-sleep`` is the D-state), CPU time, I/O counters (``read_bytes``/``write_bytes`` reach the
storage layer; ``read_chars``/``write_chars`` count every read/write call, pipes and sockets included;
None where ``/proc/<pid>/io`` cannot be read), and the process group id. Deltas are between this call
and the previous one for the same (pid, create time). ``psutil.Process`` objects are cached by
(pid, create time). A process that vanished is reported ``alive=False`` (never an error) until
``forget_after_s`` has passed.

Pure helpers (``rank_env``, ``gpu_for_local_rank``, ``local_rank_from_cmdline``, ``is_launcher``,
``job_key``, ``pick_ranks``) hold the rules; :class:`ProcessInspector` does the I/O.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from gpu_triage.model.names import safe_job_key
from gpu_triage.signals.cgroups import parse_cgroup_path
from gpu_triage.signals.rank_process import ProcessView, ProgressClaim, RankProcess, UntrustedClaim
from gpu_triage.signals.slurm import job_name as slurm_job_name

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.launch")
LAUNCHER_NAMES = ("torchrun",)
DEAD_STATUSES = frozenset({psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD})


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


# ------------------------------------------------------------------------------------------- view


@dataclass(slots=True)
class _Tracked:
    proc: psutil.Process
    create_time: float
    cand: Candidate
    last: tuple[float, float, tuple[int, int, int, int] | None] | None = None
    """(time_s, cpu_time_s, io (read_bytes, write_bytes, read_chars, write_chars)) of the last read."""
    gone_since_s: float | None = None
    status: str | None = None
    pgid: int | None = None


# --------------------------------------------------------------------------------------- inspector


class ProcessInspector:
    """Keeps the set of rank processes and measures them. Not thread-safe: the loop thread owns it."""

    def __init__(
        self,
        *,
        discovery_interval_s: float = 10.0,
        environ_scan_interval_s: float = 30.0,
        forget_after_s: float = 60.0,
        always_scan_environ: bool = False,
        own_pid: int | None = None,
    ) -> None:
        self.discovery_interval_s = discovery_interval_s
        self.environ_scan_interval_s = environ_scan_interval_s
        self._last_scan_s: float | None = None
        self.forget_after_s = forget_after_s
        self.always_scan_environ = always_scan_environ
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self._tracked: dict[int, _Tracked] = {}
        self._procs: dict[tuple[int, float], psutil.Process] = {}
        self._last_discovery_s: float | None = None
        self._known_inputs: frozenset[int] = frozenset()
        self.discoveries_total = 0
        self.processes_created_total = 0
        """psutil.Process objects built (the cache keeps this flat in steady state)."""
        self.environ_denied_total = 0
        self.last_discovery_duration_s = 0.0
        self._untrusted: tuple[UntrustedClaim, ...] = ()

    # ---------------------------------------------------------------------------------- public

    def inspect(
        self,
        now_s: float,
        *,
        gpu_pids: Mapping[int, Sequence[int]] | None = None,
        progress_pids: Mapping[str, Mapping[int, int]] | None = None,
        claims: Sequence[ProgressClaim] | None = None,
        uuid_to_index: Mapping[str, int] | None = None,
    ) -> ProcessView:
        """Measure every known rank; run a discovery first when due or when a pid appears in
        ``gpu_pids`` / the progress claims that is not known yet. ``progress_pids`` ({job: {rank:
        pid}}) is the short form of ``claims`` (local host, owner unknown). Never raises for vanished
        processes."""
        gpu_pids = gpu_pids or {}
        all_claims = list(claims or ()) + [
            ProgressClaim(job, rank, pid)
            for job, ranks in (progress_pids or {}).items()
            for rank, pid in ranks.items()
        ]
        inputs = frozenset(p for pids in gpu_pids.values() for p in pids) | frozenset(
            c.pid for c in all_claims
        )
        due = self._last_discovery_s is None or now_s - self._last_discovery_s >= self.discovery_interval_s
        denied = 0
        discovered = False
        if due or not inputs <= self._known_inputs:
            denied = self._discover(now_s, gpu_pids, all_claims, uuid_to_index or {})
            self._known_inputs = inputs
            discovered = True
        jobs: dict[str, list[RankProcess]] = {}
        for pid, tracked in list(self._tracked.items()):
            view = self._measure(tracked, now_s)
            if view.gone_since_s is not None and now_s - view.gone_since_s >= self.forget_after_s:
                del self._tracked[pid]
                self._procs.pop((pid, tracked.create_time), None)
                continue
            jobs.setdefault(view.job, []).append(view)
        ordered = {
            job: tuple(sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.pid)))
            for job, ranks in sorted(jobs.items())
        }
        return ProcessView(now_s, ordered, discovered, denied, self._untrusted)

    # -------------------------------------------------------------------------------- discovery

    def _process(self, pid: int) -> tuple[psutil.Process, float] | None:
        """The cached psutil.Process for ``pid`` (by pid and create time), or None if it is gone."""
        tracked = self._tracked.get(pid)
        try:
            if tracked is not None and tracked.proc.is_running():
                return tracked.proc, tracked.create_time
            proc = psutil.Process(pid)
            create_time = proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        cached = self._procs.get((pid, create_time))
        if cached is not None:
            return cached, create_time
        self.processes_created_total += 1
        self._procs[(pid, create_time)] = proc
        return proc, create_time

    def _discover(
        self,
        now_s: float,
        gpu_pids: Mapping[int, Sequence[int]],
        claims: Sequence[ProgressClaim],
        uuid_to_index: Mapping[str, int],
    ) -> int:
        started = time.perf_counter()
        self._last_discovery_s = now_s
        self.discoveries_total += 1
        nvml_gpus: dict[int, list[int]] = {}
        for gpu, pids in gpu_pids.items():
            for pid in pids:
                nvml_gpus.setdefault(pid, []).append(gpu)

        found: dict[int, Candidate] = {}
        envs: dict[int, RankEnv | None] = {}
        denied = 0
        scan_environ = (self.always_scan_environ or not nvml_gpus) and (
            self._last_scan_s is None or now_s - self._last_scan_s >= self.environ_scan_interval_s
        )
        if scan_environ:
            self._last_scan_s = now_s
        claimed = {c.pid for c in claims if c.host_is_local}
        listed: set[int] = set(nvml_gpus) | claimed

        # The environment (and the launcher tree) of every process, or only of the listed pids.
        launchers: list[int] = []
        infos: dict[int, tuple[int | None, list[str], psutil.Process | None]] = {}
        if scan_environ:
            for listed_proc in psutil.process_iter(["ppid", "cmdline"]):
                info = listed_proc.info
                infos[listed_proc.pid] = (info.get("ppid"), info.get("cmdline") or [], listed_proc)
        for pid in listed - set(infos):
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    infos[pid] = (p.ppid(), p.cmdline(), p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                infos.setdefault(pid, (None, [], None))
        for pid, (_, cmdline, proc) in infos.items():
            if proc is not None and pid not in (self.own_pid, 1) and is_launcher(cmdline):
                launchers.append(pid)
        launcher_set = set(launchers)

        for pid, (ppid, cmdline, proc) in infos.items():
            if pid in (self.own_pid, 1) or proc is None or (not cmdline and pid not in listed):
                continue  # ourselves, init, kernel threads, gone
            if pid in launcher_set:
                continue
            env: RankEnv | None = None
            try:
                env = rank_env(proc.environ())
            except psutil.AccessDenied:
                denied += 1
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            gpus = tuple(sorted(nvml_gpus.get(pid, ())))
            under_launcher = _under(ppid, infos, launcher_set)
            proof = tuple(
                name
                for name, holds in (
                    ("rank_env", env is not None),
                    ("gpu_context", bool(gpus)),
                    ("launcher_child", under_launcher is not None),
                )
                if holds
            )
            if not proof and pid not in claimed:
                continue
            local_rank = env.local_rank if env else None
            if local_rank is None:
                local_rank = local_rank_from_cmdline(cmdline)
            cvd = env.cuda_visible_devices if env else None
            # LOCAL_RANK alone names a GPU only where NVML lists no process at all (a simulation, a
            # CPU node): where it does list some and not this one, guessing would put this job on
            # another job's GPU.
            guess_ok = cvd is not None or not nvml_gpus
            env_gpu = gpu_for_local_rank(local_rank, cvd, uuid_to_index) if guess_ok else None
            scope = kernel_scope(_read_cgroup(pid))
            if env is not None and env.job:
                job = env.job
                if scope is not None and scope.startswith("slurm:") and job.startswith("slurm-"):
                    # The kernel names the Slurm job: an environment naming another is not believed.
                    kernel_id = scope.split(":", 1)[1]
                    if job.split("-", 1)[1].split(".", 1)[0] != kernel_id:
                        job = f"slurm-{kernel_id}"
            elif under_launcher is not None:
                job = f"launcher-{under_launcher}"
            else:
                job = f"pgid-{_pgid(pid)}"
            envs[pid] = env
            found[pid] = Candidate(
                pid=pid,
                ppid=ppid,
                job=job,
                rank=env.rank if env else None,
                local_rank=local_rank,
                world_size=env.world_size if env else None,
                gpu=choose_gpu(gpus, env_gpu if env else None)
                if (env or gpus)
                else (gpu_for_local_rank(local_rank, None) if not nvml_gpus else None),
                gpus=gpus,
                found_by="nvml" if gpus else ("environ" if env else "launcher"),
                proof=proof,
                uid=_uid(proc),
                nspid=_nspid(pid),
                scope=scope,
                sid=_sid(pid),
                create_time=_create_time(proc),
            )

        if not scan_environ:  # ranks found by the last scan stay until the next one
            for pid, old in self._tracked.items():
                if (
                    pid not in found
                    and old.gone_since_s is None
                    and old.cand.found_by in ("environ", "launcher")
                ):
                    found[pid] = old.cand

        # Progress files are claims: each is joined to the process it names only with proof.
        untrusted: list[UntrustedClaim] = []
        renames: dict[tuple[str, int | None, str | None], str] = {}
        claimed_trees: dict[tuple[str, int | None, str | None], set[tuple[str, int]]] = {}
        by_nspid: dict[int, list[Candidate]] = {}
        for c in found.values():
            if c.nspid is not None and c.nspid != c.pid:
                by_nspid.setdefault(c.nspid, []).append(c)
        for claim in claims:
            direct = found.get(claim.pid) if claim.host_is_local else None
            inner = by_nspid.get(claim.pid, [])
            options = ([direct] if direct is not None else []) + inner
            reasons: list[str] = []
            chosen: Candidate | None = None
            for cand in options:
                why = judge_claim(claim, cand, envs.get(cand.pid))
                if why is None:
                    chosen = cand
                    break
                reasons.append(why)
            if chosen is None:
                if reasons:
                    untrusted.append(UntrustedClaim(claim.job, claim.rank, claim.pid, "; ".join(reasons)))
                continue  # or: the pid is not here (gone, or on another node): the file speaks alone
            renames.setdefault(_identity(chosen), claim.job)
            claimed_trees.setdefault(_identity(chosen), set()).update(_tree(chosen))
            found[chosen.pid] = dataclasses.replace(
                chosen,
                job=claim.job,
                rank=claim.rank,
                local_rank=chosen.local_rank if chosen.local_rank is not None else claim.local_rank,
                found_by="progress",
                proof=(*chosen.proof, "progress_file"),
            )
        # Drop refused candidates that are nothing but the claim (no proof of their own).
        for u in untrusted:
            refused = found.get(u.pid)
            if refused is not None and not refused.proof:
                del found[u.pid]
        self._untrusted = tuple(untrusted)

        # A group - one environment job name, one owner, one kernel identity - with any pid joined to a
        # progress file takes the progress file's job name; groups of other owners or identities that
        # carry the same environment name never follow (another user's processes never join a job).
        ranks = name_groups(list(found.values()), renames, claimed_trees)
        ranks = pick_ranks(ranks)

        tracked: dict[int, _Tracked] = {}
        for cand in ranks:
            got = self._process(cand.pid)
            if got is None:
                continue
            proc, create_time = got
            previous = self._tracked.get(cand.pid)
            same = previous is not None and previous.create_time == create_time
            tracked[cand.pid] = _Tracked(
                proc, create_time, cand, previous.last if same and previous else None, None, None, None
            )
        for pid, old in self._tracked.items():  # keep the dead in view until forgotten
            if pid not in tracked and old.gone_since_s is not None:
                tracked[pid] = old
        self._tracked = tracked
        live_keys = {(pid, t.create_time) for pid, t in tracked.items()}
        self._procs = {k: v for k, v in self._procs.items() if k in live_keys}
        self.environ_denied_total += denied
        self.last_discovery_duration_s = time.perf_counter() - started
        return denied

    # -------------------------------------------------------------------------------- measuring

    def _measure(self, t: _Tracked, now_s: float) -> RankProcess:
        c = t.cand
        cpu_s: float | None = None
        io: tuple[int, int, int, int] | None = None
        if t.gone_since_s is None:
            try:
                with t.proc.oneshot():
                    status = t.proc.status()
                    times = t.proc.cpu_times()
                    cpu_s = times.user + times.system
                    try:
                        counters = t.proc.io_counters()
                        io = (
                            counters.read_bytes,
                            counters.write_bytes,
                            getattr(counters, "read_chars", 0),
                            getattr(counters, "write_chars", 0),
                        )
                    except (psutil.AccessDenied, NotImplementedError):
                        io = None
                t.status = status
                t.pgid = _pgid(t.proc.pid)
                if status in DEAD_STATUSES:
                    t.gone_since_s = now_s
            except psutil.NoSuchProcess:  # includes ZombieProcess
                t.gone_since_s = now_s
                t.status = None
            except psutil.AccessDenied:
                t.status = None
        if t.gone_since_s is not None:
            return RankProcess(
                c.job, c.pid, c.rank, c.local_rank, c.world_size, c.gpu, c.gpus, c.found_by,
                alive=False, status=t.status, pgid=t.pgid, cpu_time_s=None, cpu_time_delta_s=None,
                read_bytes_delta=None, write_bytes_delta=None, read_chars_delta=None,
                write_chars_delta=None, interval_s=None, gone_since_s=t.gone_since_s,
                proof=c.proof, uid=c.uid, create_time=t.create_time, scope=c.scope,
            )  # fmt: skip
        deltas: list[int | None] = [None, None, None, None]
        cpu_delta = interval = None
        if t.last is not None and cpu_s is not None:
            last_s, last_cpu, last_io = t.last
            interval = now_s - last_s
            cpu_delta = max(0.0, cpu_s - last_cpu)
            if io is not None and last_io is not None:
                deltas = [max(0, a - b) for a, b in zip(io, last_io, strict=True)]
        if cpu_s is not None:
            t.last = (now_s, cpu_s, io)
        return RankProcess(
            c.job, c.pid, c.rank, c.local_rank, c.world_size, c.gpu, c.gpus, c.found_by,
            alive=True, status=t.status, pgid=t.pgid, cpu_time_s=cpu_s, cpu_time_delta_s=cpu_delta,
            read_bytes_delta=deltas[0], write_bytes_delta=deltas[1], read_chars_delta=deltas[2],
            write_chars_delta=deltas[3], interval_s=interval, proof=c.proof, uid=c.uid,
            create_time=t.create_time, scope=c.scope,
        )  # fmt: skip


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _uid(proc: psutil.Process) -> int | None:
    try:
        return proc.uids().real
    except (psutil.Error, OSError):
        return None


def _nspid(pid: int) -> int | None:
    """The pid in the innermost PID namespace (``NSpid`` in /proc/PID/status), when nested."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    fields = line.split()[1:]
                    return int(fields[-1]) if len(fields) > 1 else None
    except (OSError, ValueError):
        return None
    return None


def _under(
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


def _identity(c: Candidate) -> tuple[str, int | None, str | None]:
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
        ident = _identity(c)
        if "progress_file" in c.proof:
            name, claimed = c.job, True
        elif ident in renames and (
            c.scope is not None or claimed_trees is None or bool(_tree(c) & claimed_trees.get(ident, set()))
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


def _read_cgroup(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return f.read(65536).decode("utf-8", "replace")
    except OSError:
        return None


def _tree(c: Candidate) -> set[tuple[str, int]]:
    """Where ``c`` sits in the process tree: its session and its parent (not init)."""
    out: set[tuple[str, int]] = set()
    if c.sid is not None and c.sid > 1:
        out.add(("sid", c.sid))
    if c.ppid is not None and c.ppid > 1:
        out.add(("ppid", c.ppid))
    return out


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _create_time(proc: psutil.Process) -> float | None:
    try:
        return proc.create_time()
    except (psutil.Error, OSError):
        return None


__all__ = [
    "Candidate",
    "ProcessInspector",
    "RankEnv",
    "choose_gpu",
    "gpu_for_local_rank",
    "is_launcher",
    "job_key",
    "judge_claim",
    "kernel_scope",
    "local_rank_from_cmdline",
    "name_groups",
    "pick_ranks",
    "rank_env",
]
