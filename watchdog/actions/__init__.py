"""What the daemon does about a verdict: capture evidence, alert, and (when armed) kill. ``engine``'s
``ActionEngine`` is the facade the daemon calls each cycle, over ``ladder`` (pure: the rungs due),
``episode`` (per-job state), ``captures`` (the capture rung) and ``evidence_bundle`` (the bundle itself),
``alert_book`` (pages, resends, resolves, silences applied) and ``delivery`` (the durable outbox),
``kill_policy`` (the kill rungs' checks, budget and deterministic-hang breaker), ``kill_runner`` (what
the kill worker runs: signals, hook, scancel), ``kill_targets`` (who may be signalled, and the executor
that signals them), ``slurm_cancel``, ``silences``, ``worker`` (threads and typed results) and
``records``. Layer 4: it imports ``journal``, ``verdicts``, ``signals``, ``alerts``, ``model`` and the
layers below, never ``serving``, ``daemon`` or above. See ``docs/actions.md``."""

from __future__ import annotations

from gpu_triage.actions.engine import ActionEngine

__all__ = ["ActionEngine"]
