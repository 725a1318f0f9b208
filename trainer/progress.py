"""The trainer's side of the progress contract: each rank tells the watchdog what it is doing.

The contract (fields, phases, layout) and its writer live in one module, ``gpu_triage.contract``
(``watchdog/contract.py``, standard library only, part of the base install); the daemon's reader uses
the same module. This module re-exports the writer under its old name so ``ft_trainer.progress``
keeps working. See ``docs/integrations.md`` for the framework integrations built on it.
"""

from __future__ import annotations

from gpu_triage.contract import (
    DEFAULT_DIR,
    ENV_DIR,
    ENV_JOB,
    FIELDS,
    LEASE_SCOPES,
    MIN_INTERVAL_S,
    OPTIONAL_FIELDS,
    PHASES,
    Flusher,
    LeaseEstimator,
    LeasePolicy,
    ProgressWriter,
    check_job_name,
    progress_dir,
    rank_file,
)

__all__ = [
    "DEFAULT_DIR",
    "ENV_DIR",
    "ENV_JOB",
    "FIELDS",
    "LEASE_SCOPES",
    "MIN_INTERVAL_S",
    "OPTIONAL_FIELDS",
    "PHASES",
    "Flusher",
    "LeaseEstimator",
    "LeasePolicy",
    "ProgressWriter",
    "check_job_name",
    "progress_dir",
    "rank_file",
]
