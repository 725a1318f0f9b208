"""The daemon's side of the progress contract: read the trainers' progress files.

Layout, fields, phases and limits come from the contract module, :mod:`gpu_triage.contract` (which
also holds the writer the trainer and the integrations use). ``<dir>/<job>/rank-<rank>.json``.

The pure parts - parsing one file (:func:`parse_record`), its lease and staleness, the step tracker and
the per-rank and per-job values the detector reads - are :mod:`gpu_triage.signals.progress_model`.

This module is the I/O part: :class:`ProgressReader` scans the directory once per call, re-reads a
file only when its (mtime ns, size, inode) changed, and returns a :class:`ProgressView`. A bad file
becomes a per-file error entry, never an exception; symlinks and files over 64 KiB are refused (the
directory is writable by the training users' group and the daemon may run privileged).

Staleness (contract): a file whose ``pid`` is gone (checked only when ``host`` is this node), or whose
``time`` is more than ``stale_after_s`` (600 s) old without a live lease, is stale and ignored: it is
not in :attr:`JobProgress.ranks`. It is still listed in :attr:`JobProgress.stale` with its reason,
because a rank that is alive but silent for ten minutes is exactly what a long hang looks like and the
detector may want to keep its last word.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpu_triage.contract import MAX_FILE_BYTES, STALE_AFTER_S
from gpu_triage.model.clock import wall_to_timeline
from gpu_triage.model.config_checks import number, path_value
from gpu_triage.model.config_schema import setting
from gpu_triage.model.names import job_name_problem, printable
from gpu_triage.signals import procfs
from gpu_triage.signals.progress_model import (
    MAX_RANK,
    JobProgress,
    ProgressFormatError,
    ProgressRecord,
    RankProgress,
    StepTracker,
    lease_state,
    parse_record,
    stale_reason,
)

MAX_JOB_DIRS = 1024
MAX_FILES_PER_JOB = 4096
"""Entries scanned per progress directory / job directory per cycle; the rest is reported, not read."""
MAX_ROOT_ENTRIES = 65_536
"""Entries of the progress directory itself listed per cycle (each costs one ``lstat``)."""
MAX_JOB_DIRS_PER_OWNER = 64
MAX_ENTRIES_PER_OWNER = 4096
MAX_FILES_PER_OWNER = 1024
"""Per owner (uid) of the job directories, per cycle: job directories read, entries listed in them,
rank files considered. One user's files can never use up what another user's job needs: the caps are
per owner, and jobs that had live ranks (and jobs the daemon was told hold live proven ranks) are read
first, then the most recently changed."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProgressConfig:
    """``[progress]``: where the trainers' progress files are and when one is stale."""

    dir: Path = setting(Path("/run/gpu-watchdog/progress"), parse=path_value, doc="trainer progress files")
    stale_after_s: float = setting(600.0, parse=number(10, 86400), doc="silence after which a file is stale")


@dataclass(frozen=True, slots=True)
class FileError:
    path: Path
    error: str


@dataclass(frozen=True, slots=True)
class UntrustedFile:
    """A well-formed progress file that is not believed (never a verdict input, never a kill target)."""

    path: Path
    job: str
    rank: int
    pid: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "job": self.job,
            "rank": self.rank,
            "pid": self.pid,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ProgressView:
    time_s: float
    jobs: Mapping[str, JobProgress]
    """Jobs with at least one file (live or stale), by name."""
    errors: tuple[FileError, ...] = ()
    directory_present: bool = True
    untrusted: tuple[UntrustedFile, ...] = ()
    """Files refused because their owner is neither the job directory's owner nor root."""


# ------------------------------------------------------------------------------------------ reader


@dataclass(slots=True)
class _Cached:
    key: tuple[int, int, int]
    record: ProgressRecord | None
    error: str | None
    uid: int | None = None
    dir_uid: int | None = None
    raw: ProgressRecord | None = None
    """The record as written (wall-clock times); ``record`` holds them placed on the daemon's timeline."""
    record_uid: int | None = None
    """The owner of the file ``record`` was read from (kept when a tampered path keeps its record)."""
    dir_name: str = ""
    """Its job directory's name."""
    path: Path | None = None
    """The file's path, made once (the cache is keyed by the path's text, not hashed as a Path)."""


def _bounded(errors: list[FileError], limit: int = 64) -> list[FileError]:
    """At most ``limit`` error entries (a hostile directory may hold thousands), then one that counts
    the rest."""
    if len(errors) <= limit:
        return errors
    return [*errors[:limit], FileError(Path("..."), f"{len(errors) - limit} more errors not listed")]


_job_name_problem = functools.lru_cache(maxsize=MAX_JOB_DIRS)(job_name_problem)
""":func:`~gpu_triage.model.names.job_name_problem` of the job directories' names (pure; the same few
names every cycle, each checked character by character)."""


@functools.lru_cache(maxsize=MAX_FILES_PER_JOB)  # the same few names every cycle
def _rank_of(name: str) -> int | str | None:
    """The rank a ``rank-<n>.json`` name is for; None for other names (writers' temp files); a string
    (why) for a name that looks like a rank file but is not the canonical one: ``rank-00.json`` would
    alias rank 0, ``rank-٣.json`` is not ASCII, more than 7 digits is no rank."""
    if not (name.startswith("rank-") and name.endswith(".json")):
        return None
    digits = name[len("rank-") : -len(".json")]
    if not digits or not (digits.isascii() and digits.isdigit()):
        return None if not digits.isdigit() else "not an ASCII rank number"
    if len(digits) > 7 or int(digits) > MAX_RANK:
        return f"rank above {MAX_RANK}"
    if digits != str(int(digits)):
        return f"not the canonical name rank-{int(digits)}.json (a leading zero would alias that rank)"
    return int(digits)


class ProgressReader:
    """Scans the progress directory; cheap when nothing changed (a ``stat`` per file)."""

    def __init__(
        self,
        directory: Path,
        *,
        stale_after_s: float = STALE_AFTER_S,
        pid_exists: Callable[[int], bool] | None = None,
        host: str | None = None,
    ) -> None:
        """``pid_exists`` is consulted for files whose ``host`` is this node (``host``, default the
        host name); it is injectable for tests. None: a :class:`~gpu_triage.signals.procfs.PidCheck`
        (a pidfd kept per live pid: one system call a file a period)."""
        self.directory = Path(directory)
        self.stale_after_s = stale_after_s
        self._pid_check: procfs.PidCheck | None = None
        if pid_exists is None:
            self._pid_check = pid_exists = procfs.PidCheck()
        self._pid_exists = pid_exists
        self.host = socket.gethostname() if host is None else host
        self._cache: dict[str, _Cached] = {}
        """Each rank file's path (text) -> what was read from it, while its (mtime, size, ino) stay."""
        self.tracker = StepTracker()
        self.reads_total = 0
        """Files actually opened and parsed (not served from the cache)."""
        self._logged: set[tuple[str, str]] = set()
        self._live_dirs: set[str] = set()
        self.priority: frozenset[str] = frozenset()
        """Job directory names read first (the daemon sets: jobs with live proven ranks)."""
        self._now_s = self._wall_s = 0.0

    def read(self, now_s: float, *, wall_s: float | None = None) -> ProgressView:
        """Scan at ``now_s`` (the daemon's timeline, :mod:`gpu_triage.model.clock`); ``wall_s`` is the
        wall clock now: the records' epoch times are placed on the timeline once, when a file is
        (re)read, keeping their age (``now_s - (wall_s - t)``); a time a rewritten file repeats keeps
        its first placement, so a clock step between two writes moves no lease and no step time.
        None: the same as ``now_s``."""
        self._now_s, self._wall_s = now_s, (now_s if wall_s is None else wall_s)
        errors: list[FileError] = []
        try:
            job_dirs = self._job_dirs(errors)
        except FileNotFoundError:
            self._cache.clear()
            self.tracker.forget(())
            return ProgressView(now_s, {}, (), directory_present=False)
        except OSError as e:
            return ProgressView(now_s, {}, (FileError(self.directory, str(e)),))

        seen = self._scan(job_dirs, errors)
        self._cache = seen
        jobs: dict[str, tuple[dict[int, RankProgress], dict[int, RankProgress]]] = {}
        keep: list[tuple[str, int]] = []
        untrusted: list[UntrustedFile] = []
        live_dirs: set[str] = set()
        exists: dict[int, bool] = {}  # one /proc lookup per pid per cycle, however many files name it
        if self._pid_check is not None:
            self._pid_check.poll()  # one system call for every pid it holds (procfs.PidCheck)
        for _, cached in sorted(seen.items()):  # by path (each path once: no _Cached compared)
            path = cached.path
            assert path is not None  # set by _scan
            if cached.record is None:
                errors.append(FileError(path, cached.error or "unreadable"))
                continue
            if cached.error is not None:  # a record kept while its path was tampered with
                errors.append(FileError(path, cached.error))
            record = cached.record
            owner = cached.record_uid if cached.record_uid is not None else cached.uid
            if owner not in (None, 0, cached.dir_uid):
                # Job directories of old writers are group-writable: a file another user put there
                # never speaks for the directory owner's job (nor gets its processes signalled). It is
                # its owner's job, under a name of its own; a squatted directory (made by another user
                # before the job started) so never hides the job's own files.
                untrusted.append(
                    UntrustedFile(
                        path,
                        record.job,
                        record.rank,
                        record.pid,
                        f"owned by uid {owner}, its job directory by uid {cached.dir_uid}: "
                        f"read as job {record.job}@uid{owner}",
                    )
                )
                record = replace(record, job=f"{record.job}@uid{owner}")
            mark = self.tracker.observe(record)
            keep.append((record.job, record.rank))
            alive = None
            if record.host == self.host:
                alive = exists.get(record.pid)
                if alive is None:
                    alive = exists[record.pid] = self._pid_exists(record.pid)
            reason = stale_reason(record, now_s, pid_alive=alive, stale_after_s=self.stale_after_s)
            if reason is None:
                live_dirs.add(cached.dir_name)
            view = RankProgress(
                record,
                path,
                mark.since_s,
                lease_state(record, now_s),
                reason,
                phase_since_s=mark.phase_since_s,
                previous_phase=mark.previous_phase,
                owner_uid=owner,
            )
            pair = jobs.get(record.job)
            if pair is None:  # (not setdefault: its two dicts would be made for every file)
                pair = jobs[record.job] = ({}, {})
            pair[1 if reason else 0][record.rank] = view
        self.tracker.forget(keep)
        if self._pid_check is not None:
            self._pid_check.retain(exists)
        self._live_dirs = live_dirs
        errors = _bounded(errors)
        self._log_errors(errors)
        return ProgressView(
            now_s,
            {job: JobProgress(job, live, stale) for job, (live, stale) in sorted(jobs.items())},
            tuple(errors),
            untrusted=tuple(untrusted),
        )

    def _scan(
        self, job_dirs: list[tuple[os.DirEntry[str], int]], errors: list[FileError]
    ) -> dict[str, _Cached]:
        """Each job directory's rank files, (re)read where they changed, within the per-job and
        per-owner caps; what cannot be read becomes an error entry."""
        seen: dict[str, _Cached] = {}
        entries_used: dict[int, int] = {}
        files_used: dict[int, int] = {}
        for job_dir, dir_uid in job_dirs:
            try:
                entries: list[os.DirEntry[str]] = []
                budget = min(MAX_FILES_PER_JOB, MAX_ENTRIES_PER_OWNER - entries_used.get(dir_uid, 0))
                with os.scandir(job_dir.path) as it:
                    for entry in it:
                        if len(entries) >= budget:
                            errors.append(
                                FileError(
                                    Path(job_dir.path),
                                    f"more than {budget} entries (per job directory and per owner), "
                                    "the rest not read",
                                )
                            )
                            break
                        entries.append(entry)
                entries_used[dir_uid] = entries_used.get(dir_uid, 0) + len(entries)
            except OSError as e:
                errors.append(FileError(Path(job_dir.path), str(e)))
                continue
            for entry in entries:
                rank = _rank_of(entry.name)
                if rank is None:
                    continue  # temp files of writers, anything else
                if isinstance(rank, str):
                    errors.append(FileError(Path(entry.path), rank))
                    continue
                used = files_used.get(dir_uid, 0)
                if used >= MAX_FILES_PER_OWNER:
                    errors.append(
                        FileError(
                            Path(entry.path),
                            f"more than {MAX_FILES_PER_OWNER} rank files of uid {dir_uid}, not read",
                        )
                    )
                    break
                files_used[dir_uid] = used + 1
                old = self._cache.get(entry.path)
                try:
                    cached = self._load(old, entry, job_dir.name, rank, dir_uid)
                except Exception as e:  # one file never blinds the others (bug or hostile bytes)
                    cached = _Cached((0, 0, 0), None, f"unreadable: {type(e).__name__}: {e}"[:300])
                if cached.path is None:
                    cached.path = old.path if old is not None and old.path is not None else Path(entry.path)
                cached.dir_uid, cached.dir_name = dir_uid, job_dir.name
                seen[entry.path] = cached
        return seen

    def _job_dirs(self, errors: list[FileError]) -> list[tuple[os.DirEntry[str], int]]:
        """The job directories to read this cycle, with their owners: valid names only, at most
        :data:`MAX_JOB_DIRS_PER_OWNER` per owner and :data:`MAX_JOB_DIRS` in all; jobs with live ranks
        (last cycle, or named in :attr:`priority`) first, then the most recently changed."""
        found: list[tuple[int, float, str, os.DirEntry[str], int]] = []
        listed = 0
        bad = 0
        with os.scandir(self.directory) as it:
            for entry in it:
                listed += 1
                if listed > MAX_ROOT_ENTRIES:
                    errors.append(
                        FileError(self.directory, f"more than {MAX_ROOT_ENTRIES} entries, the rest not read")
                    )
                    break
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                problem = _job_name_problem(entry.name)
                if problem is not None:
                    bad += 1
                    errors.append(FileError(Path(entry.path), f"not a job directory: {problem}"))
                    continue
                first = 0 if entry.name in self.priority or entry.name in self._live_dirs else 1
                found.append((first, -st.st_ctime, entry.name, entry, st.st_uid))
        found.sort(key=lambda f: f[:3])
        per_owner: dict[int, int] = {}
        out: list[tuple[os.DirEntry[str], int]] = []
        skipped: dict[int, int] = {}
        for _, _, _, entry, uid in found:
            if per_owner.get(uid, 0) >= MAX_JOB_DIRS_PER_OWNER or len(out) >= MAX_JOB_DIRS:
                skipped[uid] = skipped.get(uid, 0) + 1
                continue
            per_owner[uid] = per_owner.get(uid, 0) + 1
            out.append((entry, uid))
        for uid, count in sorted(skipped.items()):
            errors.append(
                FileError(
                    self.directory,
                    f"{count} job directories of uid {uid} not read this cycle (at most "
                    f"{MAX_JOB_DIRS_PER_OWNER} per owner, {MAX_JOB_DIRS} in all)",
                )
            )
        return out

    def _log_errors(self, errors: list[FileError]) -> None:
        """A warning once per (file, error) while it lasts: a bad file is logged when it turns bad (or
        changes its error), not every cycle; a fixed file may be logged again if it breaks again."""
        current = {(str(e.path), e.error) for e in errors}
        for path, error in sorted(current - self._logged):
            log.warning("progress file %s ignored: %s", printable(path), printable(error))
        self._logged = current

    def _load(
        self, cached: _Cached | None, entry: os.DirEntry[str], job: str, rank: int, dir_uid: int
    ) -> _Cached:
        """What ``entry`` holds now: ``cached`` (what was read from its path last time) while its
        (mtime, size, inode) and owner stay, else read again."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as e:
            return _Cached((0, 0, 0), None, str(e))
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if cached is not None and cached.key == key and cached.uid == st.st_uid:
            return cached
        if (
            cached is not None
            and cached.record is not None
            and st.st_uid != 0
            and (
                not stat.S_ISREG(st.st_mode)  # a directory is never a rank file's next version
                or (cached.record_uid in (0, dir_uid) and st.st_uid not in (0, dir_uid))
            )
        ):
            # The job's own rank file was replaced by another user's entry (a directory, a file): the
            # job keeps its last word (a rank frozen since then is still seen frozen), reported.
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "an entry"
            return _Cached(
                cached.key,
                cached.record,
                f"replaced by {kind} of uid {st.st_uid}; the job's last record is kept",
                uid=cached.uid,
                record_uid=cached.record_uid,
                raw=cached.raw,
            )
        loaded = self._parse(entry.path, st, key, job, rank)
        loaded.uid = st.st_uid
        loaded.record_uid = st.st_uid if loaded.record is not None else None
        if loaded.record is not None:
            loaded.raw = loaded.record
            loaded.record = self._place(loaded.record, cached)
        return loaded

    def _place(self, record: ProgressRecord, previous: _Cached | None) -> ProgressRecord:
        """The record's wall-clock times on the timeline (see :meth:`read`)."""
        now_s, wall_s = self._now_s, self._wall_s
        if now_s == wall_s:
            return record
        before = previous if previous is not None and previous.raw is not None else None

        def placed(name: str) -> float | None:
            raw = getattr(record, name)
            if raw is None:
                return None
            if before is not None and before.record is not None and getattr(before.raw, name) == raw:
                return getattr(before.record, name)
            return wall_to_timeline(raw, now_s=now_s, wall_now_s=wall_s)

        written = wall_to_timeline(record.time, now_s=now_s, wall_now_s=wall_s)
        step_time, phase_time = placed("step_time"), placed("phase_time")
        return replace(
            record,
            time=written,
            lease_until=placed("lease_until"),
            step_time=None if step_time is None else min(step_time, written),
            phase_time=None if phase_time is None else min(phase_time, written),
        )

    def _parse(
        self, path: str | Path, st: os.stat_result, key: tuple[int, int, int], job: str, rank: int
    ) -> _Cached:
        if not stat.S_ISREG(st.st_mode):
            return _Cached(key, None, "not a regular file (symlinks are refused)")
        if st.st_size > MAX_FILE_BYTES:
            return _Cached(key, None, f"{st.st_size} bytes, more than {MAX_FILE_BYTES}")
        self.reads_total += 1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                data = os.read(fd, MAX_FILE_BYTES + 1)
            finally:
                os.close(fd)
            record = parse_record(data)
        except ProgressFormatError as e:
            return _Cached(key, None, str(e))
        except OSError as e:
            return _Cached(key, None, str(e))
        if record.job != job or record.rank != rank:
            return _Cached(key, None, f"holds job {record.job!r} rank {record.rank}, not its path's")
        return _Cached(key, record, None)
