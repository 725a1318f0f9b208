"""Model presets and the job file: numbers, validation errors that name file/key/expected/actual."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ft_trainer.config import ConfigError, load_config
from ft_trainer.data.tokenization import load_tokenizer
from ft_trainer.planning.presets import PRESETS, count_params, from_hf_config, get_preset
from tests.trainer.conftest import JobWriter


def test_qwen3_32b_matches_public_config() -> None:
    q = get_preset("qwen3-32b")
    assert (q.hidden_size, q.num_layers, q.num_attention_heads, q.num_kv_heads, q.head_dim) == (
        5120,
        64,
        64,
        8,
        128,
    )
    assert (q.intermediate_size, q.vocab_size, q.max_positions) == (25600, 151936, 40960)
    assert q.params == 32_762_123_264  # "32.8B" on the model card
    non_embedding = q.params - 2 * q.vocab_size * q.hidden_size
    assert round(non_embedding / 1e9, 1) == 31.2  # the card's "Number of Paramaters (Non-Embedding): 31.2B"
    assert q.largest_layer_params == 151936 * 5120


def test_from_hf_config_reads_a_local_config_json(tmp_path: Path) -> None:
    cfg = PRESETS["qwen3-32b"].hf_config_dict() | {"_name_or_path": "Qwen/Qwen3-32B"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = from_hf_config(tmp_path)
    assert spec.params == count_params(PRESETS["qwen3-32b"])
    assert spec.vocab_size == 151936 and spec.max_positions == 40960 and spec.qk_norm
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="num_attention_heads"):
        from_hf_config(tmp_path)


def test_tiny_preset_vocab_covers_the_test_tokenizer(tokenizer_dir: Path) -> None:
    tok = load_tokenizer(tokenizer_dir)
    assert tok.get_vocab_size(with_added_tokens=True) <= PRESETS["tiny-qwen3"].vocab_size


def test_full_job_file_loads(write_job: JobWriter, tmp_path: Path) -> None:
    path = write_job(
        job={"expected_tokens_per_s": 53000},
        cluster={
            "nodes": 2,
            "gpus_per_node": 8,
            "launcher": "deepspeed",
            "hostfile": "hosts",
            "gpu_memory_gib": 288,
        },
        data={"global_batch": 32, "mode": "stream"},
        zero={"offload_optimizer": "cpu"},
        train={"lr": 1e-5, "anything": "kept raw for ft-trainer train"},
    )
    cfg = load_config(path)
    assert cfg.cluster.world_size == 16 and not cfg.cluster.world_size_explicit
    assert cfg.cluster.hostfile == tmp_path / "hosts"  # relative to the job file
    assert cfg.global_batch == 2 * 2 * 16
    assert cfg.data.equalize is True  # default on
    assert cfg.zero.offload_optimizer == "cpu" and cfg.zero.stage == 3
    assert cfg.extra["train"]["lr"] == 1e-5
    assert cfg.model.spec.name == "tiny-qwen3"


@pytest.mark.parametrize(
    ("sections", "key", "needle"),
    [
        ({"data": {"seq_len": 0}}, "data.seq_len", "expected an integer >= 2, got 0"),
        ({"data": {"seq_len": "4096"}}, "data.seq_len", 'got "4096"'),
        ({"data": {"equalize": 1}}, "data.equalize", "expected true or false, got 1"),
        ({"cluster": {"launcher": "slurm"}}, "cluster.launcher", "one of deepspeed, torchrun, local"),
        ({"model": {"preset": "qwen3-33b"}}, "model.preset", "one of qwen3-32b, tiny-qwen3"),
        ({"data": {"seq_len": None}}, "data.seq_len", "(required), got nothing"),
        ({"zero": {"stage": 2}}, "zero.stage", "expected 3"),
        ({"data": {"mode": "stream", "source_dir": None}}, "data.source_dir", "required when data.mode"),
    ],
)
def test_config_errors_name_file_line_key_expected_actual(
    write_job: JobWriter, sections: dict, key: str, needle: str
) -> None:
    path = write_job(**sections)
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    msg = str(ei.value)
    assert len(ei.value.problems) == 1, msg
    found = re.match(rf"{re.escape(str(path))}:(\d+): {re.escape(key)}: ", msg)
    assert found, msg
    section, leaf = key.split(".")
    line = path.read_text().splitlines()[int(found.group(1)) - 1]
    # the key's own line; a missing key points at its section's header
    assert line.startswith(f"{leaf} = ") or (line == f"[{section}]" and "got nothing" in msg), line
    assert needle in msg, msg


def test_every_problem_is_reported_at_once_each_with_its_line(tmp_path: Path) -> None:
    """Several mistakes in one file: one error lists them all, in file order, each at its line (the
    old loader stopped at the first)."""
    job = tmp_path / "job.toml"
    job.write_text(
        "[job]\n"  # 1
        "epochs = 0\n"  # 2
        "\n"  # 3
        "[model]\n"  # 4
        'preset = "tiny-qwen3"\n'  # 5
        "\n"  # 6
        "[data]  # the corpus\n"  # 7
        'cache_dir = "cache"\n'  # 8
        'seq_len = "long"\n'  # 9
        'text_field = """\nmulti = 1\n"""\n'  # 10-12: not a key line
        "micro_batchs = 2\n"  # 13
        "\n"  # 14
        "[cluster]\n"  # 15
        'launcher = "slurm"\n'  # 16
        "gpu_memory_gib = -1\n"  # 17
        "\n"  # 18
        "[checkpoint]\n"  # 19
        "keep_last = 1\n"  # 20
        "[zero]\n"  # 21
        "stage = 2\n"  # 22
        "[optimm]\n"  # 23
    )
    with pytest.raises(ConfigError) as ei:
        load_config(job)
    assert str(ei.value).splitlines() == [
        f"{job}:2: job.epochs: expected an integer >= 1, got 0",
        f'{job}:9: data.seq_len: expected an integer >= 2, got "long"',
        f"{job}:13: data.micro_batchs: unknown key (did you mean 'micro_batch'?)",
        f'{job}:16: cluster.launcher: expected one of deepspeed, torchrun, local, got "slurm"',
        f"{job}:17: cluster.gpu_memory_gib: expected a number > 0 (GiB), got -1",
        f"{job}:19: checkpoint.dir: expected a path (required), got nothing",
        f"{job}:22: zero.stage: expected 3 (this trainer runs ZeRO stage 3), got 2",
        f"{job}:23: [optimm]: unknown section (did you mean [optim]?); known: checkpoint, cluster, data, "
        "deepspeed, job, metrics, model, optim, progress, train, zero",
    ]
    assert [(p.line, p.key) for p in ei.value.problems][:2] == [(2, "job.epochs"), (9, "data.seq_len")]


def test_the_command_line_prints_every_problem_and_exits_2(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[model]\npreset = "tiny-qwen3"\n[data]\nseq_len = 1\n[checkpoint]\ndir = "c"\n')
    result = subprocess.run(
        [sys.executable, "-m", "ft_trainer.cli", "gate", "--config", str(job)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    out = result.stdout + result.stderr
    assert f"{job}:3: data.cache_dir: expected a path (required), got nothing" in out
    assert f"{job}:4: data.seq_len: expected an integer >= 2, got 1" in out


def test_unknown_key_suggests_the_close_one(write_job: JobWriter) -> None:
    path = write_job(data={"seqlen": 64})
    with pytest.raises(ConfigError, match=r"data\.seqlen: unknown key \(did you mean 'seq_len'\?\)"):
        load_config(path)
    path = write_job(clustr={"nodes": 1})
    with pytest.raises(ConfigError, match=r"\[clustr\]: unknown section \(did you mean \[cluster\]\?\)"):
        load_config(path)


def test_a_typo_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    """tomllib gives no line numbers: the key's line comes from scanning the file's text."""
    example = (Path(__file__).resolve().parents[2] / "deploy" / "examples" / "tiny-cpu.toml").read_text()
    lines = example.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("seq_len ="))
    path = tmp_path / "job.toml"
    path.write_text("\n".join([*lines[: at + 1], "micro_bach = 2", *lines[at + 1 :]]) + "\n")
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert f"{path}:{at + 2}: data.micro_bach: unknown key (did you mean 'micro_batch'?)" in str(ei.value)


def test_syntax_error_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[job]\n[data\nseq_len = 3\n")
    with pytest.raises(ConfigError) as ei:
        load_config(bad)
    # the file:line: form every other problem has (issue 28)
    assert str(ei.value).startswith(f"{bad}:2: TOML syntax error: "), str(ei.value)
    with pytest.raises(ConfigError, match="cannot read job file"):
        load_config(tmp_path / "absent.toml")


def test_example_job_files_load() -> None:
    examples = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.toml"))
    assert examples
    for path in examples:
        cfg = load_config(path)
        assert cfg.global_batch == cfg.data.global_batch or cfg.data.global_batch is None


JOB_TEXT = """[job]
name = "f"
epochs = 2
[model]
preset = "tiny-qwen3"
[data]
cache_dir = "c"
seq_len = 32
[cluster]
nodes = 1
[checkpoint]
dir = "k"
[zero]
offload_param = "cpu"
[train]
lr = 1
"""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, len(JOB_TEXT) - 1), st.integers(0, 8), st.text(max_size=6))
def test_a_mangled_job_file_gives_a_config_or_a_config_error(
    tmp_path: Path, at: int, cut: int, insert: str
) -> None:
    """Hostile input: any edit of a valid file ends in a JobConfig or a ConfigError (never another
    exception), and every line a problem names is in the file."""
    text = JOB_TEXT[:at] + insert + JOB_TEXT[at + cut :]
    job = tmp_path / "job.toml"
    job.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_config(job)
    except ConfigError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.line is None or 1 <= problem.line <= len(text.splitlines())
