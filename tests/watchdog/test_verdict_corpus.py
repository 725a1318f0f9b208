"""Every case of the scenario corpus (tests/corpus/cases.py) meets its expectation.

Each case runs the real classifier, progress files written by the trainer's writer and read by the
daemon's reader, the real fusion, detector and action engine (kill mode, dry run, default delays) on
an explicit clock. A healthy case must never be called hung nor enter a SIGTERM plan (and may only
take the verdicts it lists); a hang must be kill-worthy within its bound (30 s of onset where its
evidence can prove it) or alerted within its bound where this node cannot prove it (the case says why).
"""

from __future__ import annotations

import pytest

from tests.corpus.cases import all_cases
from tests.corpus.harness import fmt_timeline, run_case

CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_meets_its_expectation(case) -> None:
    result = run_case(case)
    timeline = fmt_timeline(result.timeline, case.duration_s)
    assert result.problems() == [], f"{case.name}: {timeline}"


def test_the_corpus_covers_the_families_it_claims() -> None:
    healthy = [c for c in CASES if c.expect.truth == "healthy"]
    hangs = [c for c in CASES if c.expect.truth == "hang"]
    assert len(healthy) >= 20 and len(hangs) >= 15
    families = {c.family for c in healthy}
    assert {"save", "eval", "warm-up", "straggler", "suspend", "restart", "capped", "storage"} <= families
    kill_worthy = [c for c in hangs if c.expect.kill_worthy_within_s is not None]
    alert_only = [c for c in hangs if c.expect.kill_worthy_within_s is None]
    assert all(c.expect.limit for c in alert_only), "a hang expected alert-only must say why"
    assert len(kill_worthy) >= 12


def test_a_detector_that_kills_on_frozen_steps_alone_fails_the_corpus() -> None:
    """The corpus can fail: a detector that calls frozen steps a hang puts healthy jobs in a SIGTERM
    plan (an unannounced eval, a save on another node, a slow model's 75 s steps)."""
    from gpu_triage.verdicts import hang_rules

    original = hang_rules.hung

    def naive(now, job, f, cfg, timing, save_seen_at):
        found = original(now, job, f, cfg, timing, save_seen_at)
        if found is None and f.train and f.frozen_since is not None and f.frozen_s >= 60:
            return hang_rules.Hang(f.frozen_since, ("steps_frozen",))
        return found

    hang_rules.hung = naive
    try:
        by_name = {c.name: c for c in CASES}
        broken = [
            run_case(by_name[name])
            for name in ("eval-unannounced", "remote-save-600s-third-party", "slow-model-unlearned")
        ]
    finally:
        hang_rules.hung = original
    assert all(r.problems() for r in broken)
    assert any(r.killed_healthy for r in broken)
