"""A new user's first steps (issue 28, 5): what the README's lines do in the environment ``make run``
alone sets up (the [daemon] extra, no torch, tokenizers or transformers).

The environment is this checkout's interpreter with the trainer extra's modules made unimportable (a
meta-path finder that raises ModuleNotFoundError for them, as a missing package does), so the test
needs no second virtualenv; tests/test_wheel_install.py does the same with a real base-wheel install.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gpu_triage.cli.extras import DAEMON_MODULES, TRAINER_MODULES

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TRAINER_ONLY = sorted(TRAINER_MODULES - DAEMON_MODULES)

RUNNER = r"""
import importlib.abc, runpy, sys
BLOCKED = set(sys.argv[1].split(","))

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def without(
    blocked: list[str], module: str, *args: str, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUNNER, ",".join(blocked), module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def readme_line(start: str) -> str:
    """The README line starting with ``start``, with the comment lines that continue it."""
    lines = README.read_text().splitlines()
    (at,) = [i for i, x in enumerate(lines) if x.startswith(start)]
    end = at + 1
    while end < len(lines) and lines[end].lstrip().startswith("#") and lines[end].startswith(" "):
        end += 1
    return "\n".join(lines[at:end])


def test_prepare_without_the_trainer_install_exits_2_with_the_hint_and_the_readme_says_so(
    tmp_path: Path,
) -> None:
    """The README's ``prepare`` line after ``make run`` alone: no traceback, exit 2 naming the extra
    and how to install it; and the README says, where it shows the line, that it needs that install."""
    line = readme_line(".venv/bin/python -m ft_trainer.devtools.testing prepare")
    assert "make install" in line, line  # said where it is shown
    done = without(TRAINER_ONLY, "ft_trainer.devtools.testing", "prepare", str(tmp_path / "tiny"))
    shown = f"rc {done.returncode}\n{done.stderr}"
    assert done.returncode == 2, shown
    assert "Traceback" not in done.stderr, shown
    assert "needs the [trainer] extra" in done.stderr and "make install" in done.stderr, shown


def test_gate_runs_with_the_daemon_extra_and_asks_for_it_when_numpy_is_missing(tmp_path: Path) -> None:
    """``ft-trainer gate`` imports no torch: with the [daemon] extra it runs (its verdict, not a
    hint); without numpy it names [daemon] - what it needs - not [trainer]."""
    job = tmp_path / "job.toml"
    job.write_text((REPO / "deploy" / "examples" / "tiny-cpu.toml").read_text())
    ran = without(TRAINER_ONLY, "ft_trainer.cli", "gate", "--config", str(job), cwd=tmp_path)
    assert ran.returncode in (0, 2) and re.search(r"^gate: (PASS|FAIL)", ran.stdout, re.M), ran.stderr
    assert "needs the" not in ran.stderr, ran.stderr
    bare = without([*TRAINER_ONLY, "numpy"], "ft_trainer.cli", "gate", "--config", str(job), cwd=tmp_path)
    shown = f"rc {bare.returncode}\n{bare.stderr}"
    assert bare.returncode == 2 and "Traceback" not in bare.stderr, shown
    assert "needs the [daemon] extra" in bare.stderr and "[daemon]'" in bare.stderr, shown
