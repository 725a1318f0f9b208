"""The one interface every pluggable signal implements, and the decorator that registers it by name.

A signal is something the node shows about its jobs beyond the per-cycle must-haves (progress files
and rank processes, which the daemon reads itself): Python stacks, NCCL's RAS service, the other nodes'
facts from Prometheus, node health. The daemon knows none of them by name. For each registered
:class:`SignalKind` it builds the signal once from its config section, and then, every process
period, in dependency order:

- :meth:`Signal.contribute` - sample within the cycle's deadline (slow work runs off the cycle
  thread; the call only starts it and hands back what is ready) and contribute facts to each job,
  as ``{job: {JobView field: value}}``;
- :meth:`Signal.status` - what ``GET /status`` shows of it, at :attr:`SignalKind.status_path`;
- :meth:`Signal.reload` - a changed section after SIGHUP (the same signal, or a fresh one);
- :meth:`Signal.close` - at shutdown.

Two optional methods, for a signal about the node rather than its jobs (the ``health`` signal):

- ``start()`` - called once by the daemon's start, to open what a constructed-only daemon (a test
  driving cycles) must not hold open (``/dev/kmsg``, a ``journalctl`` child);
- ``node_facts(now)`` - called every cycle, jobs or none, within the cycle's deadline: facts about
  the node as ``{Snapshot field: value}``, only the fields in :data:`NODE_FIELDS`.

A new signal is one module that defines a class with these methods, decorated with
:func:`register`, and one import line in :mod:`gpu_triage.signals.registry` (docs/architecture.md,
"Where a new signal goes"). This module imports nothing of ours but the pure model, so any signal
may use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from gpu_triage.model.health import HealthReader

Contribution = Mapping[str, object]
"""What a signal adds to one job: JobView field name -> value (``{"stacks": StackSummary(...)}``)."""


#: The snapshot fields a signal's ``node_facts`` may set (gpu_triage.model.snapshot.Snapshot).
NODE_FIELDS = frozenset({"node_health"})


@dataclass(frozen=True, slots=True)
class SignalEnv:
    """What a signal may know of the daemon besides its own section: the node and the timeline, the
    node's GPUs and the hardware reads its telemetry source offers."""

    node: str = "localhost"
    clock: Callable[[], float] = time.time
    gpus: tuple[tuple[int, str | None], ...] = ()
    """The node's GPUs from the telemetry source: (index, PCI bus id, None where unknown)."""
    hardware: HealthReader | None = None
    """NVML health reads and events (``telemetry/nvml_health``) when the source is NVML; None for the
    sim, replay and none sources."""


@dataclass(frozen=True, slots=True)
class JobSight:
    """What a signal is told about one job this cycle (built by the daemon from the fused JobView)."""

    job: str
    pids: Mapping[int, int]
    """rank -> pid of the ranks on this node proven to belong to the job and alive."""
    ranks_here: int
    """Distinct ranks of the job seen on this node."""
    world_size: int | None
    """From the progress files (or the ranks' environment); None when unknown."""
    process_world_size: int | None
    """``world_size`` or, when unknown, the one world size the ranks' processes agree on."""
    has_progress: bool
    suspect: bool
    """The job's last verdict asks for a closer look (not healthy, checkpoint or ended)."""
    gpus: frozenset[int] = frozenset()
    """The GPUs (indices) its ranks on this node drive."""
    facts: Contribution = field(default_factory=dict)
    """What the signals before this one contributed this cycle (a signal names what it reads in
    :attr:`SignalKind.reads`, so those run first)."""


class Signal(Protocol):
    """One source of facts about the node's jobs, built from its config section (see module doc)."""

    def contribute(self, now: float, jobs: Sequence[JobSight]) -> Mapping[str, Contribution]:
        """Start what is due (never block the cycle) and return each job's facts ready now."""
        ...

    def status(self) -> Mapping[str, Any]:
        """Counters and state for ``GET /status`` (JSON values)."""
        ...

    def reload(self, settings: Any, env: SignalEnv) -> Signal:
        """The section changed on SIGHUP: this signal, adjusted, or a fresh one (this one closed)."""
        ...

    def close(self) -> None: ...


S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class SignalKind:
    """A registered signal: how the daemon builds it and where its facts and status go."""

    name: str
    section: str
    """The ``Config`` section (attribute) it is built from, e.g. ``stacks`` for ``[stacks]``."""
    build: Callable[[Any, SignalEnv], Signal]
    status_path: tuple[str, ...]
    """Where its status sits in the snapshot (``("stacks", "nccl_ras")``: inside the stacks status);
    by default ``(name,)``: in ``Snapshot.signals`` (``GET /status`` ``signals``) under its name."""
    reads: tuple[str, ...] = ()
    """Names of the signals whose facts it reads (JobSight.facts); they contribute first."""


_KINDS: dict[str, SignalKind] = {}


def register(
    name: str,
    *,
    section: str,
    status_path: tuple[str, ...] | None = None,
    reads: tuple[str, ...] = (),
) -> Callable[[S], S]:
    """Class decorator: register a signal class (called as ``cls(settings, env)``) under ``name``."""

    def decorate(cls: S) -> S:
        if name in _KINDS:
            raise ValueError(f"a signal named {name!r} is already registered")
        build: Callable[[Any, SignalEnv], Signal] = cls  # type: ignore[assignment]
        _KINDS[name] = SignalKind(name, section, build, status_path or (name,), tuple(reads))
        return cls

    return decorate


def unregister(name: str) -> None:
    """Tests: take a registered signal away again."""
    _KINDS.pop(name, None)


def registered() -> tuple[SignalKind, ...]:
    """Every registered kind, each after the kinds it reads (then in registration order)."""
    ordered: list[SignalKind] = []
    placed: set[str] = set()
    pending = list(_KINDS.values())
    while pending:
        ready = [k for k in pending if all(r in placed or r not in _KINDS for r in k.reads)]
        if not ready:
            raise ValueError(f"signals read each other in a circle: {[k.name for k in pending]}")
        for k in ready:
            ordered.append(k)
            placed.add(k.name)
            pending.remove(k)
    return tuple(ordered)


__all__ = [
    "NODE_FIELDS",
    "Contribution",
    "JobSight",
    "Signal",
    "SignalEnv",
    "SignalKind",
    "register",
    "registered",
    "unregister",
]
