"""The event store: every state change, verdict and action, in SQLite (WAL) under the state directory.

File: ``<state_dir>/events.sqlite3``. Failure policy - the store never takes the daemon down:

- **Corrupt file** (at open, or found mid-run by a write or by a reader - the next append then
  confirms with ``quick_check``): it is moved aside as
  ``events.sqlite3.corrupt-<UTC timestamp>`` (with its ``-wal``/``-shm``), a fresh store is started and
  its first event (kind ``store``) says so and where the old file went.
- **Full disk or other write failure** (``database or disk is full``, I/O errors, a lock held too
  long): :meth:`EventStore.append` does not raise. The event is counted in ``dropped_total`` and kept in
  a small bounded in-memory buffer, retried (in order, before newer events) at most every
  ``retry_interval_s``; when the buffer overflows the oldest buffered event is lost (``lost_total``).
  When writing works again a ``store`` event reports how many were delayed and lost.
- **Crash**: WAL with ``synchronous=NORMAL`` - a process crash loses nothing committed, a power loss
  at most the last transactions (the last cycle).

Threads: the loop thread writes through one connection guarded by a lock (every write method may be
called from any thread, serialised). Readers (:meth:`EventStore.since`, e.g. from the REST thread) use
one read-only connection per thread, opened on first use; WAL lets them read while the loop writes.
After a corrupt file was replaced, each reader reopens on its next call.

Schema: :data:`MIGRATIONS`, applied in order, the version kept in ``PRAGMA user_version``. To add a
table (the alert outbox of issue 4 builds on the ``outbox`` table and the ``kv`` table below), append
a migration; never edit one that has shipped. A file with a version newer than this code knows is moved
aside like a corrupt one (``.newer-schema-<timestamp>``) rather than misread.

Retention (:meth:`EventStore.prune`, called by the loop through :meth:`EventStore.maybe_prune` at most
every ``prune_interval_s``): delete events older than ``retention_s``, then the oldest events while the
pages in use exceed ``max_bytes``; free pages go back to the file system (incremental vacuum) and the
WAL is truncated. The outbox and kv tables are not pruned (their owners delete what they finish).

Time is always passed in (epoch seconds); the store never reads a clock.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_triage.journal.kv_mirror import KvMirror
from gpu_triage.model.names import printable

log = logging.getLogger(__name__)

_KV_UPSERT = (
    "INSERT INTO kv (key, value, updated_s) VALUES (?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_s = excluded.updated_s"
)

MEMORY_MAX_BYTES = 32 << 20
"""Retention size limit while the store is on memory only (full disk at start)."""

DB_NAME = "events.sqlite3"
EVENT_KINDS = ("state_change", "verdict", "action", "evidence", "alert", "store", "daemon")
"""Kinds the daemon writes; others are accepted (the column is free text) but these are the vocabulary."""

MIGRATIONS: tuple[str, ...] = (
    # 1: the event log.
    """
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time_s REAL NOT NULL,
        kind TEXT NOT NULL,
        gpu INTEGER,
        job TEXT,
        payload TEXT NOT NULL
    );
    CREATE INDEX events_time_s ON events (time_s);
    """,
    # 2: small durable state for other components: a key/value table (silences, armed mode, ...) and
    # the alert outbox (issue 4): one row per delivery to one sink, retried until done.
    """
    CREATE TABLE kv (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_s REAL NOT NULL
    );
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        sink TEXT NOT NULL,
        dedup_key TEXT NOT NULL,
        payload TEXT NOT NULL,
        created_s REAL NOT NULL,
        next_attempt_s REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT
    );
    CREATE INDEX outbox_due ON outbox (next_attempt_s);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

# SQLite primary result codes (sqlite3.Error.sqlite_errorcode & 0xff).
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_CORRUPT_CODES = frozenset({_SQLITE_CORRUPT, _SQLITE_NOTADB})


class StoreError(RuntimeError):
    """A store operation that has no quiet fallback failed (kv/outbox writes, reads)."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    id: int
    time_s: float
    kind: str
    gpu: int | None
    job: str | None
    payload: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "time": self.time_s,
            "kind": self.kind,
            "gpu": self.gpu,
            "job": self.job,
            "payload": self.payload,
        }


@dataclass(frozen=True, slots=True)
class OutboxItem:
    id: int
    sink: str
    dedup_key: str
    payload: dict[str, Any]
    created_s: float
    next_attempt_s: float
    attempts: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class StoreStats:
    appended_total: int
    """Events written."""
    dropped_total: int
    """Events whose first write failed (each then buffered and retried, or lost)."""
    lost_total: int
    """Buffered events pushed out of the full buffer: never written."""
    pending: int
    """Events in the buffer now."""
    recovered_total: int
    """Times a corrupt (or unreadable) file was moved aside."""
    pruned_total: int
    """Events deleted by retention."""


@dataclass(frozen=True, slots=True)
class _Pending:
    time_s: float
    kind: str
    gpu: int | None
    job: str | None
    payload: str


def _utc_stamp(now_s: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s))


def _is_corrupt(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _CORRUPT_CODES
    message = str(error)
    return "malformed" in message or "not a database" in message


def _dumps(payload: Mapping[str, Any]) -> str:
    """JSON text, ASCII only (any string, even one holding lone surrogates, is escaped)."""
    return json.dumps(payload, separators=(",", ":"), default=str, allow_nan=False, ensure_ascii=True)


class EventStore:
    """The daemon's event log plus small durable tables. See the module docstring for the policies."""

    def __init__(
        self,
        state_dir: Path,
        now_s: float,
        *,
        retention_s: float = 30 * 86400.0,
        max_bytes: int = 256 << 20,
        prune_interval_s: float = 600.0,
        pending_max: int = 1000,
        retry_interval_s: float = 5.0,
        hard_limit_bytes: int | None = None,
        check_on_open: bool = True,
        memory_fallback: bool = False,
        reattach_interval_s: float = 30.0,
    ) -> None:
        """Open (or create) ``state_dir/events.sqlite3``.

        ``hard_limit_bytes`` caps the database file (SQLite ``max_page_count``): a write past it fails
        as on a full disk. ``check_on_open`` runs ``PRAGMA quick_check`` (a full read of the file;
        well under a second at the default size) so a corrupt file is replaced at start, not mid-run.
        Raises OSError if the state directory cannot be created and :class:`StoreError` if the file
        cannot be opened or created for a reason other than corruption (permissions, a full disk at
        start); the caller may run on without a store.

        ``memory_fallback``: instead of raising, run on an in-memory database (said loudly in the log,
        :attr:`memory_only` True, :attr:`memory_reason` why) that holds events, the kv table and the
        outbox like the file would - so alerting and the kill budget keep working on a full disk - and
        move everything to the file when :meth:`maybe_reattach` (called each cycle, acting at most
        every ``reattach_interval_s``) can open it.
        """
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / DB_NAME
        self.retention_s = retention_s
        self.max_bytes = max_bytes
        self.prune_interval_s = prune_interval_s
        self.retry_interval_s = retry_interval_s
        self.hard_limit_bytes = hard_limit_bytes
        self._pending: deque[_Pending] = deque()
        self._pending_max = pending_max
        self._retry_at_s = 0.0
        self._lock = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._generation = 0
        self._last_prune_s: float | None = None
        self._appended = self._dropped = self._lost = self._recovered = self._pruned = 0
        self._failures_since_ok = 0
        self._lost_since_ok = 0
        self._closed = False
        self._suspect_corrupt = False
        self.mirror = KvMirror(self.state_dir)
        self.memory_only = False
        self.memory_reason: str | None = None
        self.reattach_interval_s = reattach_interval_s
        self._reattach_at_s = 0.0
        self._disk_max_bytes = max_bytes
        self._memory_uri = f"file:gpu-watchdog-{os.getpid()}-{id(self):x}?mode=memory&cache=shared"
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._db = self._open(now_s, check_on_open)
        except (StoreError, OSError) as e:
            if not memory_fallback:
                raise
            self._db = self._open_memory(now_s, str(e))

    # ---------------------------------------------------------------------------------------- open

    def _connect(self) -> sqlite3.Connection:
        if self.memory_only:
            db = sqlite3.connect(self._memory_uri, uri=True, isolation_level=None, check_same_thread=False)
            return db
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=2.0)
        db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only takes effect on a new file
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA journal_size_limit = 16777216")
        if self.hard_limit_bytes is not None:
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            db.execute(f"PRAGMA max_page_count = {max(8, self.hard_limit_bytes // page_size)}")
        return db

    def _open(self, now_s: float, check: bool) -> sqlite3.Connection:
        reason: str | None = None
        db: sqlite3.Connection | None = None
        try:
            db = self._connect()
            if check:
                result = db.execute("PRAGMA quick_check(1)").fetchone()[0]
                if result != "ok":
                    reason = f"quick_check: {result}"
            if reason is None:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    reason = f"schema version {version} is newer than this daemon's ({SCHEMA_VERSION})"
                else:
                    self._migrate(db, version)
                    return db
        except sqlite3.Error as e:
            if not _is_corrupt(e):
                if db is not None:
                    db.close()
                raise StoreError(f"cannot open the event store {self.path}: {e}") from e
            reason = str(e)
        if db is not None:
            db.close()
        suffix = "newer-schema" if reason and reason.startswith("schema version") else "corrupt"
        moved_to = self._move_aside(now_s, suffix)
        db = self._connect()
        self._migrate(db, 0)
        restored = self._restore_kv(db, now_s)
        self._recovered += 1
        self._generation += 1
        log.error(
            "event store %s unusable (%s); moved aside to %s, started anew", self.path, reason, moved_to
        )
        self._insert(
            db,
            [
                _Pending(
                    now_s,
                    "store",
                    None,
                    None,
                    _dumps(
                        {
                            "event": "moved_aside",
                            "reason": reason,
                            "moved_to": str(moved_to),
                            "safety_records_restored": restored,
                        }
                    ),
                )
            ],
        )
        return db

    def _open_memory(self, now_s: float, reason: str) -> sqlite3.Connection:
        """The full-disk fallback: the same schema in memory, the kv table from the mirror file."""
        self.memory_only, self.memory_reason = True, reason
        self.max_bytes = min(self._disk_max_bytes, MEMORY_MAX_BYTES)
        self._reattach_at_s = now_s + self.reattach_interval_s
        db = self._connect()
        self._migrate(db, 0)
        restored = self._restore_kv(db, now_s)
        log.error(
            "EVENT STORE ON MEMORY ONLY: %s. Alerts, silences and the kill budget are kept in memory "
            "(%d safety record(s) restored from %s) and move to %s once it can be written (retried every "
            "%.0f s); events are lost if the daemon stops before that.",
            reason,
            restored,
            self.mirror.path,
            self.path,
            self.reattach_interval_s,
        )
        self._insert(
            db, [_Pending(now_s, "store", None, None, _dumps({"event": "memory_only", "reason": reason}))]
        )
        return db

    def _restore_kv(self, db: sqlite3.Connection, now_s: float) -> int:
        """Fill an empty kv table from the mirror file (after a corrupt store or on memory only)."""
        items = self.mirror.read()
        for key, value in items.items():
            db.execute(
                "INSERT OR IGNORE INTO kv (key, value, updated_s) VALUES (?, ?, ?)", (key, value, now_s)
            )
        return len(items)

    def _mirror_kv(self) -> None:
        if self.memory_only and not self.state_dir.is_dir():
            return
        try:
            rows = self._db.execute("SELECT key, value FROM kv").fetchall()
        except sqlite3.Error as e:
            log.warning("cannot read the kv table to mirror it: %s", e)
            return
        self.mirror.write({k: v for k, v in rows})

    def maybe_reattach(self, now_s: float) -> bool:
        """On memory only: try to open the file (at most every ``reattach_interval_s``); on success
        copy events, kv and outbox into it and continue there. True when it reattached."""
        if not self.memory_only or now_s < self._reattach_at_s:
            return False
        self._reattach_at_s = now_s + self.reattach_interval_s
        with self._lock:
            self.memory_only = False
            try:
                self.state_dir.mkdir(parents=True, exist_ok=True)
                disk = self._open(now_s, check=True)
            except (StoreError, OSError, sqlite3.Error) as e:
                self.memory_only = True
                log.info("event store still on memory only: %s", e)
                return False
            try:
                moved = self._copy_into(disk)
            except sqlite3.Error as e:
                disk.close()
                self.memory_only = True
                log.warning("event store still on memory only (copying to %s failed: %s)", self.path, e)
                return False
            old, self._db = self._db, disk
            self.max_bytes = self._disk_max_bytes
            self._generation += 1
            reason, self.memory_reason = self.memory_reason, None
            old.close()
            self._insert(
                disk,
                [
                    _Pending(
                        now_s, "store", None, None, _dumps({"event": "reattached", "after": reason, **moved})
                    )
                ],
            )
            self._mirror_kv()
        log.warning("event store reattached to %s (moved %s from memory)", self.path, moved)
        return True

    def _copy_into(self, disk: sqlite3.Connection) -> dict[str, int]:
        """Copy the memory database's rows into the file's, in one transaction. Outbox rows keep their
        id when it is free there (a sink worker may hold it), else get a new one."""
        src = self._db
        events = src.execute("SELECT time_s, kind, gpu, job, payload FROM events ORDER BY id").fetchall()
        kv = src.execute("SELECT key, value, updated_s FROM kv").fetchall()
        outbox = src.execute("SELECT * FROM outbox ORDER BY id").fetchall()
        columns = [d[0] for d in src.execute("SELECT * FROM outbox LIMIT 0").description]
        disk.execute("BEGIN IMMEDIATE")
        try:
            disk.executemany(
                "INSERT INTO events (time_s, kind, gpu, job, payload) VALUES (?, ?, ?, ?, ?)", events
            )
            disk.executemany(
                "INSERT INTO kv (key, value, updated_s) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "value = excluded.value, updated_s = excluded.updated_s",
                kv,
            )
            marks = ", ".join("?" for _ in columns)
            for row in outbox:
                taken = disk.execute("SELECT 1 FROM outbox WHERE id = ?", (row[0],)).fetchone()
                if taken:
                    disk.execute(
                        f"INSERT INTO outbox ({', '.join(columns[1:])}) VALUES ({marks[3:]})", row[1:]
                    )
                else:
                    disk.execute(f"INSERT INTO outbox ({', '.join(columns)}) VALUES ({marks})", row)
            disk.execute("COMMIT")
        except BaseException:
            if disk.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    disk.execute("ROLLBACK")
            raise
        return {"events": len(events), "kv": len(kv), "outbox": len(outbox)}

    def _migrate(self, db: sqlite3.Connection, version: int) -> None:
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in filter(str.strip, script.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def _move_aside(self, now_s: float, suffix: str) -> Path:
        target = self.path.with_name(f"{DB_NAME}.{suffix}-{_utc_stamp(now_s)}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{DB_NAME}.{suffix}-{_utc_stamp(now_s)}-{n}")
            n += 1
        os.replace(self.path, target)
        for extra in ("-wal", "-shm"):
            side = self.path.with_name(DB_NAME + extra)
            if side.exists():
                os.replace(side, target.with_name(target.name + extra))
        return target

    def _recover(self, now_s: float, error: sqlite3.Error) -> None:
        """Mid-run corruption: close everything, move the file aside, start afresh."""
        log.error("event store %s is corrupt (%s)", self.path, error)
        self._db.close()
        self._db = self._open(now_s, check=True)

    # ------------------------------------------------------------------------------------- writing

    def append(
        self,
        kind: str,
        payload: Mapping[str, Any],
        *,
        time_s: float,
        gpu: int | None = None,
        job: str | None = None,
    ) -> int | None:
        """Record one event; returns its id, or None when it could not be written now (buffered or,
        if the buffer is full, the oldest buffered event lost). Never raises for storage problems."""
        # Names come from training users (directory names, environments): whatever they hold, the row
        # is written (a lone surrogate cannot be encoded by SQLite; control bytes would reach readers).
        event = _Pending(
            time_s, printable(kind, 64), gpu, None if job is None else printable(job, 256), _dumps(payload)
        )
        with self._lock:
            if self._closed:
                raise StoreError("event store is closed")
            if self._suspect_corrupt:
                self._verify(time_s)
            if self._pending and time_s >= self._retry_at_s:
                self._drain(time_s)
            ids = None if self._pending else self._write_batch([event], time_s)
            if ids is None:
                self._dropped += 1
                self._buffer(event)
                return None
            if self._failures_since_ok:
                report = {
                    "event": "write_recovered",
                    "delayed": self._failures_since_ok - self._lost_since_ok,
                    "lost": self._lost_since_ok,
                }
                self._failures_since_ok = self._lost_since_ok = 0
                self._write_batch([_Pending(time_s, "store", None, None, _dumps(report))], time_s)
            return ids[0]

    def _drain(self, now_s: float, chunk: int = 64) -> None:
        """Write buffered events oldest first, in small transactions, until one fails (a nearly full
        disk still takes what fits)."""
        while self._pending:
            batch = list(itertools.islice(self._pending, chunk))
            if self._write_batch(batch, now_s) is None:
                return
            for _ in batch:
                self._pending.popleft()

    def _verify(self, now_s: float) -> None:
        """A reader saw corruption: confirm with quick_check on the writer, and replace the file if so."""
        self._suspect_corrupt = False
        try:
            result = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
            if result == "ok":
                return
            error: sqlite3.Error = sqlite3.DatabaseError(f"quick_check: {result}")
        except sqlite3.Error as e:
            if not _is_corrupt(e):
                return
            error = e
        try:
            self._recover(now_s, error)
        except (OSError, StoreError, sqlite3.Error) as again:
            log.error("event store could not be replaced: %s", again)

    def _buffer(self, event: _Pending) -> None:
        self._failures_since_ok += 1
        if len(self._pending) >= self._pending_max:
            self._pending.popleft()
            self._lost += 1
            self._lost_since_ok += 1
        self._pending.append(event)

    def _write_batch(self, batch: list[_Pending], now_s: float) -> list[int] | None:
        for attempt in range(2):
            try:
                ids = self._insert(self._db, batch)
                self._appended += len(ids)
                return ids
            except sqlite3.Error as e:
                if attempt == 0 and _is_corrupt(e):
                    try:
                        self._recover(now_s, e)
                        continue
                    except (OSError, StoreError, sqlite3.Error) as again:
                        log.error("event store could not be replaced: %s", again)
                if not self._pending:
                    log.warning("event store write failed (%s); buffering events in memory", e)
                self._retry_at_s = now_s + self.retry_interval_s
                return None
        return None  # pragma: no cover

    @staticmethod
    def _insert(db: sqlite3.Connection, batch: list[_Pending]) -> list[int]:
        db.execute("BEGIN IMMEDIATE")
        try:
            ids = []
            for e in batch:
                cur = db.execute(
                    "INSERT INTO events (time_s, kind, gpu, job, payload) VALUES (?, ?, ?, ?, ?)",
                    (e.time_s, e.kind, e.gpu, e.job, e.payload),
                )
                ids.append(int(cur.lastrowid or 0))
            db.execute("COMMIT")
            return ids
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------------------------ retention

    def maybe_prune(self, now_s: float) -> int | None:
        """Run :meth:`prune` if ``prune_interval_s`` has passed since the last run; None if skipped."""
        if self._last_prune_s is not None and now_s - self._last_prune_s < self.prune_interval_s:
            return None
        return self.prune(now_s)

    def prune(self, now_s: float, *, max_rows: int = 200_000) -> int:
        """Delete events older than ``retention_s``, then the oldest while the pages in use exceed
        ``max_bytes`` (to 90 % of it); at most ``max_rows`` per call to bound the pause. Returns the
        number deleted; never raises for storage problems (returns 0)."""
        with self._lock:
            self._last_prune_s = now_s
            try:
                return self._prune(now_s, max_rows)
            except sqlite3.Error as e:
                if _is_corrupt(e):
                    self._recover(now_s, e)
                else:
                    log.warning("event store prune failed: %s", e)
                return 0

    def _prune(self, now_s: float, max_rows: int) -> int:
        db = self._db
        cutoff_s = now_s - self.retention_s
        deleted = db.execute(
            "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE time_s < ? ORDER BY id LIMIT ?)",
            (cutoff_s, max_rows),
        ).rowcount
        used = self.used_bytes()
        if used > self.max_bytes and deleted < max_rows:
            low, high = db.execute("SELECT MIN(id), MAX(id) FROM events").fetchone()
            if low is not None:
                share = 1.0 - (0.9 * self.max_bytes) / used
                cut = low + max(1, int((high - low + 1) * share))
                deleted += db.execute(
                    "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE id < ? ORDER BY id LIMIT ?)",
                    (cut, max_rows - deleted),
                ).rowcount
        if deleted:
            db.executescript("PRAGMA incremental_vacuum;")  # execute() would free one page only
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._pruned += deleted
        return deleted

    def used_bytes(self) -> int:
        """Bytes of the database in use (pages minus free pages); the WAL is not counted."""
        with self._lock:
            page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
            return int((pages - free) * page_size)

    # ------------------------------------------------------------------------------------- reading

    def _reader(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "generation", None) != self._generation or getattr(local, "db", None) is None:
            old = getattr(local, "db", None)
            if old is not None:
                old.close()
            uri = self._memory_uri if self.memory_only else f"file:{self.path}?mode=ro"
            db = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=2.0)
            local.db, local.generation = db, self._generation
            with self._lock:
                self._readers.append(db)
        return local.db

    def since(self, after_id: int = 0, limit: int = 100) -> list[StoredEvent]:
        """Events with id greater than ``after_id``, oldest first, at most ``limit`` (1..10000).
        Safe from any thread. Raises :class:`StoreError` if the file cannot be read."""
        limit = max(1, min(int(limit), 10_000))
        try:
            rows = (
                self._reader()
                .execute(
                    "SELECT id, time_s, kind, gpu, job, payload FROM events WHERE id > ? ORDER BY id LIMIT ?",
                    (int(after_id), limit),
                )
                .fetchall()
            )
        except sqlite3.Error as e:
            if _is_corrupt(e):
                self._suspect_corrupt = True  # the loop's next append verifies and replaces the file
            raise StoreError(f"cannot read events from {self.path}: {e}") from e
        return [StoredEvent(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]

    def last_id(self) -> int:
        """The id of the newest event (0 when empty)."""
        try:
            row = self._reader().execute("SELECT MAX(id) FROM events").fetchone()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read events from {self.path}: {e}") from e
        return int(row[0] or 0)

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                appended_total=self._appended,
                dropped_total=self._dropped,
                lost_total=self._lost,
                pending=len(self._pending),
                recovered_total=self._recovered,
                pruned_total=self._pruned,
            )

    # ---------------------------------------------------------------------- key/value (durable state)

    def _write(self, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        with self._lock:
            try:
                return self._db.execute(sql, args)
            except sqlite3.Error as e:
                raise StoreError(f"event store write failed: {e}") from e

    def kv_set(self, key: str, value: Any, now_s: float) -> None:
        """Store a JSON-serialisable ``value`` under ``key`` (replacing), and rewrite the kv mirror
        file (:mod:`gpu_triage.journal.kv_mirror`). Raises StoreError."""
        self.kv_set_many({key: value}, now_s)

    def kv_set_many(self, items: Mapping[str, Any], now_s: float) -> None:
        """:meth:`kv_set` of several keys in one transaction (all or none) and one rewrite of the kv
        mirror (temp file, fsync, rename: once, not once a key). Raises StoreError."""
        rows = [(key, _dumps({"v": value}), now_s) for key, value in items.items()]
        with self._lock:
            if len(rows) == 1:  # one statement is its own transaction
                self._write(_KV_UPSERT, rows[0])
            else:
                try:
                    self._db.execute("BEGIN IMMEDIATE")
                    try:
                        self._db.executemany(_KV_UPSERT, rows)
                        self._db.execute("COMMIT")
                    except BaseException:
                        self._db.execute("ROLLBACK")
                        raise
                except sqlite3.Error as e:
                    raise StoreError(f"event store write failed: {e}") from e
            self._mirror_kv()

    def kv_get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            try:
                row = self._db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            except sqlite3.Error as e:
                raise StoreError(f"event store read failed: {e}") from e
        return default if row is None else json.loads(row[0])["v"]

    def kv_delete(self, key: str) -> bool:
        with self._lock:
            deleted = self._write("DELETE FROM kv WHERE key = ?", (key,)).rowcount > 0
            self._mirror_kv()
        return deleted

    # ----------------------------------------------------------------------------------- outbox

    def outbox_put(self, sink: str, dedup_key: str, payload: Mapping[str, Any], now_s: float) -> int:
        """Queue one delivery, due now. Raises StoreError (the caller keeps it in memory)."""
        cur = self._write(
            "INSERT INTO outbox (sink, dedup_key, payload, created_s, next_attempt_s) VALUES (?, ?, ?, ?, ?)",
            (sink, dedup_key, _dumps(payload), now_s, now_s),
        )
        return int(cur.lastrowid or 0)

    def outbox_due(self, now_s: float, limit: int = 100, sink: str | None = None) -> list[OutboxItem]:
        """Deliveries whose ``next_attempt_s`` has come, oldest first."""
        sql = "SELECT * FROM outbox WHERE next_attempt_s <= ?"
        args: tuple[Any, ...] = (now_s,)
        if sink is not None:
            sql += " AND sink = ?"
            args += (sink,)
        sql += " ORDER BY id LIMIT ?"
        with self._lock:
            try:
                rows = self._db.execute(sql, (*args, limit)).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"event store read failed: {e}") from e
        return [OutboxItem(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7]) for r in rows]

    def outbox_retry(self, item_id: int, next_attempt_s: float, error: str) -> None:
        """Record a failed attempt; the item becomes due again at ``next_attempt_s``."""
        self._write(
            "UPDATE outbox SET attempts = attempts + 1, next_attempt_s = ?, last_error = ? WHERE id = ?",
            (next_attempt_s, error[:1000], item_id),
        )

    def outbox_done(self, item_id: int) -> None:
        self._write("DELETE FROM outbox WHERE id = ?", (item_id,))

    def outbox_size(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    # ------------------------------------------------------------------------------------ closing

    def close(self) -> None:
        """Close every connection (the writer's and all readers'). Buffered events are lost (logged)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._pending:
                log.warning("event store closing with %d unwritten events", len(self._pending))
            for db in self._readers:
                db.close()
            self._readers.clear()
            self._db.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
