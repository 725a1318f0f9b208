"""Mutations of the daemon from outside its loop: mode changes and silences.

REST handlers run on uvicorn's thread; the loop owns all state. :class:`QueuedControl` bridges the two
without a shared lock on the hot path: ``arm``/``disarm`` enqueue a :class:`ModeCommand` that the loop
applies at its next cycle (:meth:`QueuedControl.drain`), and silences live in a thread-safe, pure
:class:`SilenceBook` (time passed in). The Protocols here are what ``gpu_triage.serving.api`` needs from the
daemon, so the API can be tested against any implementation.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_triage.model.states import Mode, Verdict

#: The longest silence accepted (30 days) and the longest comment.
MAX_SILENCE_S = 30 * 24 * 3600.0
MAX_COMMENT_CHARS = 1024
MAX_SILENCES = 1000
#: Labels a silence may match on, exactly.
SILENCE_LABELS = ("job", "verdict", "node")

# --------------------------------------------------------------------------------------------------
# What the app needs from the rest of the daemon


class SupportsToDict(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


class EventsReader(Protocol):
    """The event store, read side: events with ``id > after_id``, oldest first, at most ``limit``.
    Each event is a JSON-able dict with an integer ``id``, or an object with ``to_dict()`` giving one
    (``gpu_triage.journal.eventstore.Event``). Called from an HTTP worker thread; may raise RuntimeError (the
    store's StoreError) when the file cannot be read, answered 503."""

    def since(self, after_id: int, limit: int) -> Sequence[Mapping[str, Any]] | Sequence[SupportsToDict]: ...


class Control(Protocol):
    """Mutations requested over HTTP. Implementations must be cheap and thread-safe: they are called
    from HTTP threads while the loop runs, and must never wait for a cycle (enqueue instead).
    ``arm`` may raise :class:`ControlRefused` (e.g. the config forbids kill mode): answered 409."""

    def arm(self, mode: Mode) -> None: ...

    def disarm(self) -> None: ...

    def add_silence(
        self, matchers: dict[str, str], duration_s: float, comment: str, now: float
    ) -> dict[str, Any]: ...

    def list_silences(self, now: float) -> list[dict[str, Any]]: ...

    def delete_silence(self, silence_id: str) -> bool: ...


class ControlRefused(Exception):
    """A mutation the daemon will not apply; the message is shown to the caller (409)."""


# --------------------------------------------------------------------------------------------------
# Silences and the command queue: what the loop can use as its Control


@dataclass(frozen=True, slots=True)
class Silence:
    id: str
    matchers: Mapping[str, str]
    comment: str
    starts_at: float
    ends_at: float

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.matchers.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "matchers": dict(self.matchers),
            "comment": self.comment,
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
        }


class SilenceBook:
    """In-memory silences (pure: time is passed in; thread-safe: HTTP threads add, the loop asks).

    A silence matches an alert whose labels equal every matcher exactly; matchers may name ``job``,
    ``verdict`` and ``node``. Expired silences are dropped when the book is read. Silences do not
    survive a restart (the event store records their creation through the loop, if it wishes).
    """

    def __init__(self, *, max_silences: int = MAX_SILENCES, new_id: Callable[[], str] | None = None) -> None:
        self._lock = threading.Lock()
        self._silences: dict[str, Silence] = {}
        self._max_silences = max_silences
        self._new_id = new_id or (lambda: str(uuid.uuid4()))
        self._version = 0

    @staticmethod
    def validate(matchers: Mapping[str, str], duration_s: float, comment: str) -> None:
        """Raise ValueError naming the problem."""
        if not matchers:
            raise ValueError("matchers: at least one of job, verdict, node is needed")
        for key, value in matchers.items():
            if key not in SILENCE_LABELS:
                raise ValueError(
                    f"matchers: unknown label {key!r} (expected one of {', '.join(SILENCE_LABELS)})"
                )
            if not isinstance(value, str) or not value:
                raise ValueError(f"matchers.{key}: expected a non-empty string")
        verdict = matchers.get("verdict")
        if verdict is not None and verdict not in {v.value for v in Verdict}:
            raise ValueError(f"matchers.verdict: unknown verdict {verdict!r}")
        if not (math.isfinite(duration_s) and 0 < duration_s <= MAX_SILENCE_S):
            raise ValueError(f"duration_s: expected 0 < duration_s <= {MAX_SILENCE_S:.0f}, got {duration_s}")
        if len(comment) > MAX_COMMENT_CHARS:
            raise ValueError(f"comment: at most {MAX_COMMENT_CHARS} characters")

    def add(self, matchers: Mapping[str, str], duration_s: float, comment: str, now: float) -> Silence:
        self.validate(matchers, duration_s, comment)
        with self._lock:
            self._prune(now)
            if len(self._silences) >= self._max_silences:
                raise ValueError(f"too many active silences (at most {self._max_silences})")
            silence = Silence(self._new_id(), dict(matchers), comment, now, now + duration_s)
            self._silences[silence.id] = silence
            self._version += 1
            return silence

    def active(self, now: float) -> list[Silence]:
        """Active silences, soonest to end first."""
        with self._lock:
            self._prune(now)
            return sorted(self._silences.values(), key=lambda s: (s.ends_at, s.id))

    def delete(self, silence_id: str) -> bool:
        with self._lock:
            gone = self._silences.pop(silence_id, None) is not None
            self._version += gone
            return gone

    @property
    def version(self) -> int:
        """Grows with every add and delete: the loop persists the book when it changed."""
        return self._version

    def export(self) -> list[dict[str, Any]]:
        """Every silence (expired ones included until pruned), for persistence."""
        with self._lock:
            return [s.to_dict() for s in self._silences.values()]

    def restore(self, items: Sequence[Mapping[str, Any]], now: float) -> int:
        """Load persisted silences (a daemon restart keeps them); expired or malformed ones are skipped.
        Returns how many were restored."""
        restored = 0
        with self._lock:
            for item in items:
                try:
                    silence = Silence(
                        str(item["id"]),
                        {str(k): str(v) for k, v in dict(item["matchers"]).items()},
                        str(item.get("comment", "")),
                        float(item["starts_at"]),
                        float(item["ends_at"]),
                    )
                except (KeyError, TypeError, ValueError):
                    continue
                if silence.ends_at > now and len(self._silences) < self._max_silences:
                    self._silences[silence.id] = silence
                    restored += 1
        return restored

    def silenced_by(self, labels: Mapping[str, str], now: float) -> Silence | None:
        """The first active silence matching ``labels`` (e.g. ``{"node", "job", "verdict"}``), or None."""
        for silence in self.active(now):
            if silence.active(now) and silence.matches(labels):
                return silence
        return None

    def _prune(self, now: float) -> None:
        for silence_id in [s.id for s in self._silences.values() if s.ends_at <= now]:
            del self._silences[silence_id]


@dataclass(frozen=True, slots=True)
class ModeCommand:
    """A requested mode change for the loop: ``observe`` (disarm), ``alert`` or ``kill`` (arm)."""

    mode: Mode
    armed: bool


class QueuedControl:
    """A :class:`Control` for the loop: arm/disarm are queued (the loop calls :meth:`drain` each cycle
    and applies the commands in order, the last one winning); silences live in a :class:`SilenceBook`.
    ``allowed_modes`` lets the config forbid e.g. ``kill`` (then ``arm(kill)`` answers 409)."""

    def __init__(
        self, silences: SilenceBook | None = None, *, allowed_modes: frozenset[Mode] = frozenset(Mode)
    ) -> None:
        self.silences = silences if silences is not None else SilenceBook()
        self.allowed_modes = allowed_modes
        self._commands: deque[ModeCommand] = deque()
        self._lock = threading.Lock()

    def arm(self, mode: Mode) -> None:
        if mode is Mode.OBSERVE:
            raise ControlRefused("arm needs mode alert or kill; use /disarm for observe")
        if mode not in self.allowed_modes:
            raise ControlRefused(f"mode {mode.value} is not allowed by this daemon's configuration")
        with self._lock:
            self._commands.append(ModeCommand(mode, True))

    def disarm(self) -> None:
        with self._lock:
            self._commands.append(ModeCommand(Mode.OBSERVE, False))

    def drain(self) -> list[ModeCommand]:
        """The commands queued since the last drain, oldest first (called by the loop)."""
        with self._lock:
            commands = list(self._commands)
            self._commands.clear()
        return commands

    def pending(self) -> list[ModeCommand]:
        with self._lock:
            return list(self._commands)

    def add_silence(
        self, matchers: dict[str, str], duration_s: float, comment: str, now: float
    ) -> dict[str, Any]:
        return self.silences.add(matchers, duration_s, comment, now).to_dict()

    def list_silences(self, now: float) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.silences.active(now)]

    def delete_silence(self, silence_id: str) -> bool:
        return self.silences.delete(silence_id)
