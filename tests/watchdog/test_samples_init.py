"""GpuSample's quick ``__init__`` (model/samples.quick_init, issue 30) against the one dataclasses
writes: the same parameters, order, defaults and refusals; the instance still frozen."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.model.samples import GpuSample, quick_init

FIELDS = dataclasses.fields(GpuSample)
Reference = dataclasses.make_dataclass(
    "Reference",
    [(f.name, f.type, dataclasses.field(default=f.default)) for f in FIELDS],
    frozen=True,
    slots=True,
)
VALUES = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.just(()))


def values(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in FIELDS)


@settings(max_examples=300, deadline=None)
@given(
    positional=st.lists(VALUES, min_size=2, max_size=len(FIELDS)),
    keywords=st.dictionaries(st.sampled_from([f.name for f in FIELDS]), VALUES, max_size=6),
)
def test_the_quick_init_takes_what_the_generated_one_takes(
    positional: list[Any], keywords: dict[str, Any]
) -> None:
    keywords = {k: v for k, v in keywords.items() if k not in [f.name for f in FIELDS[: len(positional)]]}
    assert values(GpuSample(*positional, **keywords)) == values(Reference(*positional, **keywords))


def test_the_quick_init_refuses_what_the_generated_one_refuses() -> None:
    for args, kwargs in [((1,), {}), ((), {"time_s": 1.0}), ((1, 2.0), {"gpu": 3}), ((1, 2.0), {"nope": 1})]:
        for cls in (GpuSample, Reference):
            with pytest.raises(TypeError):
                cls(*args, **kwargs)
    with pytest.raises(TypeError):
        GpuSample(*range(len(FIELDS) + 1))
    sample = GpuSample(gpu=1, time_s=2.0)
    assert sample.pids == () and sample.errors == () and sample.error is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.gpu = 2  # type: ignore[misc]
    assert sample == GpuSample(1, 2.0) and hash(sample) == hash(GpuSample(1, 2.0))


def test_quick_init_takes_plain_fields_only() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class WithFactory:
        items: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithPostInit:
        x: int

        def __post_init__(self) -> None: ...

    for cls in (WithFactory, WithPostInit):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)
