"""The built wheel installs into a fresh virtualenv and works there, next to PyPI's ``watchdog`` and
``trainer`` distributions.

Real parts: ``python -m build`` builds the wheel from this checkout, ``python -m venv`` makes a clean
environment, pip installs PyPI's ``watchdog`` (filesystem events) and ``trainer`` (Coqui) first, then
this wheel. Without its extras the base install must still answer ``gpu-watchdog --version`` and
``ft-trainer --version`` (the base install pulls no dependency, tests/test_packaging.py). All three
distributions must survive each other: PyPI's ``watchdog`` imports and runs, and every file of
PyPI's ``trainer`` is still the one its RECORD lists (importing Coqui's trainer needs torch and its
other dependencies, which ``--no-deps`` leaves out: its files are what this wheel could break). An
uninstall of this wheel leaves both alone.

Needs PyPI (the isolated build and the two distributions), like the CI machine has.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from gpu_triage import __version__

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def run(*args: str | Path, cwd: Path = REPO, timeout: float = 300) -> str:
    """Run a command with the caller's PYTHONPATH dropped: a fresh virtualenv sees its own packages only."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def fresh_tree(dest: Path) -> Path:
    """This checkout's files as a fresh clone has them (tracked, plus new files git does not ignore).
    A build in the working tree reuses its ``build/`` of an earlier build, and would ship modules that
    have since been moved or deleted."""
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def build_wheel(out: Path) -> Path:
    # As `make dist` does: without isolation, offline (setuptools and wheel come from the [dev] extra).
    src = fresh_tree(out.parent / "src")
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, src, cwd=src)
    (wheel,) = out.glob("gpu_triage-*.whl")
    return wheel


def record_intact(site: Path, dist_info_glob: str) -> list[str]:
    """Files of an installed distribution whose content no longer matches its RECORD."""
    (dist_info,) = site.glob(dist_info_glob)
    broken = []
    with (dist_info / "RECORD").open(newline="") as f:
        for row in csv.reader(f):
            name, digest = row[0], row[1] if len(row) > 1 else ""
            if not digest or name.endswith(".pyc"):
                continue
            algorithm, _, expected = digest.partition("=")
            path = site / name
            if not path.is_file():
                broken.append(f"{name} (missing)")
                continue
            actual = base64.urlsafe_b64encode(hashlib.new(algorithm, path.read_bytes()).digest())
            if actual.rstrip(b"=").decode() != expected:
                broken.append(f"{name} (changed)")
    return broken


def test_the_wheel_ships_the_packages_and_leaves_the_dev_helpers_out(tmp_path: Path) -> None:
    """Every trainer layer and the demo's simulated job are in the wheel; the test/demo helpers
    (``ft_trainer.devtools``: tiny corpora, the local launcher, ``make demo``) are not."""
    names = set(zipfile.ZipFile(build_wheel(tmp_path / "dist")).namelist())
    for module in (
        "ft_trainer/cli.py",
        "ft_trainer/config.py",
        "ft_trainer/data/cache.py",
        "ft_trainer/planning/plan.py",
        "ft_trainer/train/loop.py",
        "gpu_triage/demo/simjob.py",
        "gpu_triage/model/config_schema.py",
    ):
        assert module in names
    assert [n for n in names if n.startswith("ft_trainer/devtools/")] == []
    assert [n for n in names if n.rsplit("/", 1)[-1] in ("testing.py", "synthetic.py", "simjob.py")] == [
        "gpu_triage/demo/simjob.py"
    ]


def test_the_wheel_installs_beside_pypis_watchdog_and_trainer(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python, bin_dir = env / "bin" / "python", env / "bin"
    site = Path(
        run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip()
    )

    run(python, "-m", "pip", "install", "-q", "--no-deps", "watchdog", "trainer", cwd=tmp_path)
    run(python, "-m", "pip", "install", "-q", "--no-deps", wheel, cwd=tmp_path)

    # The base install (no extras): both commands answer --version.
    assert run(bin_dir / "gpu-watchdog", "--version", cwd=tmp_path).strip() == f"gpu-watchdog {__version__}"
    assert run(bin_dir / "ft-trainer", "--version", cwd=tmp_path).strip() == f"ft-trainer {__version__}"

    # All three side by side: ours import, PyPI's watchdog imports and works, Coqui's trainer is intact.
    probe = (
        "import importlib.util, tempfile, gpu_triage, ft_trainer, watchdog\n"
        "from watchdog.events import FileSystemEventHandler\n"
        "from watchdog.observers.polling import PollingObserver\n"
        "observer = PollingObserver()\n"
        "observer.schedule(FileSystemEventHandler(), tempfile.gettempdir())\n"
        "observer.start(); observer.stop(); observer.join(5)\n"
        "print(gpu_triage.__file__, ft_trainer.__file__, watchdog.__file__)\n"
        "print(importlib.util.find_spec('trainer').origin)\n"
    )
    paths = run(python, "-c", probe, cwd=tmp_path).split()
    assert [Path(p).relative_to(site).parts[0] for p in paths] == [
        "gpu_triage",
        "ft_trainer",
        "watchdog",
        "trainer",
    ]
    assert record_intact(site, "watchdog-*.dist-info") == []
    assert record_intact(site, "trainer-*.dist-info") == []
    assert record_intact(site, "gpu_triage-*.dist-info") == []

    # Uninstalling ours leaves theirs as they were.
    run(python, "-m", "pip", "uninstall", "-y", "-q", "gpu-triage", cwd=tmp_path)
    assert not (bin_dir / "gpu-watchdog").exists()
    run(python, "-c", "import watchdog.observers", cwd=tmp_path)
    assert record_intact(site, "watchdog-*.dist-info") == []
    assert record_intact(site, "trainer-*.dist-info") == []


def test_the_base_wheels_commands_name_the_extra_they_need(tmp_path: Path) -> None:
    """The base install (no extras, nothing else in the virtualenv): every command that needs the
    daemon's or the trainer's dependencies exits 2 - not 1, a deadlock verdict - with the pip line that
    installs the extra, and no traceback. Needs no index: pip installs the local wheel only."""
    wheel = build_wheel(tmp_path / "dist")
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, clear=True).create(env)
    run(sys.executable, "-m", "pip", "--python", env / "bin" / "python", "install", "-q", "--no-deps", wheel)
    job = tmp_path / "job.toml"
    job.write_text((REPO / "deploy" / "examples" / "tiny-cpu.toml").read_text())
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    for prog in ("gpu-watchdog", "ft-trainer"):  # the base install answers --version and --help
        for flag in ("--version", "--help"):
            done = subprocess.run(
                [str(env / "bin" / prog), flag], capture_output=True, text=True, timeout=60, env=clean
            )
            assert done.returncode == 0, f"{prog} {flag}:\n{done.stderr}"
    commands = {
        ("gpu-watchdog", "status"): "daemon",
        ("gpu-watchdog", "triage", str(REPO / "tests" / "missing.csv")): "daemon",
        ("gpu-watchdog", "run", "--source", "none"): "daemon",
        ("gpu-watchdog", "tables"): "daemon",
        ("ft-trainer", "gate", "--config", str(job)): "daemon",  # the gate runs on [daemon]'s numpy
    }
    for (prog, *args), extra in commands.items():
        result = subprocess.run(
            [str(env / "bin" / prog), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=clean,  # the virtualenv's own packages only (no PYTHONPATH from the caller)
        )
        shown = f"{prog} {' '.join(args)}: rc {result.returncode}\n{result.stderr}"
        assert result.returncode == 2, shown
        assert "Traceback" not in result.stderr, shown
        assert f"needs the [{extra}] extra" in result.stderr, shown
        assert f"pip install 'gpu_triage-{__version__}-py3-none-any.whl[{extra}]'" in result.stderr, shown
    # the client side itself works: the progress contract imports without any extra
    probe = subprocess.run(
        [env / "bin" / "python", "-c", "import gpu_triage.contract, gpu_triage.integrations"], env=clean
    )
    assert probe.returncode == 0
