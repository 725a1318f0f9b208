"""The HF callback's phase sequence, in-process (one rank, a real Trainer, evaluation and saves at the
same steps): every record it writes, in order."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.integrations.harness import EXAMPLES

pytestmark = [pytest.mark.trainer]


def test_eval_then_save_are_announced_before_they_start_and_end_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU_WATCHDOG_PROGRESS_DIR", str(tmp_path / "progress"))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    import hf_trainer

    from gpu_triage.integrations.hf import WatchdogCallback

    trainer = hf_trainer.build(
        [
            *("--out", str(tmp_path / "out"), "--job", "hf-phases", "--epochs", "1", "--samples", "32"),
            *("--save-steps", "4", "--eval-steps", "4"),
        ]
    )
    callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, WatchdogCallback))
    assert callback.progress is not None  # created at on_init_end, in init
    history: list[dict] = []
    callback.progress.writer.on_write = history.append
    time.sleep(1.2)  # past the writer's rate limit: the step at train begin must not be written as init
    trainer.train()
    sys.modules.pop("hf_trainer", None)

    phases: list[tuple[str, int]] = []
    for r in history:
        if not phases or phases[-1][0] != r["phase"]:
            phases.append((r["phase"], r["step"]))
    # 8 steps: evaluate then save at steps 4 and 8, each announced at its step, then done
    assert phases == [
        ("train", 0),
        ("eval", 4),
        ("checkpoint", 4),
        ("train", 4),
        ("eval", 8),
        ("checkpoint", 8),
        ("train", 8),
        ("done", 8),
    ], phases
    leased = [r for r in history if r["phase"] != "train"]
    assert all(r["lease_until"] > r["time"] and r["lease_scope"] == "job" for r in leased)
    # the second save's lease comes from the first one's measured duration (2 x + 30 s, clamped)
    saves = [r for r in history if r["phase"] == "checkpoint"]
    assert saves[0]["lease_until"] - saves[0]["time"] == pytest.approx(600.0, abs=0.01)
    later = next(r for r in saves if r["step"] == 8)
    assert later["lease_until"] - later["time"] < 60.0
    assert (tmp_path / "out" / "checkpoint-4").is_dir() and (tmp_path / "out" / "checkpoint-8").is_dir()
