"""``ft-trainer scaling-report``: metrics directories of one job at 4, 8 and 16 GPUs (written in the exact
format ``ft-trainer train`` writes) -> the strong-scaling table, its JSON and the PNG.

The numbers model the reference job (Qwen3-32B, seq_len 4096, 16 B300 ~ 53k tokens/s); the warm-up
records after each (re)start carry outliers that must be left out of the medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ft_trainer.cli import main
from ft_trainer.train.scaling import RunError, load_run, scaling_rows, steady_steps

TOKENS_PER_EPOCH = 1.0e9
SEQ = 4096


def write_run(root: Path, gpus: int, tokens_per_s: float, *, mfu: float, restarts: int = 1) -> Path:
    d = root / f"{gpus}gpu"
    d.mkdir(parents=True)
    tokens_per_step = gpus * 8 * SEQ
    run = {
        "job": "qwen3-32b-ft",
        "world_size": gpus,
        "nodes": max(1, gpus // 8),
        "gpus_per_node": min(8, gpus),
        "device_name": "NVIDIA B300 SXM6 AC",
        "model": "qwen3-32b",
        "tokens_per_step": tokens_per_step,
        "tokens_per_epoch": [TOKENS_PER_EPOCH, TOKENS_PER_EPOCH * 0.998],
        "peak_flops_per_device": 2.25e15,
    }
    (d / "run.json").write_text(json.dumps(run))
    lines = []
    step = 0
    for _ in range(restarts):
        lines.append({"kind": "start", "time": 0.0, "step": step})
        for i in range(20):
            step += 1
            warm = i < 2  # the first steps after a start are slow: skipped by default (10 %, >= 1)
            tps = tokens_per_s * (0.2 if warm else 1.0 + 0.01 * ((i % 3) - 1))
            lines.append(
                {
                    "kind": "step",
                    "time": float(step),
                    "step": step,
                    "loss": 2.0,
                    "tokens_per_s": tps,
                    "step_time_s": tokens_per_step / tps,
                    "mfu": mfu * tps / tokens_per_s,
                }
            )
        lines.append({"kind": "checkpoint", "time": float(step), "step": step, "bytes": 5.7e11})
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return d


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    return [
        write_run(tmp_path, 16, 53_000, mfu=0.31, restarts=2),
        write_run(tmp_path, 4, 14_400, mfu=0.34),
        write_run(tmp_path, 8, 28_000, mfu=0.33),
    ]


def test_rows_speedup_efficiency_and_epoch_cost(runs: list[Path]) -> None:
    rows = scaling_rows([load_run(r) for r in runs])
    assert [r.gpus for r in rows] == [4, 8, 16] and [r.nodes for r in rows] == [1, 1, 2]
    r4, r8, r16 = rows
    assert r4.tokens_per_s == pytest.approx(14_400) and r16.tokens_per_s == pytest.approx(53_000)
    assert r4.speedup == 1.0 and r4.efficiency == 1.0
    assert r8.speedup == pytest.approx(28_000 / 14_400) and r8.ideal_speedup == 2.0
    assert r16.efficiency == pytest.approx(53_000 / 14_400 / 4)
    assert r16.tokens_per_s_per_gpu == pytest.approx(53_000 / 16)
    assert r16.mfu == pytest.approx(0.31)
    hours = TOKENS_PER_EPOCH * 0.999 / 53_000 / 3600
    assert r16.hours_per_epoch == pytest.approx(hours) and r16.gpu_hours_per_epoch == pytest.approx(
        16 * hours
    )
    # fewer GPUs cost fewer GPU-hours per epoch here, because scaling is below 100 %
    assert r4.gpu_hours_per_epoch < r16.gpu_hours_per_epoch


def test_warmup_after_each_start_is_skipped(runs: list[Path]) -> None:
    from ft_trainer.train.throughput import read_metrics

    records = read_metrics(runs[0] / "metrics.jsonl")
    kept = steady_steps(records)  # 40 steps -> skip 4 after each start
    assert len(kept) == 32 and all(r["tokens_per_s"] > 50_000 for r in kept)
    assert len(steady_steps(records, skip_steps=0)) == 40
    assert load_run(runs[0], skip_steps=0).tokens_per_s < 53_000 * 1.01
    with pytest.raises(RunError, match="no step records left"):
        load_run(runs[1], skip_steps=20)


def test_cli_table_json_and_png(runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "plots" / "scaling.png"
    assert main(["scaling-report", *map(str, runs), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("| GPUs | nodes | tokens/s | tokens/s/GPU | speed-up (ideal) | efficiency |")
    assert lines[2].startswith("| 4 | 1 | 14,400 | 3,600 | 1.00x (1x) | 100.0% |")
    assert lines[4].startswith("| 16 | 2 | 53,000 | 3,312 | 3.68x (4x) | 92.0% |")
    assert f"plot: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    assert main(["scaling-report", *map(str, runs), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["gpus"] for r in rows] == [4, 8, 16]
    assert set(rows[0]) >= {"tokens_per_s", "speedup", "efficiency", "gpu_hours_per_epoch", "mfu", "run"}

    assert main(["scaling-report", str(tmp_path / "nothing")]) == 2
    assert "not a training run's metrics directory" in capsys.readouterr().err


def test_runs_of_different_jobs_are_refused_or_reported_with_a_warning(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two different jobs (another model, another sequence length) give a ratio that is not strong
    scaling (the issue: 132 % efficiency, said without a word). Refused, naming the difference;
    --allow-mixed prints it with a warning."""
    other = write_run(tmp_path / "other", 8, 40_000, mfu=0.4)
    run = json.loads((other / "run.json").read_text())
    run |= {"job": "llama-8b-ft", "model": "llama-8b", "seq_len": 2048}
    (other / "run.json").write_text(json.dumps(run))
    mixed = [str(runs[1]), str(other)]  # 4 GPUs of one job, 8 GPUs of another
    assert main(["scaling-report", *mixed]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error: job differs" in captured.err and "error: model differs" in captured.err
    assert f"{other}: llama-8b" in captured.err and "--allow-mixed" in captured.err

    assert main(["scaling-report", *mixed, "--allow-mixed"]) == 0
    captured = capsys.readouterr()
    assert "warning: model differs" in captured.err and "| 8 | 1 | 40,000 |" in captured.out

    # one job's runs: no word
    assert main(["scaling-report", *map(str, runs)]) == 0
    assert capsys.readouterr().err == ""
