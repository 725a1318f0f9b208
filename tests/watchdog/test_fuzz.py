"""Fuzzing the hostile inputs (issue 11): 1,000 seeded mutations per format - nvidia-smi CSV
recordings (through ``gpu-watchdog triage``), config files (``load_config``), progress files
(``parse_record`` and the reader) and directory and file names as bytes (issue 18: the reader, the
log lines, the environment job keys, the event store) - each run in a subprocess under a 1 GiB
address-space limit (``RLIMIT_AS``), with a per-input alarm (a hang) and a bound on the peak RSS the
run measured.

Every input must end in a clean error naming the file (exit 2 for triage) or a sane result: 0
tracebacks, 0 hangs. The mutator and its seeds are in ``fuzz_inputs.py``; a failure prints the
offending input's head and traceback, and ``python -m tests.watchdog.fuzz_inputs FORMAT N SEED``
replays it.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from tests.conftest import REPO

INPUTS_PER_FORMAT = 1000
ADDRESS_SPACE_BYTES = 1 << 30
"""RLIMIT_AS of the fuzzing process: an input that makes a reader allocate without bound fails
with MemoryError (counted as a traceback) instead of exhausting the machine."""
PEAK_RSS_MB = {
    "csv": 256,
    "config": 96,
    "progress": 96,
    "prometheus": 96,
    "names": 128,
    "kmsg": 96,
    "scheduler": 96,
}
"""Peak resident memory a whole run may reach (measured: csv ~150 MB with numpy and pyarrow loaded,
config and progress ~25 MB)."""


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


@pytest.mark.parametrize("fmt", ["csv", "config", "progress", "prometheus", "names", "kmsg", "scheduler"])
def test_fuzzed_inputs_end_in_clean_errors_or_sane_results(fmt: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tests.watchdog.fuzz_inputs", fmt, str(INPUTS_PER_FORMAT), "20261203"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_limit,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}))
    assert summary["inputs"] == INPUTS_PER_FORMAT
    assert summary["tracebacks"] == 0 and summary["hangs"] == 0, json.dumps(summary["failures"], indent=1)
    assert summary["outcomes"].get("error", 0) > 0 and summary["outcomes"].get("result", 0) > 0
    assert summary["peak_rss_mb"] < PEAK_RSS_MB[fmt]
