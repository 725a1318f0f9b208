"""Shared test helpers.

A test that needs an outside binary (promtool, py-spy, systemd-analyze...) calls :func:`require_binary`:
run by hand it skips with the reason; under CI (``CI=true``) a missing binary is a failure, because
``.ci/run`` is supposed to have installed it. A test that runs an armed daemon is marked
``@pytest.mark.isolated`` and runs in a PID namespace of its own (:mod:`tests.isolation`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.isolation import pytest_runtest_logreport, pytest_runtest_protocol  # noqa: F401 (hooks)

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require_binary(name: str, why: str = "") -> str:
    """Return the path of ``name`` or skip (by hand) / fail (CI=true)."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed{': ' + why if why else ''}"
        if in_ci():
            pytest.fail(msg + " (CI=true: .ci/run should have installed it)")
        pytest.skip(msg)
    return path


def require_traces() -> Path:
    """The real nvidia-smi recordings in ../shared/traces (present in CI and sessions)."""
    if not TRACES.is_dir():
        if in_ci():
            pytest.fail(f"{TRACES} is missing")
        pytest.skip(f"{TRACES} is missing")
    return TRACES
