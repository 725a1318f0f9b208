"""The registered signals: importing a signal's module registers it
(:func:`gpu_triage.signals.signal.register`).

The daemon builds, runs, reports, reloads and closes whatever :func:`signal_kinds` returns, in the
order their ``reads`` require. A new signal: one module with a ``@register``-ed class, and one line
here.
"""

from __future__ import annotations

from gpu_triage.signals.fleet import signal as _fleet  # noqa: F401
from gpu_triage.signals.health import signal as _health  # noqa: F401
from gpu_triage.signals.nccl_ras import signal as _nccl_ras  # noqa: F401
from gpu_triage.signals.signal import SignalKind, registered
from gpu_triage.signals.stacks import signal as _stacks  # noqa: F401


def signal_kinds() -> tuple[SignalKind, ...]:
    """Every registered signal, each after those whose facts it reads."""
    return registered()


__all__ = ["signal_kinds"]
