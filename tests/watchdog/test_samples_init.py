"""The quick ``__init__`` (model/samples.quick_init, issue 30) of the values the daemon builds 16 at a
time - GpuSample, GpuStatus, RankProcess, and once a rank (or GPU) every process period RankProgress,
ProgressClaim, RankView, GpuView, RankStatus, RankFacts, Candidate at discoveries - against the one
dataclasses writes: the same parameters, order, defaults and refusals; the instances still frozen."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.model.samples import GpuSample, quick_init
from gpu_triage.model.snapshot import GpuStatus, RankStatus
from gpu_triage.signals.fleet.facts import RankFacts
from gpu_triage.signals.progress_model import RankProgress
from gpu_triage.signals.ranks import Candidate, ProgressClaim, RankProcess
from gpu_triage.verdicts.views import GpuView, RankView

QUICK = (
    GpuSample,
    GpuStatus,
    RankProcess,
    RankProgress,
    ProgressClaim,
    RankView,
    GpuView,
    RankStatus,
    RankFacts,
    Candidate,
)


def reference(cls: type) -> type:
    """``cls`` as dataclasses makes it, with its generated ``__init__``."""
    fields = [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(f"Reference{cls.__name__}", fields, frozen=True, slots=True)


REFERENCES = {cls: reference(cls) for cls in QUICK}
VALUES = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.just(()))


def values(cls: type, obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(cls))


@settings(max_examples=300, deadline=None)
@given(cls=st.sampled_from(QUICK), data=st.data())
def test_the_quick_init_takes_what_the_generated_one_takes(cls: type, data: st.DataObject) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    required = sum(f.default is dataclasses.MISSING for f in dataclasses.fields(cls))
    positional = data.draw(st.lists(VALUES, min_size=required, max_size=len(names)))
    keywords = data.draw(
        st.dictionaries(st.sampled_from(names[len(positional) :] or ["_"]), VALUES, max_size=6)
    )
    keywords.pop("_", None)
    assert values(cls, cls(*positional, **keywords)) == values(cls, REFERENCES[cls](*positional, **keywords))


@pytest.mark.parametrize("cls", QUICK)
def test_the_quick_init_refuses_what_the_generated_one_refuses(cls: type) -> None:
    n = len(dataclasses.fields(cls))
    required = sum(f.default is dataclasses.MISSING for f in dataclasses.fields(cls))
    too_few = [(tuple(range(k)), {}) for k in range(required)]
    for args, kwargs in [*too_few, ((*range(n),), {"nope": 1}), ((*range(n + 1),), {})]:
        for made in (cls, REFERENCES[cls]):
            with pytest.raises(TypeError):
                made(*args, **kwargs)
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(TypeError):
        cls(*range(n), **{first: 0})  # given twice
    one = cls(*range(n))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(one, first, 5)
    assert one == cls(*range(n)) and hash(one) == hash(cls(*range(n)))


def test_gpu_samples_defaults() -> None:
    sample = GpuSample(gpu=1, time_s=2.0)
    assert sample.pids == () and sample.errors == () and sample.error is None and sample.power_w is None


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


@pytest.mark.parametrize("cls", QUICK)
def test_the_values_built_every_period_have_the_quick_init(cls: type) -> None:
    # the generated __init__ looks object.__setattr__ up for every field; quick_init's sets each
    # slot through its bound setter (_set0, _set1...): the per-rank values must keep the quick one
    assert "_set0" in cls.__init__.__code__.co_names, f"{cls.__name__} lost its quick __init__"
