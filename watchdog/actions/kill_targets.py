"""Which processes a kill may touch (pure) and the executor that signals them or runs the kill hook.

**Who may be signalled** (:func:`plan_kill`, pure over a process table):

- only the job's rank processes (the pids the inspector tied to the job through NVML or its progress
  files) and their descendants (data-loader workers...);
- never PID 0/1, never the daemon (``own_pid``) nor any of its ancestors;
- a rank's **process group** is signalled as a group only when every member of the group is a rank of
  the job or a descendant of one (and none is protected). Otherwise - e.g. the ranks share the group of
  ``torchrun`` or of a login shell - the ranks and their descendants are signalled one by one.

**How** (:class:`KillExecutor`): the table is read with psutil at the moment of the kill; each process is
identified by (pid, create time), and a pid is signalled through a pidfd opened and checked against its
create time first, so a pid recycled since the plan is never hit. The SIGKILL stage re-plans from the
identities of the SIGTERM stage that are still alive (the same rules again). ``dry_run`` plans and
records, and signals nothing.

**The kill hook** (``actions.kill_hook``, e.g. ``["scancel", "{slurm_job_id}"]``): run with an argument
vector (``shell=False``); only the placeholders ``{job}``, ``{node}``, ``{pids}`` (comma-separated) and
``{slurm_job_id}`` are substituted, each into the one argument where it appears - a value containing
``; rm -rf /`` stays one argument and no shell ever reads it. A value that starts with ``-`` is refused
(it would read as an option). ``{slurm_job_id}`` comes from the rank's cgroup (``.../job_<id>/...``,
set by slurmd, trusted) or else from its ``SLURM_JOB_ID`` environment variable (set by the job's owner:
digits only, and every rank must agree).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

HOOK_PLACEHOLDERS = ("job", "node", "pids", "slurm_job_id")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(HOOK_PLACEHOLDERS) + r")\}")
_SLURM_ID = re.compile(r"^\d{1,20}(_\d{1,10})?$")
_CGROUP_JOB = re.compile(r"/job_(\d{1,20})(?:/|$)")
MAX_OUTPUT_BYTES = 8 * 1024 * 1024
_NO_PIDFD = frozenset({errno.ENOSYS, errno.EPERM, errno.EINVAL})
"""pidfd calls failing this way (an old kernel, a seccomp filter) fall back to psutil's checked kill."""


# --------------------------------------------------------------------------------------------------
# The process table and the plan (pure).


@dataclass(frozen=True, slots=True)
class ProcEntry:
    pid: int
    ppid: int | None
    pgid: int | None
    create_time: float | None
    name: str = ""
    uid: int | None = None


@dataclass(frozen=True, slots=True)
class Identity:
    """What the inspector proved about a rank process: the kernel's (create time, real uid). Checked
    again against the process table at the moment of the plan: a pid recycled since (another create
    time) or a process of another owner is never signalled, nor is a descendant of another owner."""

    create_time: float | None
    uid: int | None


@dataclass(frozen=True, slots=True)
class KillPlan:
    groups: tuple[int, ...]
    """Process groups to signal with killpg."""
    pids: tuple[int, ...]
    """Processes to signal one by one."""
    members: Mapping[int, float | None]
    """Every process the plan covers (pid -> create time): ranks, descendants, group members."""
    skipped: tuple[tuple[int, str], ...] = ()
    """(pid or -pgid, why) that were left alone."""

    @property
    def empty(self) -> bool:
        return not self.groups and not self.pids

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": list(self.groups),
            "pids": list(self.pids),
            "members": sorted(self.members),
            "skipped": [{"id": i, "why": why} for i, why in self.skipped],
        }


def ancestors(table: Mapping[int, ProcEntry], pid: int) -> set[int]:
    """The parent chain of ``pid`` in ``table`` (not including ``pid``)."""
    out: set[int] = set()
    entry = table.get(pid)
    while entry is not None and entry.ppid not in (None, 0) and entry.ppid not in out:
        out.add(entry.ppid)
        entry = table.get(entry.ppid)
    return out


def descendants(table: Mapping[int, ProcEntry], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for e in table.values():
        if e.ppid is not None:
            children.setdefault(e.ppid, []).append(e.pid)
    out: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def protected_pids(table: Mapping[int, ProcEntry], own_pid: int) -> frozenset[int]:
    """PID 0, PID 1, the daemon and every ancestor of the daemon."""
    return frozenset({0, 1, own_pid} | ancestors(table, own_pid))


def plan_kill(
    job_pids: Iterable[int],
    table: Mapping[int, ProcEntry],
    *,
    own_pid: int,
    extra_protected: Iterable[int] = (),
    identities: Mapping[int, Identity] | None = None,
) -> KillPlan:
    """What to signal to stop the processes ``job_pids`` (see the module docstring for the rules).
    With ``identities``, a rank whose create time or owner differs from its proven identity is skipped,
    and only descendants of the same owner as the ranks are covered."""
    protected = protected_pids(table, own_pid) | frozenset(extra_protected)
    own_pgid = table[own_pid].pgid if own_pid in table else None
    skipped: list[tuple[int, str]] = []
    ranks: set[int] = set()
    for pid in sorted(set(job_pids)):
        ident = identities.get(pid) if identities is not None else None
        if pid in protected:
            skipped.append((pid, "protected (PID 1, the daemon or its ancestor)"))
        elif pid not in table:
            skipped.append((pid, "gone"))
        elif identities is not None and ident is None:
            skipped.append((pid, "no proven identity"))
        elif ident is not None and _mismatch(table[pid], ident):
            skipped.append((pid, f"identity changed since it was proven: {_mismatch(table[pid], ident)}"))
        else:
            ranks.add(pid)
    owners = {table[p].uid for p in ranks}
    allowed = (ranks | descendants(table, ranks)) - protected
    if identities is not None:
        strangers = {p for p in allowed - ranks if table[p].uid not in owners}
        skipped += [(p, f"descendant of another owner (uid {table[p].uid})") for p in sorted(strangers)]
        allowed -= strangers
    groups: list[int] = []
    covered: set[int] = set()
    rank_pgids = {pgid for p in ranks if (pgid := table[p].pgid) is not None}
    for pgid in sorted(rank_pgids):
        members = {p for p, e in table.items() if e.pgid == pgid}
        if pgid <= 1 or pgid in protected or pgid == own_pgid or members & protected:
            skipped.append((-pgid, "group holds a protected process: signalling its job members one by one"))
            continue
        outsiders = sorted(members - allowed)
        if outsiders:
            names = ", ".join(f"{p} ({table[p].name})" if table[p].name else str(p) for p in outsiders[:5])
            skipped.append((-pgid, f"group also holds non-job processes {names}: signalling one by one"))
            continue
        groups.append(pgid)
        covered |= members
    pids = tuple(sorted(allowed - covered))
    created = {p: table[p].create_time for p in allowed | covered}
    return KillPlan(tuple(groups), pids, created, tuple(skipped))


def _mismatch(entry: ProcEntry, ident: Identity) -> str | None:
    if (
        ident.create_time is not None
        and entry.create_time is not None
        and abs(entry.create_time - ident.create_time) > 0.01
    ):
        return "another create time (the pid was reused)"
    if ident.uid is not None and entry.uid is not None and entry.uid != ident.uid:
        return f"owner uid {entry.uid}, proven uid {ident.uid}"
    return None


# --------------------------------------------------------------------------------------------------
# The hook (pure rendering).


class HookError(ValueError):
    """The kill hook cannot be run (a placeholder without a safe value)."""


def render_hook(template: Sequence[str], values: Mapping[str, str | None]) -> tuple[str, ...]:
    """Substitute the whitelisted placeholders in each argument of ``template``; nothing else is
    interpreted (no shell, no other braces). Raises :class:`HookError` when a used placeholder has no
    value or its value begins with ``-``."""
    out = []
    for arg in template:

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            value = values.get(name)
            if value is None or value == "":
                raise HookError(f"kill_hook uses {{{name}}} but no value is known")
            if value.startswith("-"):
                raise HookError(f"kill_hook: the value of {{{name}}} begins with '-': refused")
            return value

        out.append(_PLACEHOLDER.sub(sub, arg))
    return tuple(out)


def slurm_id_from(cgroup_text: str | None, environ: Mapping[str, str] | None) -> tuple[str | None, str]:
    """(job id, where it came from): the cgroup path's ``job_<id>`` wins; the environment's
    ``SLURM_JOB_ID`` is used only when it is well-formed and the cgroup does not contradict it."""
    from_cgroup = None
    if cgroup_text:
        found = _CGROUP_JOB.search(cgroup_text)
        if found:
            from_cgroup = found.group(1)
    env_id = (environ or {}).get("SLURM_JOB_ID")
    if from_cgroup is not None:
        return from_cgroup, "cgroup"
    if env_id is not None and _SLURM_ID.match(env_id):
        return env_id, "environ"
    return None, "unknown" if env_id is None else "malformed SLURM_JOB_ID"


# --------------------------------------------------------------------------------------------------
# I/O: the process table, signals, commands.


def process_table() -> dict[int, ProcEntry]:
    table: dict[int, ProcEntry] = {}
    for proc in psutil.process_iter(["ppid", "create_time", "name", "uids"]):
        info = proc.info
        try:
            pgid: int | None = os.getpgid(proc.pid)
        except OSError:
            pgid = None
        uids = info.get("uids")
        table[proc.pid] = ProcEntry(
            proc.pid,
            info.get("ppid"),
            pgid,
            info.get("create_time"),
            info.get("name") or "",
            uids.real if uids is not None else None,
        )
    return table


class Signaller(Protocol):
    """Sends signals. ``signal_pid`` must not hit a recycled pid (``create_time`` None: unchecked)."""

    def signal_pid(self, pid: int, create_time: float | None, sig: int) -> None: ...

    def signal_group(self, pgid: int, sig: int) -> None: ...


class OsSignaller:
    """pidfd-based where the kernel has it (Linux >= 5.3), psutil's checked send otherwise."""

    def signal_pid(self, pid: int, create_time: float | None, sig: int) -> None:
        pidfd_open = getattr(os, "pidfd_open", None)
        send = getattr(signal, "pidfd_send_signal", None)
        if pidfd_open is not None and send is not None:
            try:
                fd = pidfd_open(pid)
            except OSError as e:
                if e.errno not in _NO_PIDFD:  # ESRCH: gone
                    raise
            else:
                try:
                    _check_identity(pid, create_time)
                    send(fd, sig)
                    return
                except OSError as e:
                    if e.errno not in _NO_PIDFD:
                        raise
                finally:
                    os.close(fd)
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.01:
            raise ProcessLookupError(f"pid {pid} was recycled")
        proc.send_signal(sig)

    def signal_group(self, pgid: int, sig: int) -> None:
        if pgid <= 1:
            raise PermissionError(f"refusing to signal process group {pgid}")
        os.killpg(pgid, sig)


def _check_identity(pid: int, create_time: float | None) -> None:
    if create_time is None:
        return
    try:
        actual = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        raise ProcessLookupError(f"pid {pid} is gone") from None
    if abs(actual - create_time) > 0.01:
        raise ProcessLookupError(f"pid {pid} was recycled")


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    error: str | None = None
    """``timeout``, ``not found: ...`` or another reason the command did not complete."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, timeout_s: float) -> CommandResult: ...


class SubprocessRunner:
    """Runs an argument vector (never a shell) in its own session, killing its whole group on timeout."""

    def run(self, argv: Sequence[str], *, timeout_s: float) -> CommandResult:
        argv = tuple(argv)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                shell=False,
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError as e:
            return CommandResult(argv, None, "", "", time.monotonic() - started, f"not found: {e.filename}")
        except OSError as e:
            return CommandResult(argv, None, "", "", time.monotonic() - started, f"cannot start: {e}")
        error = None
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            error = f"timeout after {timeout_s:g} s"
        return CommandResult(
            argv,
            proc.returncode,
            out[:MAX_OUTPUT_BYTES].decode("utf-8", "replace"),
            err[:MAX_OUTPUT_BYTES].decode("utf-8", "replace"),
            time.monotonic() - started,
            error,
        )


def read_environ(pid: int) -> dict[str, str] | None:
    try:
        return psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return None


def read_cgroup(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text(errors="replace")
    except OSError:
        return None


def slurm_job_id(pids: Iterable[int]) -> tuple[str | None, str]:
    """The Slurm job id of the ranks ``pids`` (all must agree), and where it came from."""
    found: dict[str, str] = {}
    reasons = []
    for pid in pids:
        value, source = slurm_id_from(read_cgroup(pid), read_environ(pid))
        if value is None:
            reasons.append(f"pid {pid}: {source}")
            continue
        found[value] = source
    if len(found) > 1:
        return None, f"ranks disagree on the Slurm job id ({', '.join(sorted(found))})"
    if found:
        value, source = next(iter(found.items()))
        return value, source
    return None, "; ".join(reasons) or "no rank"


# --------------------------------------------------------------------------------------------------
# The executor.


@dataclass(frozen=True, slots=True)
class KillOutcome:
    signal: str
    plan: KillPlan
    dry_run: bool
    signalled: tuple[str, ...] = ()
    """``group:<pgid>`` / ``pid:<pid>`` that were sent the signal."""
    errors: tuple[str, ...] = ()
    time: float = 0.0
    alive_after: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "dry_run": self.dry_run,
            "plan": self.plan.to_dict(),
            "signalled": list(self.signalled),
            "errors": list(self.errors),
            **self.extra,
        }


class KillExecutor:
    """Plans and sends one stage of the ladder. Call from a worker thread (reads the process table)."""

    def __init__(self, signaller: Signaller | None = None, *, own_pid: int | None = None) -> None:
        self.signaller = signaller or OsSignaller()
        self.own_pid = os.getpid() if own_pid is None else own_pid

    def plan(self, job_pids: Iterable[int], identities: Mapping[int, Identity] | None = None) -> KillPlan:
        return plan_kill(job_pids, process_table(), own_pid=self.own_pid, identities=identities)

    def send(self, plan: KillPlan, sig: signal.Signals, *, dry_run: bool, now: float) -> KillOutcome:
        signalled: list[str] = []
        errors: list[str] = []
        if not dry_run:
            for pgid in plan.groups:
                try:
                    self.signaller.signal_group(pgid, sig)
                    signalled.append(f"group:{pgid}")
                except ProcessLookupError:
                    errors.append(f"group {pgid}: already gone")
                except OSError as e:
                    errors.append(f"group {pgid}: {e}")
            for pid in plan.pids:
                try:
                    self.signaller.signal_pid(pid, plan.members.get(pid), sig)
                    signalled.append(f"pid:{pid}")
                except ProcessLookupError as e:
                    errors.append(f"pid {pid}: {e or 'already gone'}")
                except (OSError, psutil.Error) as e:
                    errors.append(f"pid {pid}: {e}")
        return KillOutcome(sig.name, plan, dry_run, tuple(signalled), tuple(errors), now)

    def survivors(self, plan: KillPlan) -> list[int]:
        """The plan's processes still alive with the same create time (zombies count as gone)."""
        alive = []
        for pid, created in plan.members.items():
            try:
                proc = psutil.Process(pid)
                if created is not None and abs(proc.create_time() - created) > 0.01:
                    continue
                if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    continue
            except psutil.Error:
                continue
            alive.append(pid)
        return sorted(alive)

    def terminate(self, job_pids: Iterable[int], *, dry_run: bool, now: float) -> KillOutcome:
        return self.send(self.plan(job_pids), signal.SIGTERM, dry_run=dry_run, now=now)

    def escalate(self, previous: KillPlan, *, dry_run: bool, now: float) -> KillOutcome:
        """SIGKILL what of ``previous`` is still alive (re-planned under the same rules)."""
        table = process_table()
        alive = [
            p
            for p, created in previous.members.items()
            if p in table
            and (
                created is None
                or table[p].create_time is None
                or abs((table[p].create_time or 0.0) - created) <= 0.01
            )
        ]
        plan = plan_kill(alive, table, own_pid=self.own_pid)
        return self.send(plan, signal.SIGKILL, dry_run=dry_run, now=now)


__all__ = [
    "CommandResult",
    "CommandRunner",
    "HookError",
    "Identity",
    "KillExecutor",
    "KillOutcome",
    "KillPlan",
    "OsSignaller",
    "ProcEntry",
    "Signaller",
    "SubprocessRunner",
    "ancestors",
    "descendants",
    "plan_kill",
    "process_table",
    "protected_pids",
    "render_hook",
    "slurm_id_from",
    "slurm_job_id",
]
