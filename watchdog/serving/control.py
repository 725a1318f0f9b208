"""Mutations of the daemon from outside its loop: mode changes and silences.

REST handlers run on uvicorn's thread; the loop owns all state. :class:`QueuedControl` bridges the two
without a shared lock on the hot path: ``arm``/``disarm`` enqueue a :class:`ModeCommand` that the loop
applies at its next cycle (:meth:`QueuedControl.drain`), and silences live in a thread-safe, pure
:class:`SilenceBook` (time passed in). The Protocols here are what ``gpu_triage.serving.api`` needs from the
daemon, so the API can be tested against any implementation.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_triage.actions.silences import SilenceBook
from gpu_triage.model.states import Mode

# --------------------------------------------------------------------------------------------------
# What the app needs from the rest of the daemon


class SupportsToDict(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


class EventsReader(Protocol):
    """The event store, read side: events with ``id > after_id``, oldest first, at most ``limit``.
    Each event is a JSON-able dict with an integer ``id``, or an object with ``to_dict()`` giving one
    (``gpu_triage.journal.eventstore.StoredEvent``). Called from an HTTP worker thread; may raise
    RuntimeError (the store's StoreError) when the file cannot be read, answered 503."""

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
        if not self._commands:  # 10 times a second, nearly always empty: no lock (one queued now is next)
            return []
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
