"""A real Hugging Face Trainer (tiny random GPT-2, CPU, gloo, 2 ranks under torchrun) with the
watchdog callback, beside the real daemon (``--source none``, observe mode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.harness import EXAMPLES, JOBS, run_with_daemon, torchrun

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(420)]

JOB = "hf-test"


def test_hf_trainer_saves_are_checkpoint_and_an_injected_deadlock_is_caught_within_30s(
    tmp_path: Path,
) -> None:
    run = run_with_daemon(
        tmp_path,
        torchrun(
            JOBS / "hf_job.py",
            "--out",
            str(tmp_path / "out"),
            "--job",
            JOB,
            "--samples",
            "640",
            "--save-steps",
            "50",
        ),
        JOB,
        env={"TEST_STEP_S": "0.1", "TEST_SLOW_SAVE_S": "2", "TEST_DEADLOCK": "1"},
        stop_when=lambda s: s.verdict == "deadlock_suspected",
        timeout_s=240,
    )
    assert run.timeline, "the daemon never saw the job:\n" + run.log
    # progress files appear, one per rank, with the contract's job scope
    files = sorted(p.name for p in (run.progress_dir / JOB).glob("rank-*.json"))
    assert files == ["rank-0.json", "rank-1.json"], run.log
    record = json.loads((run.progress_dir / JOB / "rank-1.json").read_text())
    assert record["lease_scope"] == "job" and record["phase"] == "epoch_end"
    # the saves were seen as checkpoint, never as a hang, before the injected deadlock
    verdicts = run.verdicts()
    assert "checkpoint" in verdicts, (verdicts, run.log)
    assert verdicts.index("checkpoint") < verdicts.index("deadlock_suspected"), verdicts
    assert {"train", "checkpoint", "epoch_end"} <= run.phases_seen()
    # the deadlock: rank 1 in a job-scoped epoch_end, rank 0 frozen in train -> kill-worthy, fast
    run.assert_epoch_end_deadlock_caught("HF")


def test_hf_example_runs_to_done(tmp_path: Path) -> None:
    """The documented example, as documented: 2 ranks, files appear, the run ends in ``done``."""
    run = run_with_daemon(
        tmp_path, torchrun(EXAMPLES / "hf_trainer.py", "--out", str(tmp_path / "out")), "hf-example"
    )
    assert run.returncode == 0, run.log
    for rank in (0, 1):
        record = json.loads((run.progress_dir / "hf-example" / f"rank-{rank}.json").read_text())
        assert (record["phase"], record["step"], record["lease_scope"]) == ("done", 16, "job")
    assert "deadlock_suspected" not in run.verdicts()
