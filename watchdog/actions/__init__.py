"""What the daemon does about a verdict: capture evidence, alert, and (when armed) kill.

Modules, each small and named for what it holds:

- :mod:`gpu_triage.alerts.model` - the alert model, dedup keys and one payload builder per sink (pure);
- :mod:`gpu_triage.actions.delivery` - the durable outbox worker: HTTP POST per sink with timeouts,
  exponential backoff with jitter, surviving restarts through the event store's ``outbox`` table;
- :mod:`gpu_triage.actions.evidence` - the evidence bundle (py-spy, nvidia-smi, NCCL RAS, flight
  recorder, process tree, progress files, ``index.json``);
- :mod:`gpu_triage.signals.nccl_ras.client` - a client of NCCL's RAS socket (text and JSON forms);
- :mod:`gpu_triage.actions.kill` - which processes a kill may touch (pure) and the executor that signals
  them or runs the kill hook;
- :mod:`gpu_triage.actions.engine` - the facade the daemon calls each cycle (:class:`ActionEngine`),
  composing:
- :mod:`gpu_triage.actions.ladder` - pure: the rungs due for an episode, as typed steps with delays;
- :mod:`gpu_triage.actions.episode` - per-job state (episode, kill, hang signatures);
- :mod:`gpu_triage.actions.captures` - the capture rung and its rate limit;
- :mod:`gpu_triage.actions.alert_book` - firing alerts: pages, escalations, resends, resolves, silences;
- :mod:`gpu_triage.actions.kills` and :mod:`gpu_triage.actions.kill_runs` - the kill rungs: checks,
  budget and deterministic-hang breaker on the loop thread; signals, hook and scancel on the worker;
- :mod:`gpu_triage.actions.worker` and :mod:`gpu_triage.actions.records` - worker threads with typed
  results; a cycle's records and the kv keys.

Actions, results and stages are the enums of :mod:`gpu_triage.model.actions`.

See ``docs/actions.md``.
"""

from __future__ import annotations

from gpu_triage.actions.engine import ActionEngine

__all__ = ["ActionEngine"]
