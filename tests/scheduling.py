"""The longest tests first, so that ``make test``'s workers finish together.

Most of the suite's wall time is a few dozen tests that wait on real processes (DeepSpeed jobs,
daemons, Prometheus, Slurm); the other ~1,500 tests take a few minutes together. pytest-xdist hands
work out in collection order, so a 160 s test collected last starts when the other workers have
nothing left to do, and the run ends 160 s after everyone else. Longest-first (the LPT rule) keeps
the short tests for the end, where they fill the gaps.

``tests/durations.json`` holds the measured seconds of every test that takes one or more (setup, call
and teardown together, as pytest-split's ``.test_durations``). Tests it does not name count as zero
and keep their collection order, after the named ones. A group of ``tests/conftest.py``'s
``XDIST_GROUPS`` is one unit of work: it is placed by the sum of its tests and stays together.
``tests/conftest.py``'s ``pytest_collection_modifyitems`` applies the order once it has marked the
groups; ``make test`` passes ``--no-loadscope-reorder`` so that xdist keeps it (by default it puts the
groups with the most tests first, whatever their seconds).

Refresh the file after adding or changing slow tests (``make durations``: the whole suite once,
``--store-durations``). A stale file only makes the order less good, never a test wrong.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS_FILE = Path(__file__).resolve().parent / "durations.json"
STORE_MIN_S = 1.0
"""Tests faster than this are left out of the file: their order does not matter."""


def load_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """``{nodeid: seconds}``; an absent or unreadable file is no order at all (never an error)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: float(v) for k, v in doc.items() if isinstance(k, str) and isinstance(v, int | float)}


def plain_nodeid(nodeid: str) -> str:
    """``nodeid`` without the ``@<group>`` that pytest-xdist's workers append to a grouped test's id."""
    head, at, tail = nodeid.rpartition("@")
    return head if at and tail and not any(c in tail for c in "/:[]") else nodeid


def unit_of(item: pytest.Item) -> str:
    """The unit pytest-xdist's ``loadgroup`` schedules: the test's ``xdist_group``, else the test."""
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        name = marker.args[0] if marker.args else marker.kwargs.get("name", "default")
        return f"group:{name}"
    return item.nodeid


def longest_first(items: list[pytest.Item], durations: dict[str, float]) -> list[pytest.Item]:
    """``items`` by their unit's measured seconds, longest first; a unit's tests stay together, in
    their order, and ties (unmeasured tests among them) keep the collection order."""
    units: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        units[unit_of(item)].append(item)
    seconds = {u: sum(durations.get(i.nodeid, 0.0) for i in members) for u, members in units.items()}
    ordered = sorted(units, key=lambda u: -seconds[u])  # stable: equal units keep the collection order
    return [item for u in ordered for item in units[u]]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        default=False,
        help=f"write each test's seconds (>= {STORE_MIN_S:g} s) to tests/durations.json (make durations)",
    )


class DurationStore:
    """Sums each test's phases as the reports arrive (in the xdist controller, from every worker)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[plain_nodeid(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Merge into the file: a partial run updates its own tests and keeps the others' (those of a
        test file that no longer exists go)."""
        kept = load_durations()
        for nodeid, seconds in self.seconds.items():
            kept.pop(nodeid, None)
            if seconds >= STORE_MIN_S:
                kept[nodeid] = round(seconds, 1)
        root = DURATIONS_FILE.parent.parent
        kept = {k: v for k, v in sorted(kept.items()) if (root / k.split("::")[0]).exists()}
        DURATIONS_FILE.write_text(json.dumps(kept, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    # Only where the reports end up: the controller, or a run without xdist (not in its workers).
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationStore(), "gpu-watchdog-durations")
