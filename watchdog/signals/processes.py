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

What discovery reads about a process is kept (:class:`_Known`) while its start time and its program
(:attr:`procfs.ProcIdentity.program`: where ``execve`` laid out its arguments and environment) stay the
same: a rediscovery costs one read of ``/proc/<pid>/stat`` per process seen before, and only a new
process - or one that ran another program since, or one whose program cannot be seen (another user's
without ``CAP_SYS_PTRACE``) - is read in full through psutil: command line, owner, start time, and when
first needed its environment, innermost pid and cgroup. Its parent and session are read each time.
(A process that rewrites its command line in place - ``setproctitle`` - or moves to another cgroup
without running another program keeps what was first read: ranks do neither.)

Measuring (every call, cheap): for each known rank, one ``pread`` of ``/proc/<pid>/stat`` and one of
``/proc/<pid>/io``, kept open while the rank is tracked (:class:`procfs.ProcFiles`; psutil's
``oneshot()`` where there is no ``/proc``): status (``disk-sleep`` is the D-state), CPU time, I/O
counters (``read_bytes``/``write_bytes`` reach the storage layer; ``read_chars``/``write_chars`` count
every read/write call, pipes and sockets included; None where ``/proc/<pid>/io`` cannot be read), and
the process group id. Deltas are between this call and the previous one for the same (pid, create
time). A process that vanished - or whose pid now names a process started at another time - is
reported ``alive=False`` (never an error) until ``forget_after_s`` has passed; its files are closed as
soon as it is found gone (:meth:`ProcessInspector.close` closes the rest).

The rules (``rank_env``, ``gpu_for_local_rank``, ``local_rank_from_cmdline``, ``is_launcher``,
``job_key``, ``judge_claim``, ``pick_ranks``, ``name_groups``) and the values (:class:`RankProcess`,
the candidates and claims) are pure, in :mod:`gpu_triage.signals.ranks`; :class:`ProcessInspector`
here does the I/O.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psutil

from gpu_triage.signals import procfs
from gpu_triage.signals.ranks import (
    Candidate,
    ProgressClaim,
    RankEnv,
    RankProcess,
    UntrustedClaim,
    choose_gpu,
    gpu_for_local_rank,
    group_identity,
    is_launcher,
    judge_claim,
    kernel_scope,
    launcher_above,
    local_rank_from_cmdline,
    name_groups,
    pick_ranks,
    rank_env,
    tree_marks,
)

DEAD_STATUSES = frozenset({psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD})
ProcInfo = tuple[int | None, list[str], "_Known | None"]
"""(ppid, command line, what is known) of one pid; the last None where it could not be read."""
GroupKey = tuple[str, int | None, str | None]


# ------------------------------------------------------------------------------------------ scope


@dataclass(slots=True)
class SessionScope:
    """The only processes a daemon judges when it watches a simulated job (``--source sim``): those of
    one session - the simulated job's launcher started it (``setsid``) and every rank inherits it -
    and of the launcher's owner. The kernel keeps the proof: a process cannot join a session it did not
    inherit (``setsid`` only makes a new one, named by the caller's own pid), and the session's number
    cannot name another session while any member, the leader included (a zombie too), exists. Once
    the leader is gone, only processes created before it was last seen alive are believed: a new
    session under a recycled number is younger. ``sid`` None: a scope that holds no process at all
    (a simulation without its job judges progress files alone, never the machine's processes)."""

    sid: int | None
    uid: int | None = None
    leader_create_time: float | None = None
    leader_seen_s: float | None = None
    """Wall-clock second the leader was last seen alive (None: it is gone since the scope was made)."""
    leader_alive: bool = True

    @classmethod
    def nothing(cls) -> SessionScope:
        return cls(None, leader_alive=False)

    @classmethod
    def of_leader(cls, pid: int) -> SessionScope:
        """The session ``pid`` leads. Raises ValueError when there is no such process or it leads no
        session (its command must be started in a new session: ``start_new_session=True``, ``setsid``)."""
        try:
            proc = psutil.Process(pid)
            create_time = proc.create_time()
            uid = proc.uids().real
            sid = os.getsid(pid)
        except (psutil.Error, OSError) as e:
            raise ValueError(f"simulated job pid {pid}: no such process ({type(e).__name__})") from None
        if sid != pid:
            raise ValueError(
                f"simulated job pid {pid} leads no session (it is in session {sid}): start it in a new "
                "session (setsid), so that the daemon can tell its processes from the machine's others"
            )
        return cls(pid, uid, create_time, time.time())

    def refresh(self, now_wall_s: float) -> None:
        """Is the leader still there (zombie included)? Called once per discovery."""
        if self.sid is None or not self.leader_alive:
            return
        try:
            same = psutil.Process(self.sid).create_time() == self.leader_create_time
        except psutil.Error:
            same = False
        if same:
            self.leader_seen_s = now_wall_s
        else:
            self.leader_alive = False

    def holds(self, pid: int, uid: int | None, create_time: float | None) -> bool:
        """Whether ``pid`` (owned by ``uid``, created at ``create_time``) is one of the session's."""
        if self.sid is None or uid != self.uid or create_time is None:
            return False
        if self.leader_create_time is not None and create_time < self.leader_create_time:
            return False
        if not self.leader_alive and (self.leader_seen_s is None or create_time > self.leader_seen_s):
            return False
        try:
            return os.getsid(pid) == self.sid
        except OSError:
            return False

    def in_session(self, pid: int) -> bool:
        """The cheap first test (one system call): is ``pid`` in the session at all?"""
        try:
            return self.sid is not None and os.getsid(pid) == self.sid
        except OSError:
            return False

    def holds_pid(self, pid: int) -> bool:
        """:meth:`holds` for a pid alone (reads its owner and start time)."""
        if self.sid is None:
            return False
        try:
            proc = psutil.Process(pid)
            return self.holds(pid, proc.uids().real, proc.create_time())
        except psutil.Error:
            return False


# ------------------------------------------------------------------------------------------- view


@dataclass(frozen=True, slots=True)
class ProcessView:
    time_s: float
    jobs: Mapping[str, tuple[RankProcess, ...]]
    """Ranks per job, sorted by rank (unknown ranks last)."""
    discovered: bool = False
    """Whether this call ran a discovery."""
    environ_denied: int = 0
    """Processes whose environment could not be read in this call's discovery."""
    untrusted: tuple[UntrustedClaim, ...] = ()
    """Progress-file claims refused by the last discovery (never adopted, never signalled)."""

    def by_pid(self) -> dict[int, RankProcess]:
        return {r.pid: r for ranks in self.jobs.values() for r in ranks}


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
    start_ticks: int | None = None
    """The process's start time in clock ticks since boot, as ``/proc`` first showed it (pid reuse)."""
    files: procfs.ProcFiles | None = None
    """Its ``stat`` and ``io``, kept open while it is tracked (None: not opened yet, or gone)."""

    def close(self) -> None:
        if self.files is not None:
            self.files.close()
            self.files = None


@dataclass(slots=True)
class _Known:
    """What discovery read about one program run in one process - its command line, owner, start
    time, and when first asked its environment, innermost pid and cgroup - kept while ``key`` (start
    time, :attr:`procfs.ProcIdentity.program`) stays the same: a discovery reads one ``stat`` for a
    process it has seen, not six files (issue 30). An ``execve`` changes ``program``, and all is read
    again; so is everything of a process whose ``program`` cannot be seen (not ``cacheable``)."""

    key: tuple[object, ...]
    proc: psutil.Process
    cmdline: list[str]
    cmdline_denied: bool
    uid: int | None
    create_time: float | None
    cacheable: bool
    env: tuple[RankEnv | None, bool] | None = None
    """(rank environment, denied) once read."""
    kernel: tuple[int | None, str | None] | None = None
    """(innermost pid, kernel scope from the cgroup) once read."""

    def environ(self) -> tuple[RankEnv | None, bool]:
        """(the rank environment or None, whether it could not be read). Raises psutil.NoSuchProcess
        (ZombieProcess included) where the process is gone."""
        if self.env is not None:
            return self.env
        try:
            env: tuple[RankEnv | None, bool] = (rank_env(self.proc.environ()), False)
        except psutil.AccessDenied:
            env = (None, True)
        if self.cacheable:
            self.env = env
        return env

    def kernel_facts(self, pid: int) -> tuple[int | None, str | None]:
        """(innermost pid, kernel scope from the cgroup)."""
        if self.kernel is not None:
            return self.kernel
        kernel = (_nspid(pid), kernel_scope(_read_cgroup(pid)))
        if self.cacheable:
            self.kernel = kernel
        return kernel


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
        scope: SessionScope | None = None,
    ) -> None:
        """``scope``: judge only the processes it holds (a simulated job's session); None: every
        process of the node."""
        self.discovery_interval_s = discovery_interval_s
        self.environ_scan_interval_s = environ_scan_interval_s
        self._last_scan_s: float | None = None
        self.forget_after_s = forget_after_s
        self.always_scan_environ = always_scan_environ
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.scope = scope
        self._tracked: dict[int, _Tracked] = {}
        self._known: dict[int, _Known] = {}
        """What discovery read about each process it looked at (see :class:`_Known`)."""
        self._scanned: frozenset[int] = frozenset()
        """The pids of the last environment scan (their :class:`_Known` kept until the next)."""
        self._last_discovery_s: float | None = None
        self._known_inputs: frozenset[int] = frozenset()
        self.discoveries_total = 0
        self.processes_created_total = 0
        """Processes read in full - psutil.Process objects built (flat in steady state: a process seen
        before is recognised by one read of its ``stat``)."""
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
        inputs = frozenset([p for pids in gpu_pids.values() for p in pids]) | frozenset(
            [c.pid for c in all_claims]
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
                tracked.close()
                self._known.pop(pid, None)
                continue
            jobs.setdefault(view.job, []).append(view)
        ordered = {job: tuple(ranks) for job, ranks in sorted(jobs.items())}  # _tracked's order
        return ProcessView(now_s, ordered, discovered, denied, self._untrusted)

    def close(self) -> None:
        """Close the files kept open for the tracked ranks (the inspector may be used again: they are
        opened anew)."""
        for t in self._tracked.values():
            t.close()

    # -------------------------------------------------------------------------------- discovery

    def _look(self, pid: int) -> tuple[_Known, int | None] | None:
        """What is known of ``pid`` and its parent now, or None where it is gone: one read of its
        ``stat`` where the process was seen before (:class:`_Known`); else read in full, with psutil."""
        if procfs.AVAILABLE:
            ident = procfs.identity(pid)
            if ident is None:
                return None
            key: tuple[object, ...] = (ident.start_ticks, ident.program)
            known = self._known.get(pid)
            if known is not None and known.key == key and known.cacheable:
                return known, ident.ppid
            cacheable = ident.stable
        else:
            key, cacheable = (), False
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                ppid = proc.ppid()
                try:
                    cmdline, denied = proc.cmdline(), False
                except psutil.AccessDenied:
                    cmdline, denied = [], True
                known = _Known(key, proc, cmdline, denied, _uid(proc), _create_time(proc), cacheable)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._known.pop(pid, None)
            return None
        self.processes_created_total += 1
        if cacheable:
            self._known[pid] = known
        else:
            self._known.pop(pid, None)
        return known, ppid

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

        scan_environ = (self.always_scan_environ or not nvml_gpus) and (
            self._last_scan_s is None or now_s - self._last_scan_s >= self.environ_scan_interval_s
        )
        if scan_environ:
            self._last_scan_s = now_s
        if self.scope is not None:
            self.scope.refresh(time.time())
        claimed = {c.pid for c in claims if c.host_is_local}
        listed: set[int] = set(nvml_gpus) | claimed

        infos, launcher_set = self._read_processes(scan_environ, listed)
        found, envs, denied = self._candidates(infos, launcher_set, listed, claimed, nvml_gpus, uuid_to_index)

        if not scan_environ:  # ranks found by the last scan stay until the next one
            for pid, old in self._tracked.items():
                if (
                    pid not in found
                    and old.gone_since_s is None
                    and old.cand.found_by in ("environ", "launcher")
                ):
                    found[pid] = old.cand

        untrusted, renames, claimed_trees = _join_claims(found, claims, envs)
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
            info = infos.get(cand.pid)
            if info is not None and info[2] is not None:
                known = info[2]
            else:  # a rank the last scan found, not read in this discovery
                got = self._look(cand.pid)
                if got is None:
                    continue
                known = got[0]
            if known.create_time is None:
                continue
            previous = self._tracked.get(cand.pid)
            same = previous is not None and previous.create_time == known.create_time
            tracked[cand.pid] = _Tracked(
                known.proc,
                known.create_time,
                cand,
                previous.last if same and previous else None,
                start_ticks=previous.start_ticks if same and previous else None,
                files=previous.files if same and previous else None,
            )
            if same and previous:
                previous.files = None  # moved
        for pid, old in self._tracked.items():  # keep the dead in view until forgotten
            if pid not in tracked and old.gone_since_s is not None:
                tracked[pid] = old
            elif tracked.get(pid) is not old:
                old.close()
        # in the order the view lists ranks (by rank, unknown ranks last, then pid): each period's
        # measurement keeps it, and needs no sort of its own
        self._tracked = dict(sorted(tracked.items(), key=lambda kv: _rank_order(kv[1].cand)))
        if scan_environ:
            self._scanned = frozenset(infos)
        keep = self._scanned | set(infos) | set(tracked)
        self._known = {pid: k for pid, k in self._known.items() if pid in keep}
        self.environ_denied_total += denied
        self.last_discovery_duration_s = time.perf_counter() - started
        return denied

    def _read_processes(self, scan_environ: bool, listed: set[int]) -> tuple[dict[int, ProcInfo], set[int]]:
        """(ppid, command line, what is known) of every process (``scan_environ``) or only of the
        listed pids, and which of them are launchers. A process seen before costs one read of its
        ``stat`` (:meth:`_look`)."""
        launchers: list[int] = []
        infos: dict[int, ProcInfo] = {}
        if scan_environ:
            for pid in procfs.pids() if procfs.AVAILABLE else psutil.pids():
                got = self._look(pid)
                if got is not None:
                    known, ppid = got
                    infos[pid] = (ppid, known.cmdline, known)
        for pid in listed - set(infos):
            got = self._look(pid)
            if got is None or got[0].cmdline_denied:
                infos.setdefault(pid, (None, [], None))
            else:
                infos[pid] = (got[1], got[0].cmdline, got[0])
        for pid, (_, cmdline, seen) in infos.items():
            if seen is not None and pid not in (self.own_pid, 1) and is_launcher(cmdline):
                launchers.append(pid)
        launcher_set = set(launchers)

        return infos, launcher_set

    def _candidates(
        self,
        infos: Mapping[int, ProcInfo],
        launcher_set: set[int],
        listed: set[int],
        claimed: set[int],
        nvml_gpus: Mapping[int, list[int]],
        uuid_to_index: Mapping[str, int],
    ) -> tuple[dict[int, Candidate], dict[int, RankEnv | None], int]:
        """Every process with a proof of being a rank (its environment, a GPU context, a launcher
        parent) or named by a progress file: the candidates, their environments, and how many
        environments could not be read."""
        found: dict[int, Candidate] = {}
        envs: dict[int, RankEnv | None] = {}
        denied = 0
        session_scope = self.scope
        for pid, (ppid, cmdline, known) in infos.items():
            if pid in (self.own_pid, 1) or known is None or (not cmdline and pid not in listed):
                continue  # ourselves, init, kernel threads, gone
            if pid in launcher_set:
                continue
            if session_scope is not None and not (
                session_scope.in_session(pid) and session_scope.holds(pid, known.uid, known.create_time)
            ):
                continue  # not the simulated job's: never read, never judged
            try:
                env, env_denied = known.environ()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            denied += env_denied
            gpus = tuple(sorted(nvml_gpus.get(pid, ())))
            under_launcher = launcher_above(ppid, infos, launcher_set)
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
            nspid, scope = known.kernel_facts(pid)
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
                uid=known.uid,
                nspid=nspid,
                scope=scope,
                sid=_sid(pid),
                create_time=known.create_time,
            )
        return found, envs, denied

    # -------------------------------------------------------------------------------- measuring

    @staticmethod
    def _read_procfs(t: _Tracked, now_s: float) -> tuple[float | None, tuple[int, int, int, int] | None]:
        """:meth:`_measure`'s reads through ``/proc`` (:mod:`gpu_triage.signals.procfs`): status, CPU
        time, process group and I/O in two ``pread`` of files kept open while the rank is tracked
        (:class:`procfs.ProcFiles`), the same values psutil gives; a process reaped since (whatever
        its pid names now), or a pid that names another process (its start time changed), is gone."""
        try:
            if t.files is None:
                t.files = procfs.ProcFiles.keep(t.proc.pid)
            if t.files is not None:
                st, io = t.files.sample(t.start_ticks)
            else:  # no more files kept open (thousands of ranks, or no descriptor left): read afresh
                st, io = procfs.read_stat(t.proc.pid, t.start_ticks), procfs.read_io(t.proc.pid)
        except procfs.Gone:
            t.gone_since_s, t.status = now_s, None
            t.close()
            return None, None
        except procfs.Denied:
            t.status = None
            return None, None
        t.start_ticks, t.status, t.pgid = st.start_ticks, st.status, st.pgid
        if st.status in DEAD_STATUSES:
            t.gone_since_s = now_s
            t.close()
        return st.cpu_time_s, io

    def _measure(self, t: _Tracked, now_s: float) -> RankProcess:
        c = t.cand
        cpu_s: float | None = None
        io: tuple[int, int, int, int] | None = None
        if t.gone_since_s is None and procfs.AVAILABLE:
            cpu_s, io = self._read_procfs(t, now_s)
        elif t.gone_since_s is None:
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
        rb = wb = rc = wc = None
        cpu_delta = interval = None
        if t.last is not None and cpu_s is not None:
            last_s, last_cpu, last_io = t.last
            interval = now_s - last_s
            cpu_delta = max(0.0, cpu_s - last_cpu)
            if io is not None and last_io is not None:  # each counter's growth (never below 0)
                rb = io[0] - last_io[0] if io[0] > last_io[0] else 0
                wb = io[1] - last_io[1] if io[1] > last_io[1] else 0
                rc = io[2] - last_io[2] if io[2] > last_io[2] else 0
                wc = io[3] - last_io[3] if io[3] > last_io[3] else 0
        if cpu_s is not None:
            t.last = (now_s, cpu_s, io)
        return RankProcess(
            c.job, c.pid, c.rank, c.local_rank, c.world_size, c.gpu, c.gpus, c.found_by,
            alive=True, status=t.status, pgid=t.pgid, cpu_time_s=cpu_s, cpu_time_delta_s=cpu_delta,
            read_bytes_delta=rb, write_bytes_delta=wb, read_chars_delta=rc, write_chars_delta=wc,
            interval_s=interval, proof=c.proof, uid=c.uid, create_time=t.create_time, scope=c.scope,
        )  # fmt: skip


def _join_claims(
    found: dict[int, Candidate], claims: Sequence[ProgressClaim], envs: Mapping[int, RankEnv | None]
) -> tuple[list[UntrustedClaim], dict[GroupKey, str], dict[GroupKey, set[tuple[str, int]]]]:
    """Progress files are claims: each is joined to the process it names only with proof (``found``
    is updated in place). The refused claims, and per group the claimed job name and the claimed
    processes' places in the tree."""
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
        renames.setdefault(group_identity(chosen), claim.job)
        claimed_trees.setdefault(group_identity(chosen), set()).update(tree_marks(chosen))
        found[chosen.pid] = dataclasses.replace(
            chosen,
            job=claim.job,
            rank=claim.rank,
            local_rank=chosen.local_rank if chosen.local_rank is not None else claim.local_rank,
            found_by="progress",
            proof=(*chosen.proof, "progress_file"),
        )
    return untrusted, renames, claimed_trees


def _rank_order(c: Candidate) -> tuple[bool, int, int]:
    """Where a rank is listed in its job: by rank, unknown ranks last, then by pid."""
    return (c.rank is None, c.rank or 0, c.pid)


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


def _read_cgroup(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return f.read(65536).decode("utf-8", "replace")
    except OSError:
        return None


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


__all__ = ["ProcessInspector", "ProcessView", "SessionScope"]
