"""The configuration schema helper (``gpu_triage.model.config_schema``): TOML tables into frozen
dataclasses, every problem reported with its file, line and key."""

from __future__ import annotations

import enum
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.model.config_schema import (
    Invalid,
    Reader,
    Rule,
    SchemaError,
    TomlLines,
    derived,
    describe,
    setting,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True, kw_only=True)
class Inner:
    depth: int = setting(1, ge=1, le=8)
    label: str = "x"


def _port(value: object) -> int:
    if isinstance(value, str) and value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    raise Invalid("a port number as a string")


@dataclass(frozen=True, kw_only=True)
class Section:
    name: str = setting(nonempty=True)  # required
    count: int = setting(3, ge=0)
    ratio: float = setting(0.5, gt=0, lt=1)
    enabled: bool = True
    where: Path | None = None
    mode: Literal["fast", "slow"] = "fast"
    color: Color = Color.RED
    tags: tuple[str, ...] = ()
    pair: tuple[float, float] = setting((0.1, 0.2), ge=0)
    inner: Inner | None = None
    port: int = setting(80, parse=_port)
    total: int = derived(0)


TEXT = """\
# a comment line
[svc]
name = "a"
count = -1   # too small
ratio = 2
enabled = "yes"
where = "rel/dir"
mode = "medium"
color = "green"
tags = [
  "a",
  2,
]
pair = [0.5, 0.7]
port = "http"
colour = 1
total = 5

[svc.inner]
depth = 9
lable = "y"
"""


def _read(text: str, tmp_path: Path) -> tuple[Section | None, Reader]:
    path = tmp_path / "svc.toml"
    path.write_text(text)
    reader = Reader(path, text)
    return reader.read(Section, tomllib.loads(text)["svc"], "svc"), reader


def test_a_valid_table_becomes_the_dataclass_with_typed_values(tmp_path: Path) -> None:
    text = (
        '[svc]\nname = "n"\ncount = 0\nratio = 0.25\nwhere = "sub"\nmode = "slow"\ncolor = "blue"\n'
        'tags = ["a", "b"]\npair = [1, 2]\nport = "8080"\n[svc.inner]\ndepth = 8\n'
    )
    section, reader = _read(text, tmp_path)
    assert reader.problems == []
    assert section == Section(
        name="n",
        count=0,
        ratio=0.25,
        where=tmp_path / "sub",  # relative to the file
        mode="slow",
        color=Color.BLUE,
        tags=("a", "b"),
        pair=(1.0, 2.0),
        inner=Inner(depth=8),
        port=8080,
    )
    assert isinstance(section.pair[0], float)
    defaults, _ = _read('[svc]\nname = "n"\n', tmp_path)
    assert defaults == Section(name="n")  # every default written once, on its field


def test_every_problem_with_its_line_and_key(tmp_path: Path) -> None:
    section, reader = _read(TEXT, tmp_path)
    assert section is None
    with pytest.raises(SchemaError) as ei:
        reader.raise_if_any()
    f = tmp_path / "svc.toml"
    assert str(ei.value).splitlines() == [
        f"{f}:4: svc.count: expected an integer >= 0, got -1",
        f"{f}:5: svc.ratio: expected a number > 0 and < 1, got 2",
        f'{f}:6: svc.enabled: expected true or false, got "yes"',
        f'{f}:8: svc.mode: expected one of fast, slow, got "medium"',
        f'{f}:9: svc.color: expected one of red, blue, got "green"',
        f'{f}:10: svc.tags: expected an array of strings, got ["a", 2]',
        f'{f}:15: svc.port: expected a port number as a string, got "http"',
        f"{f}:16: svc.colour: unknown key (did you mean 'color'?)",
        f"{f}:17: svc.total: unknown key (known: color, count, enabled, inner, mode, name, pair, port, "
        "ratio, tags, where)",
        f"{f}:20: svc.inner.depth: expected an integer between 1 and 8, got 9",
        f"{f}:21: svc.inner.lable: unknown key (did you mean 'label'?)",
    ]
    assert [p.line for p in ei.value.problems] == [4, 5, 6, 8, 9, 10, 15, 16, 17, 20, 21]


def test_a_missing_required_key_points_at_its_section(tmp_path: Path) -> None:
    _, reader = _read("\n\n[svc]\ncount = 2\n", tmp_path)
    (problem,) = reader.problems
    assert (problem.line, problem.key) == (3, "svc.name")
    assert problem.message == "expected a non-empty string (required), got nothing"


def test_a_section_that_is_not_a_table(tmp_path: Path) -> None:
    reader = Reader(tmp_path / "x.toml", "svc = 3\n")
    assert reader.read(Section, 3, "svc") is None
    assert str(reader.problems[0]) == f"{tmp_path / 'x.toml'}:1: svc: expected a table ([svc]), got 3"


def test_values_from_elsewhere_name_their_origin_not_a_line(tmp_path: Path) -> None:
    """How the daemon's environment overrides fit: each key can carry its own origin."""
    reader = Reader(tmp_path / "c.toml", '[svc]\nname = "n"\n')
    reader.read(Section, {"name": "n", "count": "many"}, "svc", origins={"count": "APP_SVC__COUNT"})
    assert [str(p) for p in reader.problems] == [
        'APP_SVC__COUNT: svc.count: expected an integer >= 0, got "many"'
    ]


def test_rules_across_keys_join_the_same_report(tmp_path: Path) -> None:
    text = '[svc]\nname = "n"\ncount = 5\nratio = 0.9\n'
    section, reader = _read(text, tmp_path)
    assert section is not None
    if section.count * section.ratio > 4:
        reader.expected("svc.ratio", "count x ratio <= 4", section.ratio)
    reader.problem("svc.other", "something the caller knows")  # no such key: the section's line
    with pytest.raises(SchemaError) as ei:
        reader.raise_if_any()
    assert [(p.line, p.key) for p in ei.value.problems] == [(1, "svc.other"), (4, "svc.ratio")]


def test_describe_reads_like_the_docs() -> None:
    assert describe(int | None) == "an integer"
    assert describe(tuple[int, ...]) == "an array of integers"
    assert describe(tuple[float, float]) == "an array of 2: a number, a number"
    assert describe(Literal[3]) == "one of 3"


def test_toml_lines_finds_headers_and_keys() -> None:
    text = (
        "top = 1\n"  # 1
        "[ a . b ]  # spaced\n"  # 2
        'c = """\n'  # 3
        "d = 'not a key'\n"  # 4
        '"""\n'  # 5
        "e = [\n"  # 6
        "  [1, 2],\n"  # 7
        "  [3],\n"  # 8
        "]\n"  # 9
        "f.g = 2\n"  # 10
        '"quoted key" = 3\n'  # 11
        "[[sinks]]\n"  # 12
        "url = 'x'\n"  # 13
        "[[sinks]]\n"  # 14
        "url = 'y'\n"  # 15
        "inline = { h = 1 }\n"  # 16
    )
    tomllib.loads(text)  # valid TOML
    lines = TomlLines(text)
    assert lines.line("top") == 1
    assert lines.line("a.b") == 2
    assert lines.line("a.b.c") == 3
    assert lines.line("a.b.d") == 2  # inside the string: falls back to the table
    assert lines.line("a.b.e") == 6
    assert lines.line("a.b.f.g") == 10
    assert lines.line("a.b.quoted key") == 11
    assert lines.line("sinks[0].url") == 13
    assert lines.line("sinks[1].url") == 15
    assert lines.line("sinks[1].inline.h") == 16  # an inline table's member: its key's line
    assert lines.line("nowhere.at.all") is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("[]\"'=#.,{} \nabcxyz0123_-")), max_size=300))
def test_toml_lines_never_fails_on_any_text(text: str) -> None:
    lines = TomlLines(text)
    for key in ("a", "a.b", "x.y.z", ""):
        found = lines.line(key)
        assert found is None or 1 <= found <= max(1, len(text.splitlines()))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["name", "count", "ratio", "enabled", "tags", "pair", "inner", "mode", "bogus"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
            lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children),
            max_leaves=6,
        ),
    )
)
def test_any_table_gives_a_value_or_problems_never_an_exception(table: dict) -> None:
    reader = Reader("fuzz.toml")
    section = reader.read(Section, table, "svc")
    assert (section is None) == bool(reader.problems)


@dataclass(frozen=True, kw_only=True)
class Sink:
    kind: Literal["webhook", "slack"] = setting()
    url: str = setting(nonempty=True)
    timeout_s: float = setting(5.0, gt=0, le=60)


@dataclass(frozen=True, kw_only=True)
class Alerts:
    sinks: tuple[Sink, ...] = ()


def test_arrays_of_tables_report_each_entry_at_its_own_lines(tmp_path: Path) -> None:
    """The shape of the daemon's ``[[alerts.sinks]]``: a tuple of dataclasses, each entry's problems
    at that entry's lines, keyed ``alerts.sinks[i].key``."""
    text = (
        "[alerts]\n"  # 1
        "[[alerts.sinks]]\n"  # 2
        'kind = "webhook"\n'  # 3
        'url = "http://a"\n'  # 4
        "[[alerts.sinks]]\n"  # 5
        'kind = "pager"\n'  # 6
        'url = "http://b"\n'  # 7
        "timeout_s = 0\n"  # 8
    )
    reader = Reader(tmp_path / "c.toml", text)
    assert reader.read(Alerts, tomllib.loads(text)["alerts"], "alerts") is None
    assert [(p.line, p.key, p.message) for p in reader.problems] == [
        (6, "alerts.sinks[1].kind", 'expected one of webhook, slack, got "pager"'),
        (8, "alerts.sinks[1].timeout_s", "expected a number > 0 and <= 60, got 0"),
    ]
    good = text.replace('"pager"', '"slack"').replace("timeout_s = 0", "timeout_s = 2")
    reader = Reader(tmp_path / "c.toml", good)
    assert reader.read(Alerts, tomllib.loads(good)["alerts"], "alerts") == Alerts(
        sinks=(Sink(kind="webhook", url="http://a"), Sink(kind="slack", url="http://b", timeout_s=2.0))
    )


@dataclass(frozen=True)
class Dwell:
    dwell_s: Mapping[str, float] = setting(
        default_factory=lambda: MappingProxyType({}), keys=("idle", "compute"), ge=0, le=60
    )


def test_a_table_of_named_values_reports_each_key_at_its_line(tmp_path: Path) -> None:
    """``Mapping[str, X]`` with ``keys``: an unknown key gets a did-you-mean, a bad value its bounds,
    each at ``field.key`` and its own line; from elsewhere, the origin instead of a line."""
    text = "[s.dwell_s]\nidle = 3\ncompte = 1\ncompute = 99\n"
    reader = Reader(tmp_path / "c.toml", text)
    assert reader.read(Dwell, tomllib.loads(text)["s"], "s") is None
    assert [str(p) for p in reader.problems] == [
        f"{tmp_path / 'c.toml'}:3: s.dwell_s.compte: unknown key (did you mean 'compute'?)",
        f"{tmp_path / 'c.toml'}:4: s.dwell_s.compute: expected a number between 0 and 60, got 99",
    ]
    ok = Reader(tmp_path / "c.toml").read(Dwell, {"dwell_s": {"idle": 2}}, "s")
    assert ok is not None and dict(ok.dwell_s) == {"idle": 2.0}
    env = Reader(tmp_path / "c.toml")
    assert env.read(Dwell, {"dwell_s": {"idle": -1}}, "s", origins={"dwell_s": "ENV_X"}) is None
    assert [str(p) for p in env.problems] == [
        "ENV_X: s.dwell_s.idle: expected a number between 0 and 60, got -1"
    ]
    assert describe(Mapping[str, float], Rule(ge=0, le=60)) == "a table of numbers between 0 and 60"
