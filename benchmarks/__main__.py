"""``make bench``: every benchmark, each printing its numbers beside a baseline and its budget.

    python -m benchmarks            # all
    python -m benchmarks --quick    # small inputs, a smoke run
    python -m benchmarks triage gate  # a selection
    python -m benchmarks verdicts     # the trust scorecard of the scenario corpus (~30 s)
    python -m benchmarks triage_truth # triage's precision/recall over every recording in the test data

Benchmarks measure and print; they never fail the build (machines here are shared and noisy).
"""

from __future__ import annotations

import importlib
import sys
import time

BENCHES = {
    "reader": "benchmarks.bench_reader",
    "triage": "benchmarks.bench_triage",
    "triage_truth": "benchmarks.bench_triage_truth",
    "daemon": "benchmarks.bench_daemon",
    "api": "benchmarks.bench_api",
    "health": "benchmarks.bench_health",
    "gate": "benchmarks.bench_gate",
    "trainer": "benchmarks.bench_trainer",
    "verdicts": "benchmarks.bench_verdicts",
    "stacks": "benchmarks.bench_stacks",
    "integrations": "benchmarks.bench_integrations",
    "fleet": "benchmarks.bench_fleet",
    "hostile": "benchmarks.bench_hostile",
    "node_health": "benchmarks.bench_node_health",
}


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    chosen = [a for a in argv if not a.startswith("-")] or list(BENCHES)
    unknown = [c for c in chosen if c not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}", file=sys.stderr)
        return 2
    for name in chosen:
        try:
            module = importlib.import_module(BENCHES[name])
        except ImportError as e:
            print(f"\n== {name}: skipped ({e})")
            continue
        t0 = time.perf_counter()
        module.run(quick=quick)
        print(f"  [{name}: {time.perf_counter() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
