"""Tests that run an armed daemon run in a PID namespace of their own.

An armed daemon judges every process it can see: on a shared machine (two checkouts running their
suites side by side, a ``make run`` beside them) a test's daemon would list the other run's ranks as
jobs and could signal them. In a new PID namespace with its own ``/proc`` the kernel shows the daemon
only the processes started inside it, so a test's daemon sees the test's job and nothing else.

Two ways in, one mechanism (``unshare --fork --pid --mount-proc --kill-child``, root and util-linux):

- ``@pytest.mark.isolated`` on a test (or ``pytestmark`` on a module): the test runs in a fresh
  ``pytest`` that is PID 1 of a new namespace (:func:`pytest_runtest_protocol`, imported by
  ``tests/conftest.py``); its outcome, failure text and skip reason are reported as the test's own.
  Fixtures run inside, never in the outer process. When the namespace ends (the test finished, or the
  outer run timed out and ``unshare`` died), the kernel kills every process left in it.
- :func:`pid_namespace_argv` for a test that starts its daemon as a subprocess: prefix the command
  (``[*pid_namespace_argv(), sys.executable, "-m", ...]``) and everything it starts stays inside.

Without root or ``unshare`` the test is skipped by hand and fails under CI (``CI=true``), as for every
outside binary (:func:`tests.conftest.require_binary`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
MARKER = "isolated"
PARENT_NS_ENV = "GPUWD_TEST_PARENT_PIDNS"
"""The outer run's PID namespace (``/proc/self/ns/pid``): the inner run checks it is in another one."""
REPORT_ENV = "GPUWD_TEST_ISOLATED_REPORT"
"""Where the inner run writes its reports (one JSON line per phase)."""
OUTPUT_TAIL_CHARS = 6000


def _pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def isolation_unavailable() -> str | None:
    """Why a PID namespace cannot be made here (None: it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "a PID namespace with its own /proc needs root (CI runs as root)"
    return None


def _refuse(why: str) -> None:
    msg = f"this test runs an armed daemon, which must not see the machine's other processes: {why}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg + " (CI=true: .ci/run runs the suite as root with util-linux)")
    pytest.skip(msg)


def pid_namespace_prefix() -> list[str] | None:
    """The command prefix that runs a command as PID 1 of a new PID namespace with its own ``/proc``
    (everything it starts dies with it); None where that cannot be done (benchmarks: say so)."""
    unshare = shutil.which("unshare")
    if unshare is None or isolation_unavailable() is not None:
        return None
    return [unshare, "--fork", "--pid", "--mount-proc", "--kill-child"]


def pid_namespace_argv() -> list[str]:
    """:func:`pid_namespace_prefix` for a test: skips (by hand) or fails (CI) where it cannot be done."""
    why = isolation_unavailable()
    if why is not None:
        _refuse(why)
    prefix = pid_namespace_prefix()
    assert prefix is not None
    return prefix


def in_own_pid_namespace() -> bool:
    """Whether this process is the inner run of :func:`run_item_isolated` (the kernel says it is in
    another PID namespace than the run that started it)."""
    parent = os.environ.get(PARENT_NS_ENV)
    return bool(parent) and _pid_ns() not in ("", parent)


# ------------------------------------------------------------------------------ the pytest part


def _timeout_s(item: pytest.Item) -> float:
    """The test's pytest-timeout limit (its marker, else the ini's ``timeout``), 600 s without one."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    try:
        return float(item.config.getini("timeout") or 600.0)
    except (TypeError, ValueError):
        return 600.0


def run_item_isolated(item: pytest.Item) -> list[dict[str, Any]]:
    """Run ``item`` in a fresh pytest in a new PID namespace; its reports (when, outcome, text)."""
    argv = pid_namespace_argv()
    with tempfile.TemporaryDirectory(prefix="gpuwd-isolated-") as tmp:
        report = Path(tmp) / "reports.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        env.update({PARENT_NS_ENV: _pid_ns(), REPORT_ENV: str(report)})
        cmd = [
            *argv,
            sys.executable,
            "-m",
            "pytest",
            item.nodeid,
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",  # one test, in-process: a parallel suite's options must not fan it out again
            f"--basetemp={Path(tmp) / 'basetemp'}",
            "-o",
            "addopts=-ra --strict-markers",
        ]
        try:
            done = subprocess.run(
                cmd,
                cwd=str(item.config.rootpath),
                env=env,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=_timeout_s(item) + 30.0,
            )
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            err = e.stderr or ""
            output = (out if isinstance(out, str) else out.decode("utf-8", "replace")) + (
                err if isinstance(err, str) else err.decode("utf-8", "replace")
            )
            code = -1
        rows = []
        if report.exists():
            for line in report.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    if not rows or (code != 0 and not any(r["outcome"] == "failed" for r in rows)):
        rows.append(
            {
                "when": "call",
                "outcome": "failed",
                "longrepr": f"the isolated run exited {code} (command: {' '.join(cmd)})",
            }
        )
    for r in rows:
        if r["outcome"] == "failed":
            r["longrepr"] = (
                f"[ran in its own PID namespace: {' '.join(argv)}]\n{r['longrepr']}\n"
                f"---- output of the isolated run (tail) ----\n{output[-OUTPUT_TAIL_CHARS:]}"
            )
    return rows


def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A test marked ``isolated`` runs in a PID namespace of its own (see the module's docstring)."""
    if item.get_closest_marker(MARKER) is None or in_own_pid_namespace():
        return None
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    keywords = {k: 1 for k in item.keywords}
    try:
        rows = run_item_isolated(item)
    except (pytest.skip.Exception, pytest.fail.Exception) as e:  # no namespace to be had
        skipped = isinstance(e, pytest.skip.Exception)
        rows = [
            {
                "when": "setup",
                "outcome": "skipped" if skipped else "failed",
                "longrepr": str(e.msg),
                "location": [str(item.location[0]), (item.location[1] or 0) + 1],
            }
        ]
    if rows[0]["when"] != "setup":
        rows.insert(0, {"when": "setup", "outcome": "passed", "longrepr": ""})
    if rows[-1]["when"] != "teardown":
        rows.append({"when": "teardown", "outcome": "passed", "longrepr": ""})
    # This process set nothing up for the item, but the items before it left their module's (and
    # session's) fixtures set up for it: tear down what the next item does not share, as pytest's own
    # teardown does - else the next item of another module finds a stack it does not descend from.
    done = pytest.CallInfo.from_call(lambda: item.session._setupstate.teardown_exact(nextitem), "teardown")
    if done.excinfo is not None:
        rows[-1] = {"when": "teardown", "outcome": "failed", "longrepr": str(done.excinfo.getrepr())}
    for r in rows:
        when = r["when"] if r["when"] in ("setup", "call", "teardown") else "call"
        longrepr: Any = None
        if r["outcome"] == "skipped":
            path, line = r.get("location") or [str(item.location[0]), (item.location[1] or 0) + 1]
            longrepr = (str(path), int(line), f"Skipped: {r['longrepr']}")
        elif r["outcome"] == "failed":
            longrepr = r["longrepr"]
        rep = pytest.TestReport(
            item.nodeid,
            item.location,
            keywords,
            r["outcome"],
            longrepr,
            when,
            duration=r.get("duration") or 0.0,
        )
        ihook.pytest_runtest_logreport(report=rep)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the inner run: write each phase's outcome where the outer run reads it."""
    path = os.environ.get(REPORT_ENV)
    if not path or not in_own_pid_namespace():
        return
    location = None
    if report.skipped and isinstance(report.longrepr, tuple):
        file, line, reason = report.longrepr
        location = [file, line]
        text = reason.removeprefix("Skipped: ")
    else:
        text = "" if report.longrepr is None else str(report.longrepr)
    row = {
        "when": report.when,
        "outcome": report.outcome,
        "longrepr": text,
        "duration": report.duration,
        "location": location,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
