"""Flight-recorder dumps: parsed with a restricted unpickler (a crafted pickle cannot run code),
bounded, compared across ranks for the first collective sequence number where they disagree."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from gpu_triage.signals.flight_recorder import FlightRecorderError, compare, entries, load_dump


def _dump(ops: list[tuple[int, str]], pg: str = "0", state: str = "completed") -> bytes:
    doc = {
        "version": "2.4",
        "pg_config": {pg: {"name": pg, "desc": "default_pg", "ranks": "[0, 1, 2]"}},
        "entries": [
            {
                "record_id": i,
                "pg_id": int(pg),
                "process_group": (pg, "default_pg"),
                "collective_seq_id": seq,
                "p2p_seq_id": 0,
                "profiling_name": op,
                "time_created_ns": 1_700_000_000_000_000_000 + i,
                "state": state,
                "input_sizes": [[1024]],
                "is_p2p": False,
            }
            for i, (seq, op) in enumerate(ops)
        ],
    }
    return pickle.dumps(doc, protocol=4)


def test_the_rank_that_never_launched_the_collective_is_named():
    base = [(s, "nccl:all_reduce") for s in range(1195, 1202)]
    dumps = {0: base, 1: base, 2: base[:-1]}  # rank 2 never launched seq 1201
    out = compare({r: entries(load_dump(_dump(ops))) for r, ops in dumps.items()}, world=[0, 1, 2, 3])
    (d,) = out["disagreements"]
    assert d["first_disagreeing_seq"] == 1201 and d["ranks_behind"] == [2]
    assert d["ops"] == {"0": "nccl:all_reduce", "1": "nccl:all_reduce"}
    assert out["ranks_without_dump"] == [3]


def test_a_mismatched_collective_under_one_sequence_number_is_found():
    a = [(10, "nccl:all_reduce"), (11, "nccl:all_gather")]
    b = [(10, "nccl:all_reduce"), (11, "nccl:reduce_scatter")]
    out = compare({0: entries(load_dump(_dump(a))), 1: entries(load_dump(_dump(b)))})
    (d,) = out["disagreements"]
    assert d["first_disagreeing_seq"] == 11 and d["ranks_behind"] == []
    assert d["ops"] == {"0": "nccl:all_gather", "1": "nccl:reduce_scatter"}


def test_agreeing_ranks_and_the_json_form():
    ops = [(s, "nccl:all_reduce") for s in range(5)]
    js = json.dumps(pickle.loads(_dump(ops)), default=list).encode()
    out = compare({0: entries(load_dump(_dump(ops))), 1: entries(load_dump(js))})
    assert out["disagreements"] == []


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/flight-recorder-pwned",))


def test_a_crafted_pickle_cannot_run_code(tmp_path: Path):
    marker = Path("/tmp/flight-recorder-pwned")
    marker.unlink(missing_ok=True)
    with pytest.raises(FlightRecorderError, match="refused"):
        load_dump(pickle.dumps({"entries": [_Evil()]}))
    assert not marker.exists()


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x80\x04garbage", "not a flight-recorder dump"),
        (pickle.dumps([1, 2]), "expected a dict"),
        (b"{", "not a"),
    ],
)
def test_bad_dumps_are_refused_with_a_reason(data: bytes, message: str):
    with pytest.raises(FlightRecorderError, match=message):
        load_dump(data)


def test_an_oversized_dump_is_refused(monkeypatch: pytest.MonkeyPatch):
    import gpu_triage.signals.flight_recorder as fr

    monkeypatch.setattr(fr, "MAX_DUMP_BYTES", 100)
    with pytest.raises(FlightRecorderError, match="more than"):
        load_dump(b"x" * 101)
