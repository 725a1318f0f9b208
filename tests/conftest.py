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
from tests.scheduling import (  # noqa: F401 (pytest_addoption and pytest_configure are hooks)
    load_durations,
    longest_first,
    pytest_addoption,
    pytest_configure,
)

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


# ------------------------------------------------------------------------------ running side by side

#: ``make test`` runs the suite on ``pytest-xdist`` workers (``-n <cores> --dist loadgroup``): tests
#: are spread one by one, except those of one group, which run on one worker, one after another. A
#: group is for tests that cannot share the machine with each other, or that share a costly
#: module-scoped fixture (built once per worker that runs one of its tests). By path under tests/.
#: (Session-scoped fixtures are built once per worker: tests/trainer/conftest.py's tokenizer and
#: corpus, a few seconds each.)
XDIST_GROUPS: dict[str, str] = {
    # a real Slurm cluster (munged, MariaDB, slurmdbd, slurmctld, slurmd) and its job users
    "integration/test_slurm.py": "slurm",
    # module-scoped fixtures: tiny tokenised data sets, a generated recording, the two Unix users, the
    # rendered scenarios - each module on one worker builds them once
    "trainer/test_train_e2e.py": "test_train_e2e",
    "trainer/test_deadlock_repro.py": "test_deadlock_repro",
    "trainer/test_gate.py": "test_gate",
    "watchdog/test_triage.py": "test_triage",
    "watchdog/test_triage_cadence.py": "test_triage_cadence",
    "watchdog/test_nvsmi_csv.py": "test_nvsmi_csv",
    "watchdog/test_sim_source.py": "test_sim_source",
    "watchdog/test_shared_node.py": "test_shared_node",
}
"""The real multi-rank torch/DeepSpeed jobs are not grouped: they are most of the suite's time (20 of
its 36 minutes here), and they already run beside other work (timing assertions with slack for a
loaded machine); one group would put them all on one worker."""


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups (it renames the node ids)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            where = item.path.resolve().relative_to(tests_dir).as_posix()
        except ValueError:
            continue
        group = XDIST_GROUPS.get(where)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items[:] = longest_first(items, load_durations())  # tests/scheduling.py
