"""Any local Hugging Face causal LM by path: ``model.path = DIR`` loads DIR's weights
(``from_pretrained(local_files_only=True)``) - checked by the first step's loss, which must be the saved
model's own loss on the same two micro-batches, computed here without DeepSpeed. The same run has an
unusable progress directory, which must cost one warning and nothing else."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ft_trainer.config import load_config
from ft_trainer.data.data import JobData
from ft_trainer.devtools.testing import launch_local, prepare_tiny_data, write_tiny_job
from ft_trainer.train.throughput import read_metrics

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(300)]


def test_local_hf_model_dir_is_loaded_and_trained(tmp_path: Path, tokenizer_dir: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ft_trainer.planning.presets import PRESETS

    data = prepare_tiny_data(tmp_path / "data", tokenizer_dir=tokenizer_dir)
    fields = PRESETS["tiny-qwen3"].hf_config_dict()
    fields.pop("model_type")
    torch.manual_seed(1234)
    model = Qwen3ForCausalLM(Qwen3Config(**fields))
    with torch.no_grad():  # weights no random init reproduces: the run must have loaded these
        model.model.embed_tokens.weight.mul_(3.0)
    model_dir = tmp_path / "my-model"
    model.save_pretrained(model_dir)

    job = write_tiny_job(
        tmp_path / "job.toml",
        cache_dir=data.cache_dir,
        tokenizer_dir=tokenizer_dir,
        checkpoint_dir=tmp_path / "ckpt",
        world_size=1,
        model={"preset": None, "path": str(model_dir), "tokenizer": str(tokenizer_dir)},
        train={"max_steps": 3, "save_at_end": False, "save_every_epoch": False},
        optim={"warmup_steps": 0, "lr": 1e-3},
    )
    cfg = load_config(job)
    assert cfg.model.spec.source.endswith("config.json") and cfg.model.spec.vocab_size == 512

    # the saved model's mean loss on the first optimizer step's two micro-batches
    plan = JobData.open(cfg).epoch_plan(0)
    batches = list(JobData.open(cfg).rank_stream(plan, 0).iter_micro_batches(2))
    model.eval()
    with torch.no_grad():
        want = (
            sum(float(model(input_ids=torch.from_numpy(b), labels=torch.from_numpy(b)).loss) for b in batches)
            / 2
        )

    # and the progress directory is unusable (under a regular file): training must not care
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with launch_local(job, world_size=1, log_dir=tmp_path / "logs", progress_dir=blocker / "progress") as run:
        assert run.wait(240) == [0], run.tail()
        log = run.output(0)
    steps = [r for r in read_metrics(tmp_path / "ckpt" / "metrics" / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert steps[0]["loss"] == pytest.approx(want, rel=1e-4)
    assert steps[2]["loss"] < steps[0]["loss"]
    assert log.count("cannot write progress file") == 1  # said once, then training went on
    if importlib.util.find_spec("accelerate") is None:
        assert "accelerate package is missing" in log
