"""The README's quick-start commands, run as written (the cheap ones), so the README stays true.

Every command line of the README's "Quick start" code blocks is classified: ``make`` targets are
covered by their own tests (``make run``: tests/watchdog/test_daemon.py; ``make demo``:
tests/e2e/test_demo.py; ``make test``/``bench``: CI itself); the ``curl`` lines and ``gpu-watchdog
status`` run against a real daemon started here on a free port (the README's 9410 replaced); every
other ``.venv/bin/...`` line runs in a copy of ``deploy/examples`` (so ``out/`` is not written into the
checkout), with ``run.csv`` - "your nvidia-smi log" - recorded from the built-in hang scenario. A
command the README gains that this test cannot classify fails it: add it here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BIN = Path(sys.executable).parent
#: What each command must answer (exit code, text in its output).
EXPECTED = {
    "gpu-watchdog triage": ({1}, "deadlock"),  # the recording below hangs: exit 1 is its verdict
    "python -m ft_trainer.devtools.testing prepare": ({0}, "cache:"),
    "ft-trainer gate --config deploy/examples/tiny-cpu.toml": ({0}, "gate: PASS"),
    "ft-trainer gate --config deploy/examples/qwen3-32b-2x8.toml": ({2}, "SKIP  equal_steps_per_rank"),
}

pytestmark = pytest.mark.slow


def quick_start_commands(text: str) -> list[str]:
    """The command lines of the code blocks under "## Quick start", comments stripped, in order."""
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```\n(.*?)```", section, re.S):
        for line in block.splitlines():
            command = line.split(" #", 1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def shell(command: str, cwd: Path, port: int | None = None) -> subprocess.CompletedProcess[str]:
    """A README line as the shell runs it, with ``.venv/bin/`` this interpreter's and the port ours."""
    line = command.replace(".venv/bin/", f"{BIN}/")
    if port is not None:
        line = line.replace("127.0.0.1:9410", f"127.0.0.1:{port}")
        if line.endswith("gpu-watchdog status"):
            line += f" --url http://127.0.0.1:{port}"
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_quick_start_lists_the_commands_this_test_knows() -> None:
    commands = quick_start_commands(README.read_text())
    assert commands[:2] == ["make run", "make test"]
    unknown = [
        c
        for c in commands
        if not c.startswith(("make ", "curl ", ".venv/bin/gpu-watchdog status"))
        and not any(key in c for key in EXPECTED)
    ]
    assert unknown == [], "README commands this test does not run: add them to EXPECTED"


def test_the_quick_start_commands_run_as_documented(tmp_path: Path) -> None:
    from gpu_triage.telemetry.recording_writer import write_nvsmi_csv
    from gpu_triage.telemetry.sim import Scenario

    commands = quick_start_commands(README.read_text())
    work = tmp_path / "checkout"
    shutil.copytree(REPO / "deploy" / "examples", work / "deploy" / "examples")
    write_nvsmi_csv(
        work / "run.csv",
        Scenario.symmetric_hang(60, 600, model="H100", gpus=8, power_limit_w=700.0),
        900,
        rate_hz=1,
        with_index=True,
    )

    # the lines that read a running daemon: a real one, on a free port
    port = free_port()
    daemon = subprocess.Popen(
        [
            str(BIN / "gpu-watchdog"),
            "run",
            "--source",
            "sim",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
            "--progress-dir",
            str(tmp_path / "progress"),
        ],
        cwd=work,
        env={**os.environ, "GPU_WATCHDOG_STACKS__ENABLED": "false"},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/status", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
            time.sleep(0.3)
        ran = []
        for command in commands:
            if command.startswith("make "):
                continue
            if command.startswith(("curl ", ".venv/bin/gpu-watchdog status")):
                result = shell(command, work, port)
                assert result.returncode in (0, 1), f"{command}:\n{result.stdout[-2000:]}{result.stderr}"
                assert result.stdout.strip(), command
                ran.append(command)
                continue
            (key,) = [k for k in EXPECTED if k in command]
            codes, needle = EXPECTED[key]
            result = shell(command, work)
            shown = f"{command}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
            assert result.returncode in codes, shown
            assert needle in result.stdout + result.stderr, shown
            assert "Traceback" not in result.stderr, shown
            ran.append(command)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    assert (work / "run.png").stat().st_size > 10_000, "triage --plot wrote the picture"
    assert len(ran) == len([c for c in commands if not c.startswith("make ")])
