"""``python -m benchmarks verdicts``: the trust scorecard of the scenario corpus.

Every case of ``tests/corpus/cases.py`` runs through the daemon's real decision path on an explicit
clock (classifier, progress files through the real writer and reader, fusion, detector, the action
engine in kill mode with dry run and the default delays). Printed per case: the truth, the verdict
timeline, the time from onset to a kill-worthy verdict and to the first alert, and every SIGTERM plan
the engine made. Then the totals: healthy jobs and bystanders in a SIGTERM plan (the number that must
be 0), kill-worthy precision and recall, and the hangs this node cannot prove, with why.

The live part runs the real process inspector on real processes: a forged progress file naming an
unrelated ``setsid sleep`` must not make it a kill target.
"""

from __future__ import annotations

import time

from tests.corpus.cases import all_cases
from tests.corpus.harness import Result, fmt_timeline, run_case


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0f}s"


def scorecard(results: list[Result]) -> list[str]:
    lines = []
    head = f"{'case':44} {'family':10} {'truth':7} {'kill-worthy':>11} {'alert':>7} {'SIGTERM plan':>13}  ok"
    lines.append(head)
    lines.append("-" * len(head))
    for r in results:
        c = r.case
        plan = ",".join(str(int(t)) for t, _, _ in r.sigterm_plans) or "-"
        ok = "yes" if not r.problems() else "NO"
        lines.append(
            f"{c.name:44} {c.family:10} {c.expect.truth:7} {_s(r.after_onset(r.first_kill_worthy_s)):>11} "
            f"{_s(r.after_onset(r.first_alert_s)):>7} {plan:>13}  {ok}"
        )
        lines.append(f"    {fmt_timeline(r.timeline, c.duration_s)}")
        for p in r.problems():
            lines.append(f"    !! {p}")
        if c.expect.limit:
            lines.append(f"    limit: {c.expect.limit}")
    healthy = [r for r in results if r.case.expect.truth == "healthy"]
    hangs = [r for r in results if r.case.expect.truth == "hang"]
    killed_healthy = sum(r.killed_healthy for r in healthy)
    hung_healthy = sum(r.kill_worthy_healthy for r in healthy)
    alerted_healthy = [r.case.name for r in healthy if r.first_alert_s is not None]
    bystanders = sum(bool({p for _, _, ps in r.sigterm_plans for p in ps} - r.job_pids) for r in results)
    kw = [r for r in hangs if r.first_kill_worthy_s is not None]
    kw_30 = [r for r in kw if (r.after_onset(r.first_kill_worthy_s) or 0.0) <= 30.0]
    provable = [r for r in hangs if r.case.expect.kill_worthy_within_s is not None]
    alerted = [r for r in hangs if r.first_alert_s is not None]
    precision = len(kw) / (len(kw) + hung_healthy) if kw or hung_healthy else 1.0
    lines += [
        "",
        f"healthy cases {len(healthy)}: in a SIGTERM plan {killed_healthy}, called hung {hung_healthy}, "
        f"alerted {len(alerted_healthy)} ({', '.join(alerted_healthy) or 'none'})",
        f"hang cases {len(hangs)}: kill-worthy {len(kw)} ({len(kw_30)} within 30 s of onset; "
        f"{len(provable)} provable from this node's evidence), alerted {len(alerted)}",
        f"kill-worthy precision {precision:.2f}, recall {len(kw) / max(1, len(hangs)):.2f} "
        f"(provable hangs: {len([r for r in provable if r in kw]) / max(1, len(provable)):.2f}); "
        f"alert recall {len(alerted) / max(1, len(hangs)):.2f}",
        f"bystanders in a SIGTERM plan: {bystanders}",
        f"cases meeting their expectation: {sum(not r.problems() for r in results)}/{len(results)}",
    ]
    return lines


def live_forged_file() -> list[str]:
    """The real inspector on real processes: a forged progress file naming a ``setsid sleep``."""
    try:
        from tests.corpus.live import forged_progress_file
    except ImportError as e:  # pragma: no cover - the live part needs psutil and a POSIX host
        return [f"live check skipped: {e}"]
    outcome = forged_progress_file()
    return [
        f"live: forged progress file naming an unrelated process -> targets {outcome.targets}, "
        f"bystander pid {outcome.bystander} {'NOT ' if outcome.bystander_targeted else ''}safe, "
        f"reported untrusted: {outcome.reported}"
    ]


def run(quick: bool = False) -> None:
    t0 = time.perf_counter()
    cases = all_cases()
    if quick:
        cases = cases[::4]
    results = [run_case(c) for c in cases]
    print(f"\n== verdicts: {len(results)} scripted cases through the real detector and action engine")
    for line in scorecard(results):
        print(line)
    for line in live_forged_file():
        print(line)
    print(f"  ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    run()
