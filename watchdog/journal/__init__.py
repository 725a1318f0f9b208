"""What the daemon remembers and says: the event store (``eventstore``: SQLite, every state change,
verdict and action, and the outbox and key-value tables), its key-value mirror (``kv_mirror``), the
event log lines (``logs``), the timeline a job's events read as (``timeline``) and its ``[events]``
section (``config``). Layer 3: it imports ``model``, ``config`` and the layers below, never ``verdicts``,
``triage``, ``actions`` or anything above."""
