"""``python -m benchmarks triage_truth``: how often offline triage is right, over every recording in
the test data.

The recordings are those of ``tests/watchdog/triage_corpus.py``: the generated wait shapes (a job
that checkpoints every step, long remote saves, real hangs spliced after them, two jobs of which one
hangs, a hang at the band's edge, a first slow save with its writer) and every real trace in
``../shared/traces`` (all healthy; the H100 ones with labelled checkpoint waits).

Printed per recording: its truth, triage's suspected deadlocks (GPUs, onset, when the wait departed
from the recording's own cadence, when the rule fired) and whether they match. A verdict matches a
hang when it names exactly the hung GPUs and its onset is within ``ONSET_TOLERANCE_S`` of the truth.
Then the totals: precision and recall of suspected deadlocks, healthy recordings with a verdict, the
delay from onset to the rule firing, and how many labelled checkpoint waits triage names
``checkpoint`` (needs the wait report; an older triage without it prints ``-``).

It measures and prints; it never fails the build.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import header
from gpu_triage.triage.engine import TriageOptions, triage_file
from tests.conftest import TRACES
from tests.watchdog.triage_corpus import Case, generated_cases, real_cases

ONSET_TOLERANCE_S = 5.0


def _matches(verdict: dict[str, Any], gpus: tuple[int, ...], onset_s: float) -> bool:
    return tuple(verdict["gpus"]) == gpus and abs(verdict["onset_s"] - onset_s) <= ONSET_TOLERANCE_S


def _named_checkpoints(result: Any, waits: tuple[tuple[float, float], ...]) -> int | None:
    found = getattr(result, "waits", None)
    if found is None:
        return None
    return sum(
        any(
            str(w.kind) == "checkpoint" and abs(w.start_s - a) < 2.0 and abs(w.end_s - b) < 2.0 for w in found
        )
        for a, b in waits
    )


def _fmt_verdict(v: dict[str, Any]) -> str:
    departed = v.get("departed_from_cadence_s")
    dep = "-" if departed is None else f"{departed:.0f}"
    return f"{v['gpus'][0]}-{v['gpus'][-1]}@{v['onset_s']:.0f}s (cadence {dep}, fired {v['detected_s']:.0f})"


def run(quick: bool = False) -> None:
    cases: list[Case] = generated_cases()
    if TRACES.is_dir():
        cases += real_cases(TRACES)
    header(f"triage truth: {len(cases)} recordings (generated shapes + every real trace in {TRACES})")
    tp = fp = fn = 0
    healthy = healthy_flagged = 0
    delays: list[float] = []
    labelled = named = 0
    named_known = True
    print(f"  {'recording':34} {'truth':16} {'suspected deadlocks':44} ok")
    with tempfile.TemporaryDirectory(prefix="triage-truth-") as tmp:
        for case in cases:
            t0 = time.perf_counter()
            try:
                result = triage_file(case.build(Path(tmp)), TriageOptions(**case.options))  # type: ignore[arg-type]
            except Exception as e:  # a bench reports, it does not stop
                print(f"  {case.name:34} error: {e}")
                continue
            took = time.perf_counter() - t0
            verdicts = list(result.verdicts)
            unmatched = list(verdicts)
            ok = True
            for hang in case.hangs:
                hit = next((v for v in unmatched if _matches(v, hang.gpus, hang.onset_s)), None)
                if hit is None:
                    fn += 1
                    ok = False
                else:
                    tp += 1
                    unmatched.remove(hit)
                    delays.append(hit["detected_s"] - hit["onset_s"])
            fp += len(unmatched)
            ok = ok and not unmatched
            if not case.hangs:
                healthy += 1
                healthy_flagged += bool(verdicts)
            if case.checkpoint_waits:
                got = _named_checkpoints(result, case.checkpoint_waits)
                labelled += len(case.checkpoint_waits)
                if got is None:
                    named_known = False
                else:
                    named += got
            truth = ", ".join(f"{h.gpus[0]}-{h.gpus[-1]}@{h.onset_s:.0f}s" for h in case.hangs) or "healthy"
            found = "; ".join(_fmt_verdict(v) for v in verdicts) or "none"
            print(
                f"  {case.name:34} {truth:16} {found:44} {'yes' if ok else 'NO'}  ({took:.1f} s)", flush=True
            )
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    print()
    print(
        f"  suspected deadlocks: precision {precision:.2f} ({tp} of {tp + fp}), "
        f"recall {recall:.2f} ({tp} of {tp + fn})"
    )
    print(f"  healthy recordings with a suspected deadlock: {healthy_flagged} of {healthy}")
    if delays:
        print(
            f"  onset to rule firing: {min(delays):.0f}-{max(delays):.0f} s "
            "(the fixed rule or the cadence, the later)"
        )
    named_text = f"{named} of {labelled}" if named_known else f"- of {labelled} (no wait report)"
    print(f"  labelled real checkpoint waits named 'checkpoint': {named_text}", flush=True)


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
