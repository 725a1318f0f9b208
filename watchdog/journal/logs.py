"""One structured log line per thing an operator must be able to find in ``journalctl -u gpu-watchdog``.

Five kinds of :class:`LogLine`, each written as exactly one line where it happens:

- ``verdict`` - a job's verdict changed (the daemon's detect step);
- ``evidence`` - an evidence bundle was written, or its capture failed (the action engine);
- ``alert_delivery`` - an alert reached a receiver, was rejected for good, or is being retried
  (the delivery outbox);
- ``kill`` - a SIGTERM/SIGKILL/kill hook was started, sent or failed (the action engine);
- ``refusal`` - the watchdog decided *not* to act: not armed (observe/alert mode), a deterministic
  hang, the kill budget spent, no proven process, evidence still being captured, disarmed.

The line is human text by default (``daemon.log_format = "text"``)::

    verdict job=tiny-cpu healthy -> deadlock_suspected cause=- signals=steps_frozen ranks=0,1

and one JSON object with ``daemon.log_format = "json"`` (every other log record becomes JSON too, so
the journal holds one format)::

    {"time": "...", "level": "WARNING", "logger": "gpu_watchdog.events", "event": "verdict", ...}

A :class:`RateLimiter` bounds each (kind, job) stream: a flapping verdict or a retrying receiver
cannot flood the journal; the next line that passes says how many were suppressed. Formatting is pure
(:func:`format_text`, :func:`format_json`); :class:`EventLog` is the small stateful part.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TextIO

from gpu_triage.model.actions import KILL_ACTIONS, REFUSAL_RESULTS, Action, Result
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.names import printable

LOGGER_NAME = "gpu_watchdog.events"
LOG_FORMATS = ("text", "json")


class EventKind(StrEnum):
    VERDICT = "verdict"
    EVIDENCE = "evidence"
    ALERT_DELIVERY = "alert_delivery"
    KILL = "kill"
    REFUSAL = "refusal"


#: The facts of a kill/refusal record worth a place on its line, in this order.
_ACTION_FIELDS = (
    "via",
    "argv",
    "returncode",
    "failed",
    "fallback",
    "signal",
    "pids",
    "signalled",
    "errors",
    "survivors",
    "mode",
    "reason",
    "signature",
    "limit",
    "kills_in_last_hour",
    "error",
    "dry_run",
)


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line's content. ``summary`` is the human part (``healthy -> deadlock_suspected``); ``fields``
    are the key=value facts, in order; ``level`` a logging level."""

    kind: EventKind
    job: str | None
    summary: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    level: int = logging.INFO
    time: float | None = None


# ----------------------------------------------------------------------------------------- format


def _plain_text(value: Any) -> str:
    """A value as text on one line, unquoted: lists joined by commas, mappings as ``k:v``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else "-"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(_plain_text(v) for v in value) or "-"
    if isinstance(value, Mapping):
        return ",".join(f"{k}:{_plain_text(v)}" for k, v in value.items()) or "-"
    return printable(" ".join(str(value).split()), 1000)  # one printable line, whatever came in


def _scalar(value: Any) -> str:
    """A field value as one token of the text line: quoted when it holds a space or '='."""
    text = _plain_text(value)
    return f'"{text}"' if (" " in text or "=" in text) else (text or '""')


def format_text(event: LogLine) -> str:
    """``kind job=JOB summary key=value ...`` on one line."""
    parts = [str(event.kind)]
    if event.job is not None:
        parts.append(f"job={_scalar(event.job)}")
    if event.summary:
        parts.append(printable(" ".join(event.summary.split()), 1000))
    parts.extend(f"{k}={_scalar(v)}" for k, v in event.fields.items())
    return " ".join(parts)


def event_dict(event: LogLine) -> dict[str, Any]:
    """The JSON fields of an event (no time/level: the formatter adds those)."""
    out: dict[str, Any] = {"event": str(event.kind)}
    if event.job is not None:
        out["job"] = event.job
    out["summary"] = " ".join(event.summary.split())
    for k, v in event.fields.items():
        out.setdefault(str(k), jsonable(v))
    return out


def format_json(event: LogLine) -> str:
    return json.dumps(event_dict(event), separators=(",", ":"), sort_keys=False)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """Every record as one JSON object: ``time, level, logger, message`` plus an event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
        }
        event = getattr(record, "gpu_watchdog_event", None)
        if isinstance(event, LogLine):
            out |= event_dict(event)
            out["message"] = format_text(event)
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, one line per record whatever its arguments hold: the message's control
    characters (a newline would forge a whole line; ESC drives terminals) are escaped and its length
    bounded; a traceback's lines are each prefixed with ``| `` so none can pass for a record."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        saved = record.message
        record.message = printable(saved, MAX_MESSAGE_CHARS)
        try:
            return super().formatMessage(record)
        finally:
            record.message = saved

    def formatException(self, ei) -> str:
        text = super().formatException(ei)
        return "\n".join("| " + printable(line, MAX_MESSAGE_CHARS) for line in text.splitlines())

    def formatStack(self, stack_info: str) -> str:
        return "\n".join("| " + printable(line, MAX_MESSAGE_CHARS) for line in stack_info.splitlines())


MAX_MESSAGE_CHARS = 4000


def configure(level: str = "info", log_format: str = "text", stream: TextIO | None = None) -> None:
    """Root logging for ``gpu-watchdog run``: human text (default) or JSON lines, to stderr (the
    journal under systemd). Replaces handlers set before (a reload does not double lines)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"daemon.log_format: expected one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


# ------------------------------------------------------------------------------------ rate limit


class RateLimiter:
    """At most ``burst`` lines per ``window_s`` for each key (a sliding window); the rest are counted.

    :meth:`admit` returns ``(allowed, suppressed_before)``: when a line is allowed after others were
    suppressed, ``suppressed_before`` says how many, so the journal shows the gap."""

    def __init__(self, burst: int = 10, window_s: float = 60.0, max_keys: int = 4096) -> None:
        if burst < 1 or window_s <= 0:
            raise ValueError("burst must be >= 1 and window_s > 0")
        self.burst = burst
        self.window_s = window_s
        self.max_keys = max_keys
        self._times: dict[tuple[str, ...], list[float]] = {}
        self._suppressed: dict[tuple[str, ...], int] = {}

    def admit(self, key: tuple[str, ...], now: float) -> tuple[bool, int]:
        times = [t for t in self._times.get(key, ()) if now - t < self.window_s]
        if len(times) >= self.burst:
            self._times[key] = times
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False, 0
        if key not in self._times and len(self._times) >= self.max_keys:
            self._evict(now)
        times.append(now)
        self._times[key] = times
        return True, self._suppressed.pop(key, 0)

    def _evict(self, now: float) -> None:
        """Bound the memory: drop keys with nothing in the window (else the oldest)."""
        idle = [k for k, ts in self._times.items() if not ts or now - ts[-1] >= self.window_s]
        for k in idle or sorted(self._times, key=lambda k: self._times[k][-1] if self._times[k] else 0)[:1]:
            self._times.pop(k, None)
            self._suppressed.pop(k, None)


class RepeatFilter(logging.Filter):
    """Rate-limits every log record by where it comes from (logger, level, message template): at most
    ``burst`` per ``window_s`` (default 10 a minute), the next one that passes says how many similar
    ones were dropped. An error that repeats every cycle or on every connection (EMFILE while file
    descriptors are exhausted, a failing receiver) therefore writes a few lines a minute, not millions.
    :class:`LogLine` records are left alone: :class:`EventLog` limits them per (kind, job) already."""

    def __init__(
        self, burst: int = 10, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.limiter = RateLimiter(burst, window_s)
        self.clock = clock
        self._lock = threading.Lock()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "gpu_watchdog_event", None) is not None:
            return True
        key = (record.name, str(record.levelno), str(record.msg)[:200])
        with self._lock:
            allowed, suppressed = self.limiter.admit(key, self.clock())
            if not allowed:
                self.dropped += 1
        if allowed and suppressed:
            record.msg = f"{record.msg} [{suppressed} similar message(s) suppressed before this one]"
        return allowed


# -------------------------------------------------------------------------------------- the log


class EventLog:
    """Writes :class:`LogLine` lines to a logger, rate-limited per (kind, job, stream)."""

    def __init__(
        self,
        logger: logging.Logger | None = None,
        limiter: RateLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger or logging.getLogger(LOGGER_NAME)
        self.limiter = limiter or RateLimiter()
        self.clock = clock
        self._lock = threading.Lock()

    def emit(self, event: LogLine, stream: str = "") -> bool:
        """Log ``event`` unless its stream is over its rate; True when a line was written."""
        key = (str(event.kind), event.job or "", stream)
        with self._lock:
            allowed, suppressed = self.limiter.admit(key, self.clock())
        if not allowed:
            return False
        if suppressed:
            event = LogLine(
                event.kind,
                event.job,
                event.summary,
                {**event.fields, "suppressed_before": suppressed},
                event.level,
                event.time,
            )
        self.logger.log(event.level, "%s", format_text(event), extra={"gpu_watchdog_event": event})
        return True

    # -- the five kinds, built from what the daemon, engine and outbox already have ----------------

    def verdict(
        self,
        job: str,
        old: str | None,
        new: str | None,
        *,
        cause: str | None = None,
        signals: Sequence[str] = (),
        ranks: Sequence[int] = (),
        onset: float | None = None,
        kill_worthy: bool | None = None,
        blame: str | None = None,
    ) -> bool:
        fields: dict[str, Any] = {"cause": cause, "signals": list(signals), "ranks": list(ranks)}
        if onset is not None:
            fields["onset"] = _iso(onset)
        if kill_worthy is not None:
            fields["kill_worthy"] = kill_worthy
        if blame is not None and blame != "job":  # whom a hang blames, where it is not the job
            fields["blame"] = blame
        summary = f"{old or 'new'} -> {new or 'gone'}"
        level = logging.WARNING if new and new.startswith("deadlock") else logging.INFO
        return self.emit(LogLine(EventKind.VERDICT, job, summary, fields, level))

    def action(self, record: Mapping[str, Any]) -> bool:
        """An action engine record (``{action, result, job, ...}``): an ``evidence``, ``kill`` or
        ``refusal`` line, or nothing for the other actions (alerts are logged at delivery)."""
        action, result = str(record.get("action")), str(record.get("result"))
        job = record.get("job")
        job = str(job) if job is not None else None
        if action == Action.CAPTURE:
            if result == Result.OK:
                fields = {
                    "path": record.get("path"),
                    "items_ok": f"{record.get('ok_items')}/{record.get('items')}",
                    "duration_s": record.get("duration_s"),
                }
                return self.emit(LogLine(EventKind.EVIDENCE, job, "bundle written", fields))
            if result == Result.ERROR:
                fields = {"path": record.get("path"), "error": record.get("error")}
                return self.emit(LogLine(EventKind.EVIDENCE, job, "capture failed", fields, logging.ERROR))
            return False
        if action not in KILL_ACTIONS:
            return False
        details = {k: record[k] for k in _ACTION_FIELDS if record.get(k) not in (None, [], "")}
        if result in REFUSAL_RESULTS:
            return self.emit(
                LogLine(EventKind.REFUSAL, job, f"no {action}: {result}", details), stream=action
            )
        level = logging.ERROR if result == Result.ERROR else logging.WARNING
        return self.emit(LogLine(EventKind.KILL, job, f"{action} {result}", details, level), stream=action)

    def delivery(self, alert_name: str, job: str | None, status: str, outcome: str, **fields: Any) -> bool:
        """An alert delivery outcome: ``delivered``, ``rejected`` or ``retrying``."""
        level = {"rejected": logging.ERROR, "retrying": logging.WARNING}.get(outcome, logging.INFO)
        summary = f"{alert_name} {status} {outcome}"
        return self.emit(
            LogLine(EventKind.ALERT_DELIVERY, job, summary, fields, level),
            stream=f"{fields.get('sink', '')}:{outcome}",
        )


EVENTS = EventLog()
"""The process's event log (one per daemon process; tests make their own)."""
