"""Issue 18, items 1-4 and 8, with two real Unix users: user B can neither get user A's processes
signalled, nor hide A's hung job, nor blind or slow the node (see tests/watchdog/shared_node.py for
the setup: real users, real processes running as them, files they own, the real daemon cycle armed to
kill on an explicit clock)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.signals import progress as progress_mod
from tests.watchdog.shared_node import (
    A_JOB,
    Node,
    User,
    alive,
    reaped,
    run_victim,
    spawn_as,
    spawn_rank_as,
    two_users,
)

pytestmark = pytest.mark.slow
SLURM_JOB = f"slurm-{os.getpid()}"
B_JOB = f"bjob{os.getpid()}"


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[User, User]]:
    with two_users() as ab:
        yield ab


def _forged_record(job: str, rank: int, pid: int, now: float, world: int = 2, **kw: object) -> bytes:
    rec = {
        "job": job, "rank": rank, "local_rank": rank, "world_size": world, "pid": pid,
        "host": socket.gethostname(), "step": 1, "epoch": 0, "tokens": 0, "phase": "train",
        "lease_until": None, "time": now, **kw,
    }  # fmt: skip
    return json.dumps(rec).encode()


def _own(path: Path | bytes, user: User) -> None:
    os.chown(path, user.uid, user.gid, follow_symlinks=False)


def _mkdir_as(path: Path | bytes, user: User, mode: int = 0o2775) -> None:
    os.mkdir(path, mode)
    os.chmod(path, mode)
    _own(path, user)


def _assert_victim_caught(node: Node, a_pids: list[int]) -> None:
    out = node.outcome
    mine = [j for j, pids in out.sigterm_pids.items() if set(a_pids) <= set(pids)]
    assert mine, f"A's hung job was never planned for SIGTERM: {out.sigterm_pids} verdicts {out.verdicts}"
    for j in mine:
        assert set(out.sigterm_pids[j]) == set(a_pids), f"A's kill set holds other pids: {out.sigterm_pids}"
    assert "deadlock_confirmed" in out.verdicts.get(mine[0], []), out.verdicts


# ------------------------------------------------------------------------------- item 2: signalled


def test_item2_b_cannot_get_a_s_healthy_ranks_signalled(users, tmp_path: Path) -> None:
    """B's processes carry A's job in their environment (``GPU_WATCHDOG_JOB=slurm-4242``, ranks 0 and
    1) and B's progress files make them B's job ``bjob``, which B lets hang at the epoch end. The
    armed daemon (real signals) kills B's job and never signals A's healthy ranks."""
    a, b = users
    node = Node(tmp_path)
    with reaped() as procs:
        a_ranks = [spawn_rank_as(a, SLURM_JOB, r, 2) for r in range(2)]
        b_ranks = [spawn_rank_as(b, SLURM_JOB, r, 2) for r in range(2)]
        procs.extend(a_ranks + b_ranks)
        a_w = [node.writer(a, SLURM_JOB, r, 2, p.pid) for r, p in enumerate(a_ranks)]
        b_w = [node.writer(b, B_JOB, r, 2, p.pid) for r, p in enumerate(b_ranks)]
        try:
            for tick in range(260):
                node.now = node.t0 + tick
                for w in a_w:
                    if tick == 0:
                        w.phase("train")
                    if tick % 10 == 0:
                        w.step(tick // 10)  # A stays healthy throughout
                for w in b_w:
                    if tick == 0:
                        w.phase("train")
                    if tick < 60 and tick % 10 == 0:
                        w.step(tick // 10)
                if tick == 60:
                    b_w[0].phase("epoch_end", lease_s=300)
                node.cycle()
        finally:
            node.close()
        a_pids = {p.pid for p in a_ranks}
        targeted = {p for pids in node.outcome.sigterm_pids.values() for p in pids}
        assert not targeted & a_pids, f"A's ranks were planned for SIGTERM: {node.outcome.sigterm_pids}"
        assert all(alive(p.pid) for p in a_ranks), "A's healthy ranks were signalled"
        assert {p.pid for p in b_ranks} <= targeted, "B's own hung job should still be killed"
        assert node.outcome.verdicts.get(SLURM_JOB, [])[-1:] == ["healthy"], node.outcome.verdicts


# -------------------------------------------------------------------------------- item 3: hidden


def _squat(node: Node, b: User) -> None:
    _mkdir_as(node.progress / A_JOB, b)


def _dirs_sorting_first(node: Node, b: User) -> None:
    for i in range(1100):
        _mkdir_as(node.progress / f"{i:04d}", b)


ATTACKS = [
    "squat_job_dir",
    "rank_file_replaced_by_dir",
    "dirs_sorting_first",
    "veto_writer",
    "stopped_joiner",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_item3_b_cannot_hide_a_s_hung_job(users, tmp_path: Path, attack: str) -> None:
    a, b = users
    node = Node(tmp_path, dry_run=True)
    with reaped() as procs:
        if attack == "squat_job_dir":
            _squat(node, b)  # before A's job starts
        elif attack == "dirs_sorting_first":
            _dirs_sorting_first(node, b)
        elif attack == "veto_writer":
            scratch = tmp_path / "bscratch"
            _mkdir_as(scratch, b, 0o755)
            loop = f"while :; do printf '%065536d' 0 > {scratch}/f; sleep 0.05; done"
            env = {"PATH": "/usr/bin:/bin", "RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "3"}
            procs.append(spawn_as(b, ["/bin/sh", "-c", loop], env | {"GPU_WATCHDOG_JOB": A_JOB}))
        elif attack == "stopped_joiner":
            joiner = spawn_rank_as(b, A_JOB, 2, 3)
            procs.append(joiner)
            os.kill(joiner.pid, signal.SIGSTOP)

        def move(tick: int) -> None:
            if attack == "rank_file_replaced_by_dir" and tick == 90:
                target = node.progress / A_JOB / "rank-1.json"
                target.unlink()  # the job directory is group-writable and has no sticky bit
                _mkdir_as(target, b, 0o755)

        try:
            a_ranks = run_victim(node, a, each_tick=move)
            procs.extend(a_ranks)
        finally:
            node.close()
        _assert_victim_caught(node, [p.pid for p in a_ranks])


# --------------------------------------------------------------------------- items 1 and 8: blind


def test_item1_b_cannot_blind_the_node_with_names(users, tmp_path: Path, caplog) -> None:
    """Non-UTF-8 directory names, a ``job`` that decodes to lone surrogates, a newline that would
    forge a log line, ESC bytes and a 10 KB job name in the environment: A's hung job is still caught,
    no cycle fails, and every log line and job name stays one printable, bounded line."""
    a, b = users
    node = Node(tmp_path, dry_run=True)
    caplog.set_level(logging.INFO)
    with reaped() as procs:
        b_rank = spawn_rank_as(b, B_JOB, 0, 1)
        long_job = "\x1b[31m" + "A" * 10_000
        procs.append(b_rank)
        procs.append(spawn_rank_as(b, long_job, 0, 1))
        progress = bytes(node.progress)
        bad = progress + b"/\xff\xfejob"
        _mkdir_as(bad, b)
        rec = _forged_record("\udcff\udcfejob", 0, b_rank.pid, node.now, world=1)
        with open(bad + b"/rank-0.json", "wb") as f:
            f.write(rec)
        _own(bad + b"/rank-0.json", b)
        forged = (
            progress + b"/x\n2026-12-03 10:00:00,000 CRITICAL gpu_watchdog.events: kill job=prod sigterm ok"
        )
        _mkdir_as(forged, b)
        with open(forged + b"/rank-0.json", "wb") as f:
            f.write(b"{not json")
        _own(forged + b"/rank-0.json", b)
        esc = progress + b"/esc\x1b[2J"
        _mkdir_as(esc, b)
        with open(esc + b"/rank-0.json", "wb") as f:
            f.write(b"[]")
        try:
            a_ranks = run_victim(node, a)
            procs.extend(a_ranks)
        finally:
            node.close()
        _assert_victim_caught(node, [p.pid for p in a_ranks])
        assert node.outcome.failed_cycles == 0
        for record in caplog.records:
            text = record.getMessage()
            assert "\n" not in text and "\x1b" not in text, text[:300]
        snap = node.outcome.last
        for j in snap.jobs:
            assert len(j.job) <= 200 and j.job.isprintable(), j.job[:80]


# ------------------------------------------------------------------------------------- item 4: slow


def test_item4_b_cannot_slow_the_node_with_files(users, tmp_path: Path) -> None:
    """1,024 directories x 40 files naming processes that are no ranks: what B can make the daemon
    read per cycle is capped per owner, and A's hung job is still caught."""
    a, b = users
    node = Node(tmp_path, dry_run=True)
    with reaped() as procs:
        decoy = spawn_as(b, ["/bin/sleep", "600"], {"PATH": "/bin"})
        procs.append(decoy)
        for i in range(1024):
            d = node.progress / f"b{i:04d}"
            _mkdir_as(d, b)
            for r in range(40):
                path = d / f"rank-{r}.json"
                path.write_bytes(_forged_record(d.name, r, decoy.pid, node.now, world=40))
                _own(path, b)
        reads: list[int] = []

        def move(tick: int) -> None:
            reads.append(node.daemon.observer.progress.reads_total)

        try:
            a_ranks = run_victim(node, a, each_tick=move)
            procs.extend(a_ranks)
        finally:
            node.close()
        _assert_victim_caught(node, [p.pid for p in a_ranks])
        # B's files are read once (then served from the cache) and never more than B's cap; A's own
        # rewrites (a few per rank) come on top.
        cap = getattr(progress_mod, "MAX_FILES_PER_OWNER", 2048)
        total = node.daemon.observer.progress.reads_total
        assert total <= cap + 50, total
        assert reads[-1] - reads[100] < 50, "B's files are not re-read every cycle"


# ------------------------------------------------------------------------------ item 9: the token


def test_item9_a_token_readable_by_a_training_group_is_refused(users, tmp_path: Path) -> None:
    """0640 is only for a group of operators: a group with training users in it, or the progress
    directory's group, could read the token and arm the daemon."""
    from gpu_triage.daemon.config import ConfigError, load_config, load_secret, load_token, override

    a, _ = users
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    os.chown(token, 0, a.gid)
    token.chmod(0o640)
    with pytest.raises(ConfigError, match="other members"):
        load_secret(token)
    progress = tmp_path / "progress"
    progress.mkdir()
    os.chown(progress, 0, a.gid)
    config = override(
        load_config(None, {}),
        {"auth.token_file": str(token), "progress.dir": str(progress)},
        origin="test",
    )
    with pytest.raises(ConfigError, match="progress directory's group"):
        load_token(config)
    os.chown(token, 0, 0)  # root's group (no other members here): an operators' group is fine
    assert load_secret(token) == "t" * 32
