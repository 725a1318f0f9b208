"""A real Lightning DDP job (CPU, gloo, 2 ranks under torchrun) with the watchdog callback, beside the
real daemon (``--source none``, observe mode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.harness import EXAMPLES, JOBS, run_with_daemon, torchrun

pytest.importorskip("pytorch_lightning")
pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(420)]

JOB = "lightning-test"


def test_lightning_saves_are_checkpoint_and_an_injected_deadlock_is_caught_within_30s(
    tmp_path: Path,
) -> None:
    run = run_with_daemon(
        tmp_path,
        torchrun(
            JOBS / "lightning_job.py",
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
        env={
            "TEST_STEP_S": "0.1",
            "TEST_SLOW_SAVE_S": "2",
            "TEST_DEADLOCK": "1",
            "TEST_HISTORY_DIR": str(tmp_path),
        },
        stop_when=lambda s: s.verdict == "deadlock_suspected",
        timeout_s=240,
    )
    assert run.timeline, "the daemon never saw the job:\n" + run.log
    files = sorted(p.name for p in (run.progress_dir / JOB).glob("rank-*.json"))
    assert files == ["rank-0.json", "rank-1.json"], run.log
    verdicts = run.verdicts()
    assert "checkpoint" in verdicts, (verdicts, run.log)
    assert verdicts.index("checkpoint") < verdicts.index("deadlock_suspected"), verdicts
    assert {"train", "checkpoint", "epoch_end"} <= run.phases_seen()
    # every rank announced the validation and the save (job scope), in the order they ran
    for rank in (0, 1):
        lines = (tmp_path / f"rank-{rank}.jsonl").read_text().splitlines()
        phases: list[str] = []
        for r in map(json.loads, lines):
            if not phases or phases[-1] != r["phase"]:
                phases.append(r["phase"])
        # (init was written at setup, before the test's recorder was attached)
        assert phases[:5] == ["train", "checkpoint", "train", "eval", "train"], phases
        assert phases[-1] == ("epoch_end" if rank == 1 else "train"), phases
    run.assert_epoch_end_deadlock_caught("Lightning")


def test_lightning_example_runs_to_done(tmp_path: Path) -> None:
    run = run_with_daemon(
        tmp_path, torchrun(EXAMPLES / "lightning_ddp.py", "--out", str(tmp_path / "out")), "lightning-example"
    )
    assert run.returncode == 0, run.log
    for rank in (0, 1):
        record = json.loads((run.progress_dir / "lightning-example" / f"rank-{rank}.json").read_text())
        assert (record["phase"], record["step"], record["lease_scope"]) == ("done", 16, "job")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.ckpt")) == [
        "epoch=0-step=4.ckpt",
        "epoch=0-step=8.ckpt",
        "epoch=1-step=12.ckpt",
        "epoch=1-step=16.ckpt",
    ]
    assert "deadlock_suspected" not in run.verdicts()
