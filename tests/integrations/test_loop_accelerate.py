"""The plain-loop ``Progress`` API and the accelerate integration in real 2-rank jobs (torchrun, gloo,
CPU) beside the real daemon (``--source none``, observe mode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.harness import EXAMPLES, JOBS, run_with_daemon, torchrun

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(420)]


def records(progress: Path, job: str) -> dict[int, dict]:
    return {r: json.loads((progress / job / f"rank-{r}.json").read_text()) for r in (0, 1)}


@pytest.mark.parametrize("example", ["plain_loop", "accelerate_loop"])
def test_example_runs_to_done(tmp_path: Path, example: str) -> None:
    job = example.replace("_loop", "").replace("plain", "loop") + "-example"
    run = run_with_daemon(tmp_path, torchrun(EXAMPLES / f"{example}.py", "--out", str(tmp_path / "out")), job)
    assert run.returncode == 0, run.log
    for record in records(run.progress_dir, job).values():
        assert (record["phase"], record["step"], record["lease_scope"]) == ("done", 16, "job")
    assert len(list((tmp_path / "out").iterdir())) == 4  # the saves at steps 4, 8, 12, 16
    assert "deadlock_suspected" not in run.verdicts()


def test_accelerate_save_state_is_checkpoint(tmp_path: Path) -> None:
    job = "accelerate-test"
    run = run_with_daemon(
        tmp_path,
        torchrun(
            JOBS / "accelerate_job.py", "--out", str(tmp_path / "out"), "--job", job, "--save-steps", "8"
        ),
        job,
        env={"TEST_SLOW_SAVE_S": "2"},
    )
    assert run.returncode == 0, run.log
    assert "checkpoint" in run.verdicts(), (run.verdicts(), run.log)
    saving = run.first("checkpoint")
    assert saving is not None and set(saving.phases.values()) == {"checkpoint"}
    assert not [s for s in run.timeline if s.verdict.startswith("deadlock")]


def test_plain_loop_save_on_one_rank_with_a_collective_inside_is_caught_within_30s(tmp_path: Path) -> None:
    """Rank 1 sits in a job-scoped ``checkpoint`` lease (a live one), rank 0 frozen in ``train``: with
    ``lease_scope = "job"`` that is a contradiction, kill-worthy - while the earlier saves, on every
    rank, were ``checkpoint``."""
    job = "loop-test"
    run = run_with_daemon(
        tmp_path,
        torchrun(
            JOBS / "loop_job.py",
            "--out",
            str(tmp_path / "out"),
            "--job",
            job,
            "--samples",
            "640",
            "--save-steps",
            "50",
        ),
        job,
        env={"TEST_STEP_S": "0.1", "TEST_SLOW_SAVE_S": "2", "TEST_DEADLOCK": "1"},
        stop_when=lambda s: s.verdict == "deadlock_suspected",
        timeout_s=240,
    )
    verdicts = run.verdicts()
    assert "checkpoint" in verdicts and "deadlock_suspected" in verdicts, (verdicts, run.log)
    assert verdicts.index("checkpoint") < verdicts.index("deadlock_suspected")
    hung = run.first("deadlock_suspected")
    assert hung is not None
    assert hung.phases == {0: "train", 1: "checkpoint"} and hung.kill_worthy, hung
    assert "phase_disagreement" in hung.signals
    assert hung.onset is not None and hung.raised is not None and hung.raised - hung.onset <= 30.0, hung
    last = records(run.progress_dir, job)
    assert last[1]["phase"] == "checkpoint" and last[1]["lease_until"] > hung.time_s  # the lease was live
    print(f"plain loop: onset -> deadlock_suspected {hung.raised - hung.onset:.1f} s; verdicts {verdicts}")
