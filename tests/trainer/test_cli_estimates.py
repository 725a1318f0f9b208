"""The command line (help, exit codes, bench-data), hostfile parsing, and the ZeRO-3/checkpoint formulas."""

from __future__ import annotations

import json

import pytest

from ft_trainer.cli import COMMANDS, build_parser, main
from ft_trainer.planning.cluster import HostfileError, check_cluster, parse_hostfile
from ft_trainer.planning.estimates import checkpoint_bytes, zero3_memory
from ft_trainer.planning.presets import PRESETS
from tests.trainer.conftest import JobWriter


def test_help_teaches_the_workflow(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    for word in ("pretokenize", "gate", "bench-data", "exit 2 = do not launch", "docs/trainer.md"):
        assert word in out
    for name, _, _ in COMMANDS:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert "usage: ft-trainer " + name in capsys.readouterr().out
    assert main([]) == 2  # no command: help, exit 2
    with pytest.raises(SystemExit) as ei:
        build_parser().parse_args(["gate"])  # --config missing
    assert ei.value.code == 2


def test_bench_data_reports_both_modes_and_a_verdict(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter
) -> None:
    job = write_job(job={"expected_tokens_per_s": 1000.0})
    assert main(["bench-data", "--config", str(job), "--seconds", "0.2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["need_tokens_per_s_per_rank"] == 500.0
    for mode in ("cache", "stream"):
        m = rep["modes"][mode]
        assert m["error"] is None and m["tokens_per_s"] > 500 and m["headroom"] > 1
        assert m["tokens"] == m["micro_batches"] * 2 * 32
    assert rep["verdict"].startswith("OK")
    assert main(["bench-data", "--config", str(job), "--seconds", "0.1", "--modes", "cache"]) == 0
    text = capsys.readouterr().out
    assert "cache " in text and "tokens/s" in text and "verdict: OK" in text
    assert main(["bench-data", "--config", str(job), "--modes", "disk"]) == 2
    no_rate = write_job(name="norate.toml")
    assert main(["bench-data", "--config", str(no_rate), "--seconds", "0.1", "--modes", "cache"]) == 0
    assert "set job.expected_tokens_per_s" in capsys.readouterr().out


def test_hostfile_parsing() -> None:
    hosts = parse_hostfile("# two nodes\nnode-a slots=8\n\nnode-b   slots = 8   # second\n", "hf")
    assert [(h.name, h.slots, h.line) for h in hosts] == [("node-a", 8, 2), ("node-b", 8, 4)]
    with pytest.raises(HostfileError, match="hf:1: node-a has no slots=N"):
        parse_hostfile("node-a\n", "hf")
    with pytest.raises(HostfileError, match="hf:2: expected 'hostname slots=N'"):
        parse_hostfile("node-a slots=8\nnode-b gpus=8\n", "hf")
    assert check_cluster(world_size=16, nodes=2, gpus_per_node=8, launcher="deepspeed", hosts=hosts) == []
    assert check_cluster(world_size=16, nodes=2, gpus_per_node=8, launcher="torchrun", hosts=None) == []
    assert len(check_cluster(world_size=8, nodes=2, gpus_per_node=8, launcher="deepspeed", hosts=hosts)) == 2


def test_checkpoint_bytes_formula() -> None:
    assert checkpoint_bytes(1_000_000, 16.0, 0.10) == 17_600_000
    assert checkpoint_bytes(PRESETS["qwen3-32b"].params) == int(32_762_123_264 * 17.6)


def test_zero3_memory_reference_job() -> None:
    q = PRESETS["qwen3-32b"]
    est = zero3_memory(q, nodes=2, gpus_per_node=8, seq_len=4096, micro_batch=1)
    # 4 x largest layer (the 151936 x 5120 embedding) + 18 bytes/param over 16 GPUs
    assert est.model_states_per_gpu_bytes == 4 * 151936 * 5120 + int(18 * q.params / 16)
    assert 39.9e9 < est.model_states_per_gpu_bytes < 40.0e9  # ~37.2 GiB
    assert est.activations_per_gpu_bytes == 64 * 2 * 4096 * 5120 + 34 * 4096 * 5120 + 8 * 4096 * 151936
    off = zero3_memory(q, nodes=2, gpus_per_node=8, seq_len=4096, micro_batch=1, offload_optimizer=True)
    assert off.model_states_per_gpu_bytes < est.model_states_per_gpu_bytes
    assert off.cpu_per_node_bytes == int(q.params * 16 / 2 * 1.5)


@pytest.mark.trainer
@pytest.mark.parametrize(
    ("offload_opt", "offload_param", "zero_init"),
    [
        (False, False, True),
        (True, False, True),
        (True, True, True),
        (False, False, False),
        (True, True, False),
    ],
)
def test_zero3_model_states_match_deepspeed(offload_opt: bool, offload_param: bool, zero_init: bool) -> None:
    """Our copy of the formula equals DeepSpeed's own estimator (imported here, never by the gate)."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    q = PRESETS["qwen3-32b"]
    cpu, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
        total_params=q.params,
        largest_layer_params=q.largest_layer_params,
        num_gpus_per_node=8,
        num_nodes=2,
        cpu_offload=offload_opt,
        cpu_offload_params=offload_param,
        zero_init=zero_init,
    )
    ours = zero3_memory(
        q,
        nodes=2,
        gpus_per_node=8,
        seq_len=4096,
        micro_batch=1,
        offload_optimizer=offload_opt,
        offload_param=offload_param,
        zero_init=zero_init,
    )
    assert ours.model_states_per_gpu_bytes == gpu
    assert ours.cpu_per_node_bytes == cpu
