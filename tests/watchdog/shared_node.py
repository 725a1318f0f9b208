"""Two real Unix users on one node, and the real daemon cycle between them (issue 18, items 1-4).

:func:`users` creates two training users (``useradd``) in one training group, as the shipped unit and
the Slurm prolog set a node up; :class:`Node` drives the real :class:`~gpu_triage.daemon.Daemon` cycle
(reader, inspector, fusion, detector, event store, action engine armed to kill) on an explicit clock,
against real processes running as those users and progress files they own.

User A's job is the victim: two ranks (``/bin/sleep`` as A, with the rank environment a launcher sets)
that advance for a minute, then deadlock at the epoch end (rank 0 in ``epoch_end``, rank 1 frozen in
``train``). User B attacks.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.contract import ProgressWriter
from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.telemetry.none import NoneSource
from tests.conftest import in_ci
from tests.spawned import wait_for_exec
from tests.watchdog.engines import build_engine

_RUN = secrets.token_hex(3)
GROUP = f"wd18t{_RUN}"
USERS = (f"wd18a{_RUN}", f"wd18b{_RUN}")
"""Users and group of this test process alone: a concurrent run (another checkout, on the same
machine) makes its own and removes them when done, never ours. Not the pid: in a PID namespace of
its own every run is pid 1."""
A_JOB = f"ajob{_RUN}"
"""User A's job name: unique per test process (a concurrent run's processes of the same user and job
name would be the same job)."""


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def two_users() -> Iterator[tuple[User, User]]:
    """Users A and B (members of one training group), removed afterwards."""
    if os.geteuid() != 0:
        if in_ci():
            pytest.fail("CI runs as root: the two-user tests need useradd")
        pytest.skip("needs root to create two Unix users")
    created_group = False
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        _run("groupadd", GROUP)
        created_group = True
    made: list[str] = []
    try:
        for name in USERS:
            try:
                pwd.getpwnam(name)
            except KeyError:
                _run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "-g", GROUP, name)
                made.append(name)
        gid = grp.getgrnam(GROUP).gr_gid
        a, b = (User(n, pwd.getpwnam(n).pw_uid, gid) for n in USERS)
        yield a, b
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)
        if created_group:
            subprocess.run(["groupdel", GROUP], capture_output=True, timeout=30)


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **extra}


def spawn_as(user: User, argv: list[str], env: Mapping[str, str]) -> subprocess.Popen:
    return wait_for_exec(subprocess.Popen(
        argv, user=user.uid, group=user.gid, extra_groups=[], env=dict(env), start_new_session=True,
        cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ))  # fmt: skip


def spawn_rank_as(user: User, job: str, rank: int, world: int, **extra: str) -> subprocess.Popen:
    env = _env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), GPU_WATCHDOG_JOB=job, **extra)
    return spawn_as(user, ["/bin/sleep", "600"], env)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class OwnedWriter:
    """A :class:`ProgressWriter` whose files (and job directory) belong to ``user``, as if the user's
    trainer wrote them (the test runs as root and hands each file over after each write)."""

    def __init__(self, user: User, job: str, rank: int, world: int, directory: Path, pid: int, clock) -> None:
        self.user = user
        self.writer = ProgressWriter(
            job, rank, rank, world, directory=directory, clock=clock, pid=pid, host=socket.gethostname()
        )
        self.path = self.writer.path

    def _own(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            st = self.path.parent.stat()
            if st.st_uid == 0:
                os.chown(self.path.parent, self.user.uid, self.user.gid)
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            os.chown(self.path, self.user.uid, self.user.gid, follow_symlinks=False)

    def phase(self, phase: str, **kw: Any) -> None:
        with contextlib.suppress(OSError):
            self.writer.phase(phase, **kw)
        self._own()

    def step(self, step: int) -> None:
        with contextlib.suppress(OSError):
            self.writer.step(step)
        self._own()


@dataclass
class Outcome:
    verdicts: dict[str, list[str]] = field(default_factory=dict)
    """Job -> its verdicts in order (changes only)."""
    sigterm_pids: dict[str, list[int]] = field(default_factory=dict)
    """Job -> the pids the engine started a SIGTERM for."""
    records: list[dict[str, Any]] = field(default_factory=list)
    failed_cycles: int = 0
    snapshots: int = 0
    last: Any = None


class _FakeClock:
    """The daemon's clock (wall and monotonic) read from the node's explicit ``now``."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def wall(self) -> float:
        return self.node.now

    def monotonic(self) -> float:
        return self.node.now


class Node:
    """The real daemon, armed to kill, on an explicit clock."""

    def __init__(self, root: Path, *, dry_run: bool = False) -> None:
        self.root = root
        self.progress = root / "progress"
        self.progress.mkdir(mode=0o3775, parents=True, exist_ok=True)
        os.chmod(self.progress, 0o3775)  # the unit's RuntimeDirectoryMode: sticky + setgid, group-writable
        self.t0 = time.time()
        self.now = self.t0
        config = override(
            load_config(None, {}),
            {
                "daemon.listen": "127.0.0.1:0",
                "daemon.state_dir": str(root / "state"),
                "progress.dir": str(self.progress),
                "actions.mode": "kill",
                "actions.dry_run": dry_run,
            },
            origin="test",
        )
        self.daemon = Daemon(config, NoneSource(), clock=_FakeClock(self), serve_http=False)
        self.daemon.start()
        if self.daemon.actions is not None:
            self.daemon.actions.close()
        assert self.daemon.store is not None
        self.daemon.actions = build_engine(
            self.daemon.store,
            root / "state",
            clock=self.clock,
            node=self.daemon.node,
            actions=config.actions,
            alerts=config.alerts,
        )
        self.outcome = Outcome()
        self._seen_records = 0

    def clock(self) -> float:
        return self.now

    def writer(self, user: User, job: str, rank: int, world: int, pid: int) -> OwnedWriter:
        return OwnedWriter(user, job, rank, world, self.progress, pid, self.clock)

    def cycle(self) -> None:
        d = self.daemon
        try:
            snap = d.cycle(self.now)
            d._cycle_failed(None)
        except Exception as e:  # what run_forever does
            d._cycle_failed(e)
            snap = None
        if snap is not None:
            self.outcome.snapshots += 1
            self.outcome.last = snap
            for j in snap.jobs:
                seq = self.outcome.verdicts.setdefault(j.job, [])
                if not seq or seq[-1] != str(j.verdict):
                    seq.append(str(j.verdict))
        deadline = time.monotonic() + 10.0
        while d.actions is not None and d.actions.busy and time.monotonic() < deadline:
            time.sleep(0.002)
        self.outcome.failed_cycles = d.stats.failed

    def collect_actions(self) -> None:
        store = self.daemon.store
        assert store is not None
        for ev in store.since(0, limit=100_000):
            if ev.kind != "action":
                continue
            r = ev.payload
            self.outcome.records.append(r)
            if r.get("action") == "sigterm" and r.get("result") == "started":
                self.outcome.sigterm_pids.setdefault(str(r.get("job")), []).extend(r.get("pids") or ())

    def close(self) -> None:
        self.collect_actions()
        d = self.daemon
        if d.actions is not None:
            d.actions.close(timeout_s=2.0)
            d.actions = None
        d.close()


def run_victim(
    node: Node,
    a: User,
    *,
    job: str = A_JOB,
    ticks: int = 260,
    each_tick: Callable[[int], None] | None = None,
    ranks_env: Mapping[str, str] | None = None,
) -> list[subprocess.Popen]:
    """User A's two-rank job: steps for 60 s, then the epoch-end deadlock; ``each_tick(t)`` is B's
    move, before the daemon's cycle at tick t. Returns A's rank processes (still running)."""
    procs = [spawn_rank_as(a, job, r, 2, **dict(ranks_env or {})) for r in range(2)]
    writers = [node.writer(a, job, r, 2, p.pid) for r, p in enumerate(procs)]
    for tick in range(ticks):
        node.now = node.t0 + tick
        for w in writers:
            if tick == 0:
                w.phase("train")
            if tick < 60 and tick % 10 == 0:
                w.step(tick // 10)
        if tick == 60:
            writers[0].phase("epoch_end", lease_s=300)
        if each_tick is not None:
            each_tick(tick)
        node.cycle()
    return procs


@contextlib.contextmanager
def reaped() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


__all__ = [
    "A_JOB",
    "Node",
    "Outcome",
    "OwnedWriter",
    "User",
    "alive",
    "reaped",
    "run_victim",
    "spawn_as",
    "spawn_rank_as",
    "two_users",
]
