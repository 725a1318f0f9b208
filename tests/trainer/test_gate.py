"""``ft-trainer gate``: each invariant fails with its own message and exit 2; a sound job passes with exit 0;
the gate imports neither torch nor DeepSpeed; ``--json`` keeps the DESIGN contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ft_trainer.cli import main
from ft_trainer.config import load_config
from ft_trainer.data.data import JobData
from ft_trainer.devtools.synthetic import synthetic_texts, write_jsonl
from ft_trainer.gate import run_gate
from ft_trainer.planning.estimates import checkpoint_bytes
from ft_trainer.planning.presets import PRESETS
from tests.trainer.conftest import JobWriter, make_cache

REPO = Path(__file__).resolve().parents[2]


def gate(capsys: pytest.CaptureFixture[str], job: Path, *extra: str) -> tuple[int, dict]:
    rc = main(["gate", "--config", str(job), "--json", *extra])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def by_name(report: dict) -> dict[str, dict]:
    return {i["name"]: i for i in report["invariants"]}


def failed(report: dict) -> list[str]:
    return [i["name"] for i in report["invariants"] if not i["ok"]]


@pytest.fixture(scope="module")
def imbalanced_cache(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """60 short documents and one long one: whichever rank packs the long one gets more micro-batches."""
    root = tmp_path_factory.mktemp("imbalanced")
    texts = synthetic_texts(60, seed=2, mean_words=6, sigma=0.3)
    texts.insert(17, synthetic_texts(1, seed=3, mean_words=900, sigma=0.01)[0])
    write_jsonl(root / "corpus" / "docs.jsonl", texts)
    return make_cache(root / "corpus", root / "cache", tokenizer_dir)


def test_sound_job_passes_with_every_invariant(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter
) -> None:
    rc, rep = gate(capsys, write_job())
    assert rc == 0, failed(rep)
    assert rep["ok"] is True and isinstance(rep["seconds"], float)
    assert [i["name"] for i in rep["invariants"]] == [
        "batch_arithmetic",
        "cluster_agreement",
        "seq_len_within_positions",
        "cache_integrity",
        "tokenizer_matches_cache",
        "token_ids_within_vocab",
        "equal_steps_per_rank",
        "checkpoint_dir",
        "zero3_memory",
    ]
    for inv in rep["invariants"]:
        assert (
            set(inv) == {"name", "ok", "detail", "seconds", "skipped"}
            and inv["seconds"] >= 0
            and not inv["skipped"]
        )
    assert len(rep["plan_fingerprint"]) == 16
    # text mode: one PASS line per invariant and a verdict with the time
    assert main(["gate", "--config", str(write_job())]) == 0
    text = capsys.readouterr().out
    assert text.count("\nPASS  ") == 9 and "gate: PASS in " in text


def test_imbalanced_plan_is_refused_naming_the_ranks_and_passes_with_equalize(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, imbalanced_cache: Path
) -> None:
    data = {"cache_dir": str(imbalanced_cache), "seq_len": 32, "micro_batch": 1, "grad_accum": 1}
    off = write_job(name="off.toml", data=data | {"equalize": False}, job={"epochs": 1})
    plan = JobData.open(load_config(off)).epoch_plan(0)
    lo, hi = int(plan.micro_batches.min()), int(plan.micro_batches.max())
    assert lo < hi  # the corpus really is imbalanced
    short_rank, long_rank = int(np.argmin(plan.micro_batches)), int(np.argmax(plan.micro_batches))

    rc, rep = gate(capsys, off)
    assert rc == 2 and rep["ok"] is False
    assert failed(rep) == ["equal_steps_per_rank"]
    detail = by_name(rep)["equal_steps_per_rank"]["detail"]
    assert f"epoch 0: rank {short_rank} gets {lo} micro-batches, rank {long_rank} gets {hi}" in detail, detail
    assert f"enable equalize (data.equalize = true) or drop {hi - lo} batches" in detail

    on = write_job(name="on.toml", data=data | {"equalize": True}, job={"epochs": 1})
    rc, rep = gate(capsys, on)
    assert rc == 0, failed(rep)
    detail = by_name(rep)["equal_steps_per_rank"]["detail"]
    assert f"every rank runs {lo} micro-batches = {lo} steps" in detail and "equalize on" in detail
    # the equalized plan is what training will run: same code, same numbers
    assert JobData.open(load_config(on)).epoch_plan(0).micro_batches.tolist() == [lo, lo]


def test_truncated_cache_fails_cache_integrity(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, cache_copy: Path
) -> None:
    victim = sorted(cache_copy.glob("*.tokens.npy"))[1]
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size - 100)
    rc, rep = gate(capsys, write_job(data={"cache_dir": str(cache_copy)}))
    assert rc == 2
    assert "cache_integrity" in failed(rep)
    detail = by_name(rep)["cache_integrity"]["detail"]
    assert f"{victim}: {size - 100} bytes, manifest says {size}: the file is truncated" in detail
    assert by_name(rep)["equal_steps_per_rank"]["detail"].startswith("skipped: the cache is not sound")


def test_checks_that_need_the_cache_are_skipped_not_failed(write_job: JobWriter, tmp_path: Path) -> None:
    """No cache yet: cache_integrity fails and names the command; the three checks that read the cache
    say SKIP, are counted apart ("not checked"), and the gate still refuses (exit 2)."""
    from ft_trainer.config import load_config
    from ft_trainer.gate import run_gate

    report = run_gate(load_config(write_job(data={"cache_dir": str(tmp_path / "no-cache")})))
    assert not report.ok
    skipped = {i.name for i in report.skipped()}
    assert skipped == {"tokenizer_matches_cache", "token_ids_within_vocab", "equal_steps_per_rank"}
    assert "cache_integrity" in {i.name for i in report.failed()}
    assert not skipped & {i.name for i in report.failed()}
    text = report.render()
    assert "SKIP  equal_steps_per_rank" in text and "FAIL  equal_steps_per_rank" not in text
    assert f"invariants failed, {len(skipped)} not checked until those pass)" in text
    assert all(i["skipped"] for i in report.to_json()["invariants"] if i["name"] in skipped)


def test_missing_manifest_says_resume(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, cache_copy: Path
) -> None:
    (cache_copy / "manifest.json").unlink()
    rc, rep = gate(capsys, write_job(data={"cache_dir": str(cache_copy)}))
    assert rc == 2
    assert "the cache is incomplete" in by_name(rep)["cache_integrity"]["detail"]
    assert "rerun `ft-trainer pretokenize`" in by_name(rep)["cache_integrity"]["detail"]


def test_content_change_caught_by_sample_or_deep(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, tmp_path: Path, tokenizer_dir: Path
) -> None:
    from ft_trainer.data.cache import sample_windows

    write_jsonl(tmp_path / "big" / "big.jsonl", synthetic_texts(2500, seed=6, mean_words=60))
    cache = make_cache(tmp_path / "big", tmp_path / "bigcache", tokenizer_dir, shard_bytes=64 << 20)
    victim = next(cache.glob("*.tokens.npy"))
    size = victim.stat().st_size
    windows = sample_windows(size)
    assert len(windows) > 1, "the test needs a file larger than the sampled windows"
    # a byte outside every sampled window: the sampled check cannot see it, --deep must
    hole = next(o for o in range(size // 2, size) if not any(a <= o < a + n for a, n in windows))
    job = write_job(data={"cache_dir": str(cache)})
    data = bytearray(victim.read_bytes())
    data[hole] ^= 0x01
    victim.write_bytes(bytes(data))
    rc, rep = gate(capsys, job)
    assert rc == 0, failed(rep)
    rc, rep = gate(capsys, job, "--deep")
    assert rc == 2 and rep["deep"] is True
    assert "SHA-256 differs from the manifest (--deep)" in by_name(rep)["cache_integrity"]["detail"]
    # a byte inside a sampled window is caught without --deep
    off = windows[len(windows) // 2][0]
    data[off] ^= 0x01
    victim.write_bytes(bytes(data))
    rc, rep = gate(capsys, job)
    assert rc == 2 and "sampled checksum differs" in by_name(rep)["cache_integrity"]["detail"]


def test_vocabulary_mismatch(capsys: pytest.CaptureFixture[str], write_job: JobWriter) -> None:
    rc, rep = gate(capsys, write_job(model={"vocab_size": 300}))
    assert rc == 2 and failed(rep) == ["token_ids_within_vocab"]
    detail = by_name(rep)["token_ids_within_vocab"]["detail"]
    assert "largest token id in the cache is 511 >= model vocabulary 300" in detail
    assert "Re-tokenize with the model's tokenizer, or fix model.vocab_size" in detail


def test_world_size_mismatch(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, tmp_path: Path
) -> None:
    rc, rep = gate(capsys, write_job(cluster={"world_size": 3}))
    assert rc == 2 and "cluster_agreement" in failed(rep)
    assert "world_size 3 != nodes 1 x gpus_per_node 2 = 2" in by_name(rep)["cluster_agreement"]["detail"]
    # hostfile disagreeing with the job's topology
    (tmp_path / "hostfile").write_text("node-a slots=8\nnode-b slots=4  # half a node\n")
    rc, rep = gate(
        capsys,
        write_job(cluster={"nodes": 2, "gpus_per_node": 8, "launcher": "deepspeed", "hostfile": "hostfile"}),
    )
    assert rc == 2
    detail = by_name(rep)["cluster_agreement"]["detail"]
    assert "node-b (line 2) has slots=4, cluster.gpus_per_node = 8" in detail
    assert (
        "has 12 slots in all, world_size = 16: the launcher would start 12 ranks for a plan of 16" in detail
    )
    # multi-node deepspeed without a hostfile; local launcher on two nodes
    rc, rep = gate(capsys, write_job(cluster={"nodes": 2, "gpus_per_node": 1, "launcher": "deepspeed"}))
    assert "needs cluster.hostfile" in by_name(rep)["cluster_agreement"]["detail"]
    rc, rep = gate(capsys, write_job(cluster={"nodes": 2, "gpus_per_node": 1, "launcher": "local"}))
    assert "launcher 'local' runs on one node" in by_name(rep)["cluster_agreement"]["detail"]
    (tmp_path / "hostfile").write_text("node-a slots=1\nnode-a slots=1\n")
    rc, rep = gate(capsys, write_job(cluster={"nodes": 2, "gpus_per_node": 1, "hostfile": "hostfile"}))
    assert "hostfile:2: node-a listed twice" in by_name(rep)["cluster_agreement"]["detail"]


def test_unwritable_checkpoint_dir(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    rc, rep = gate(capsys, write_job(checkpoint={"dir": str(blocker / "ckpt")}))
    assert rc == 2 and failed(rep) == ["checkpoint_dir"]
    assert (
        f"cannot be created: {blocker} exists and is not a directory"
        in by_name(rep)["checkpoint_dir"]["detail"]
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_checkpoint_dir(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, tmp_path: Path
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, rep = gate(capsys, write_job(checkpoint={"dir": str(ro)}))
        assert rc == 2 and "is not writable" in by_name(rep)["checkpoint_dir"]["detail"]
        rc, rep = gate(capsys, write_job(checkpoint={"dir": str(ro / "sub")}))
        assert rc == 2 and "is not writable" in by_name(rep)["checkpoint_dir"]["detail"]
    finally:
        ro.chmod(0o755)


def test_checkpoint_room_for_a_32b_model(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, tmp_path: Path
) -> None:
    need = checkpoint_bytes(PRESETS["qwen3-32b"].params)
    assert need == int(32_762_123_264 * 16 * 1.1)
    if shutil.disk_usage(tmp_path).free >= need:
        pytest.skip("this disk has room for a 32B checkpoint")
    rc, rep = gate(capsys, write_job(model={"preset": "qwen3-32b", "tokenizer": None}))
    detail = by_name(rep)["checkpoint_dir"]["detail"]
    assert (
        rc == 2
        and f"a full ZeRO-3 checkpoint needs {need / 2**30:,.1f} GiB" in detail
        and "free on" in detail
    )


def test_other_invariants_fail_with_their_own_messages(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, tmp_path: Path
) -> None:
    rc, rep = gate(capsys, write_job(data={"seq_len": 2048}))
    assert rc == 2 and failed(rep) == ["seq_len_within_positions"]
    assert (
        "data.seq_len 2,048 > tiny-qwen3's max positions 1,024"
        in by_name(rep)["seq_len_within_positions"]["detail"]
    )

    rc, rep = gate(capsys, write_job(data={"global_batch": 16}))
    assert rc == 2 and failed(rep) == ["batch_arithmetic"]
    assert (
        "micro_batch 2 x grad_accum 2 x world_size 2 = 8, but data.global_batch = 16: set data.grad_accum = 4"
        in by_name(rep)["batch_arithmetic"]["detail"]
    )

    from ft_trainer.data.tokenization import train_byte_bpe

    other = train_byte_bpe(synthetic_texts(100, seed=8), tmp_path / "othertok", vocab_size=300)
    rc, rep = gate(capsys, write_job(model={"tokenizer": str(other)}))
    assert rc == 2 and failed(rep) == ["tokenizer_matches_cache"]

    # ZeRO-3 memory: Qwen3-32B on one 80 GiB GPU cannot hold 18 bytes/param of model states
    rc, rep = gate(
        capsys,
        write_job(
            model={"preset": "qwen3-32b", "tokenizer": None},
            cluster={"gpus_per_node": 1, "gpu_memory_gib": 80},
            data={"micro_batch": 1},
        ),
    )
    detail = by_name(rep)["zero3_memory"]["detail"]
    assert rc == 2 and "zero3_memory" in failed(rep) and "GPU estimate exceeds 90% of 80 GiB" in detail

    rc, rep = gate(
        capsys, write_job(data={"seq_len": 100_000}, job={"epochs": 1}, model={"max_positions": 200_000})
    )
    assert rc == 2 and failed(rep) == ["equal_steps_per_rank"]
    assert "0 optimizer steps per rank" in by_name(rep)["equal_steps_per_rank"]["detail"]


def test_stream_mode_checks_the_source_files(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter, tmp_path: Path, corpus: tuple[Path, list[str]]
) -> None:
    moved = tmp_path / "corpus"
    shutil.copytree(corpus[0], moved)
    job = write_job(data={"mode": "stream", "source_dir": str(moved)})
    rc, rep = gate(capsys, job)
    assert rc == 0 and "stream_source" in by_name(rep), failed(rep)
    (moved / "b.txt").unlink()
    with open(moved / "a.jsonl", "a") as f:
        f.write('{"text": "appended"}\n')
    rc, rep = gate(capsys, job)
    detail = by_name(rep)["stream_source"]["detail"]
    assert (
        rc == 2
        and "1 source file(s) missing, e.g. b.txt" in detail
        and "1 changed size, e.g. a.jsonl" in detail
    )


def test_bad_config_exits_2_naming_file_and_key(
    capsys: pytest.CaptureFixture[str], write_job: JobWriter
) -> None:
    job = write_job(data={"micro_batch": -1})
    rc = main(["gate", "--config", str(job), "--json"])
    cap = capsys.readouterr()
    assert rc == 2
    rep = json.loads(cap.out)
    assert rep["ok"] is False and rep["invariants"][0]["name"] == "config"
    line = job.read_text().splitlines().index("micro_batch = -1") + 1
    assert f"{job}:{line}: data.micro_batch: expected an integer >= 1, got -1" in cap.err


def test_gate_process_imports_neither_torch_nor_deepspeed(write_job: JobWriter) -> None:
    job = write_job()
    code = (
        "import sys, json\n"
        "from ft_trainer.cli import main\n"
        f"rc = main(['gate', '--config', {str(job)!r}, '--json'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'transformers', "
        "'tokenizers', 'pyarrow'))\n"
        "print('HEAVY=' + json.dumps(heavy))\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    heavy = json.loads(proc.stdout.rsplit("HEAVY=", 1)[1])
    assert heavy == []
    report = json.loads(proc.stdout.rsplit("HEAVY=", 1)[0])
    assert report["ok"] is True


def test_console_script_exit_codes(write_job: JobWriter, imbalanced_cache: Path) -> None:
    exe = Path(sys.executable).parent / "ft-trainer"
    if not exe.exists():
        pytest.skip("console script not installed (pip install -e .)")
    ok = subprocess.run(
        [str(exe), "gate", "--config", str(write_job())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0 and "gate: PASS" in ok.stdout
    bad = write_job(
        name="bad.toml",
        data={
            "cache_dir": str(imbalanced_cache),
            "seq_len": 32,
            "micro_batch": 1,
            "grad_accum": 1,
            "equalize": False,
        },
        job={"epochs": 1},
    )
    proc = subprocess.run(
        [str(exe), "gate", "--config", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2 and "FAIL  equal_steps_per_rank" in proc.stdout
    assert "gate: FAIL (1 of 9 invariants failed)" in proc.stdout


def test_gate_and_training_share_the_plan(write_job: JobWriter) -> None:
    cfg = load_config(write_job(job={"epochs": 3}))
    report = run_gate(cfg)
    from ft_trainer.planning.plan import plan_fingerprint

    data = JobData.open(cfg)
    assert report.fingerprint == plan_fingerprint([data.epoch_plan(e) for e in range(3)])
