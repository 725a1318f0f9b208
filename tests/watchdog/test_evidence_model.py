"""The job evidence's one JSON form (model/evidence.py) and the one JSON sanitiser (model/jsonable.py)."""

from __future__ import annotations

import enum
import json
import math

from gpu_triage.model.evidence import CannotJudge, Coverage, JobEvidence, evidence_dict
from gpu_triage.model.findings import Signal, context, hang, progress
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.states import GpuState

ALWAYS = [
    "gpus", "gpus_inferred", "gpu_states", "spin_band_since", "steps", "phases", "steps_frozen_since",
    "step_interval_s", "first_step", "bytes_written_recently", "bytes_read_recently", "live_leases",
    "expired_leases", "nvlink_frozen_since", "telemetry", "coverage", "signals", "kill_worthy", "findings",
    "against", "cannot_judge", "blame", "hardware",
]  # fmt: skip


class _Facts:
    def __init__(self, doc: dict[str, object]) -> None:
        self.doc = doc

    def to_dict(self) -> dict[str, object]:
        return self.doc


def test_keys_and_their_order_are_the_rest_contract() -> None:
    findings = (
        hang(Signal.STEPS_FROZEN, "frozen", 100.0, ranks=(0, 1)),
        progress(Signal.WRITES, "writes"),
        context(Signal.NO_WRITES, "none"),
    )
    ev = JobEvidence(
        gpus=(0, 1),
        gpu_states={0: GpuState.CHECKPOINT_OR_DEADLOCK, 1: GpuState.IDLE},
        step_by_rank={0: 12, 1: 12},
        phase_by_rank={0: "train"},
        step_interval_s=1.23456,
        live_lease_until_by_rank={1: 50.0},
        coverage=Coverage(visible_ranks=2, world_size=4, unseen_ranks=2),
        signals=("steps_frozen",),
        cannot_judge=(CannotJudge("stacks", "no fresh stack (none taken)"),),
        gpus_unknown=True,
        not_kill_worthy_because="why",
        untrusted_progress_files=({"path": "/p", "reason": "r"},),
        nccl_ras=_Facts({"status": "ok"}),
        stacks=_Facts({"sampler": "available", "t": (1, 2)}),
        stacks_where="rank 0: collective",
        fleet=_Facts({"state": "unknown", "nan": math.nan}),
    )
    doc = evidence_dict(ev, findings=findings, kill_worthy=False, cause="c")
    optional = ["gpus_unknown", "not_kill_worthy_because", "cause", "untrusted_progress_files", "nccl_ras"]
    assert list(doc) == [*ALWAYS, *optional, "stacks", "stacks_where", "fleet"]
    assert doc["gpu_states"] == {"0": "checkpoint_or_deadlock", "1": "idle"}
    assert doc["steps"] == {"0": 12, "1": 12}
    assert doc["step_interval_s"] == 1.235 and doc["live_leases"] == {"1": 50.0}
    assert doc["against"] == ["writes"] and doc["findings"][0]["ranks"] == [0, 1]
    assert doc["stacks"]["t"] == [1, 2] and doc["fleet"]["nan"] is None
    json.dumps(doc, allow_nan=False)
    # a kill-worthy status never says why it is not; unset optional keys are absent
    plain = evidence_dict(JobEvidence(not_kill_worthy_because="why"), kill_worthy=True)
    assert list(plain) == ALWAYS and plain["kill_worthy"] is True
    assert evidence_dict(JobEvidence(), detector_error="ValueError: x") == {"detector_error": "ValueError: x"}
    assert evidence_dict(None) == {}


class _Color(enum.Enum):
    RED = 1


def test_jsonable_makes_any_value_json_safe() -> None:
    value = {
        GpuState.IDLE: [math.inf, -math.nan, 1.5],
        "t": (1, {2}),
        "e": _Color.RED,
        "b": b"\xffok",
        3: object.__new__(object).__class__.__name__,
    }
    out = jsonable(value)
    assert out == {"idle": [None, None, 1.5], "t": [1, [2]], "e": 1, "b": "\ufffdok", "3": "object"}
    json.dumps(out, allow_nan=False)
