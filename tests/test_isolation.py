"""The isolation helper (tests/isolation.py) itself: a marked test runs as PID 1 of a namespace that
shows it none of the machine's other processes, and its outcome - pass, failure text, skip reason -
is reported as the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO
from tests.isolation import in_own_pid_namespace, pid_namespace_argv

OUTSIDER_ENV = "GPUWD_TEST_OUTSIDER_PID"


@pytest.mark.isolated
def test_a_marked_test_sees_only_its_own_processes() -> None:
    assert in_own_pid_namespace()
    assert os.getpid() == 1
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = set(psutil.pids())
        assert child.pid in pids
        for pid in pids:  # every process it can see is this test's pytest or started by it
            try:
                chain = [pid, *(p.pid for p in psutil.Process(pid).parents())]
            except psutil.NoSuchProcess:
                continue
            assert chain[-1] == 1, chain
    finally:
        child.kill()
        child.wait()


def test_the_prefix_hides_the_callers_processes(tmp_path: Path) -> None:
    token = f"outsider-{os.getpid()}-{tmp_path.name}"
    outsider = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(60)", token])
    probe = [
        sys.executable,
        "-c",
        "import psutil, sys\n"
        "seen = [p for p in psutil.process_iter(['cmdline']) if sys.argv[1] in (p.info['cmdline'] or [])]\n"
        "sys.exit(3 if [p for p in seen if p.pid != psutil.Process().pid] else 0)",
        token,
    ]
    try:
        assert subprocess.run(probe, timeout=60).returncode == 3  # outside, the probe finds it
        assert subprocess.run([*pid_namespace_argv(), *probe], timeout=60).returncode == 0
    finally:
        outsider.kill()
        outsider.wait()


def test_the_outcome_of_the_isolated_run_is_the_tests_own(tmp_path: Path) -> None:
    pid_namespace_argv()  # skip (by hand) or fail (CI) where no namespace can be made
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from tests.isolation import pytest_runtest_logreport, pytest_runtest_protocol  # noqa\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'isolated: own PID namespace')\n"
    )
    (tmp_path / "test_cases.py").write_text(
        "import os, pytest\n"
        "def test_plain_first():\n    assert os.getpid() != 1\n"  # leaves its module set up
        "@pytest.mark.isolated\ndef test_passes():\n    assert os.getpid() == 1\n"
        "@pytest.mark.isolated\ndef test_fails():\n    assert 1 + 1 == 3, 'arithmetic-broke'\n"
        "@pytest.mark.isolated\ndef test_skips():\n    pytest.skip('no-such-thing-here')\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('fixture-broke')\n"
        "@pytest.mark.isolated\ndef test_setup_error(broken):\n    pass\n"
    )
    (tmp_path / "test_plain.py").write_text(  # after an isolated module: a module-scoped fixture
        "import pytest\n"
        "@pytest.fixture(scope='module')\ndef shared():\n    return 1\n"
        "def test_plain(shared):\n    assert shared == 1\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rA",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_cases.py"),
            str(tmp_path / "test_plain.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "1 failed, 3 passed, 1 skipped, 1 error" in out, out  # the plain tests before and after too
    assert "arithmetic-broke" in out and "no-such-thing-here" in out and "fixture-broke" in out, out
    assert "ran in its own PID namespace" in out, out
