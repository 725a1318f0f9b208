"""Silences: alerts matching a silence's labels are held back until it ends.

Pure and thread-safe: time is passed in; HTTP threads add and delete, the loop asks. The action
engine consults the book before it sends an alert; the REST API edits it through
:class:`gpu_triage.serving.control.QueuedControl`.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_triage.model.states import Verdict

#: The longest silence accepted (30 days) and the longest comment.
MAX_SILENCE_S = 30 * 24 * 3600.0
MAX_COMMENT_CHARS = 1024
MAX_SILENCES = 1000
#: Labels a silence may match on, exactly.
SILENCE_LABELS = ("job", "verdict", "node")


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
