"""The suite's longest-first order (tests/scheduling.py): units by measured seconds, groups kept whole."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.scheduling import load_durations, longest_first, plain_nodeid


@dataclass
class Item:
    nodeid: str
    group: str | None = None

    def get_closest_marker(self, name: str):
        return pytest.mark.xdist_group(self.group).mark if name == "xdist_group" and self.group else None


def test_longest_units_first_groups_whole_and_unmeasured_tests_keep_their_order() -> None:
    items = [
        Item("a.py::fast"),
        Item("b.py::g1", "g"),
        Item("c.py::slow"),
        Item("a.py::unknown"),
        Item("b.py::g2", "g"),
        Item("d.py::medium"),
    ]
    seconds = {
        "c.py::slow": 50.0,
        "b.py::g1": 20.0,
        "b.py::g2": 20.0,
        "d.py::medium": 30.0,
        "a.py::fast": 1.0,
    }
    order = [i.nodeid for i in longest_first(items, seconds)]  # type: ignore[arg-type]
    # the group counts as 40 s, ahead of the 30 s test; its tests stay together, in collection order
    assert order == ["c.py::slow", "b.py::g1", "b.py::g2", "d.py::medium", "a.py::fast", "a.py::unknown"]


def test_xdist_group_suffix_is_dropped_but_parametrize_ids_are_kept() -> None:
    assert plain_nodeid("tests/x.py::test_a@slurm") == "tests/x.py::test_a"
    assert plain_nodeid("tests/x.py::test_a[user@host]") == "tests/x.py::test_a[user@host]"
    assert plain_nodeid("tests/x.py::test_a") == "tests/x.py::test_a"


def test_a_broken_durations_file_is_no_order_not_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "durations.json"
    bad.write_text("{not json")
    assert load_durations(bad) == {}
    bad.write_text(json.dumps({"t.py::a": 3, "t.py::b": "slow", "t.py::c": 1.5}))
    assert load_durations(bad) == {"t.py::a": 3.0, "t.py::c": 1.5}
    assert load_durations(tmp_path / "absent.json") == {}
