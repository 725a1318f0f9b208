"""What the daemon does about a verdict: capture evidence, alert, and (when armed) kill.

Modules, each small and named for what it holds:

- :mod:`watchdog.actions.alerts` - the alert model, dedup keys and one payload builder per sink (pure);
- :mod:`watchdog.actions.delivery` - the durable outbox worker: HTTP POST per sink with timeouts,
  exponential backoff with jitter, surviving restarts through the event store's ``outbox`` table;
- :mod:`watchdog.actions.evidence` - the evidence bundle (py-spy, nvidia-smi, NCCL RAS, flight
  recorder, process tree, progress files, ``index.json``);
- :mod:`watchdog.actions.ras` - a client of NCCL's RAS socket (text and JSON forms);
- :mod:`watchdog.actions.kill` - which processes a kill may touch (pure) and the executor that signals
  them or runs the kill hook;
- :mod:`watchdog.actions.engine` - the ladder: what to do this cycle (:class:`ActionEngine`).

See ``docs/actions.md``.
"""

from __future__ import annotations

from watchdog.actions.engine import ActionEngine

__all__ = ["ActionEngine"]
