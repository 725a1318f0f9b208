"""NCCL RAS reports as live evidence (pure): launched-operation counts frozen between polls, and the
missing ranks named with their host and GPU.

NCCL's RAS service (NCCL >= 2.24, ``localhost:28028``; the JSON form from 2.28.7) reports, per
communicator, every rank's launched-collective counts and the ranks that did not answer. Two polls
``min_interval_s`` apart whose counts are identical for a communicator say that no collective was
launched in between - every rank is stuck (or idle); a rank listed in ``missing_ranks``, or one whose
counts are behind the others', is the one an asymmetric hang waits for. Reports are joined to jobs
by the ranks' pids (the JSON form lists ``pid`` per rank). The text form (older NCCL) carries no
counts: only its communicator statuses (``MISMATCH``, ``INCOMPLETE``) are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_COMMUNICATORS = 256
MAX_RANKS = 4096


@dataclass(frozen=True, slots=True)
class RasRank:
    communicator: str
    rank: int | None
    host: str | None
    pid: int | None
    gpu: int | None
    counts: tuple[tuple[str, int], ...] = ()

    def name(self) -> str:
        where = f" on {self.host}" if self.host else ""
        gpu = f" GPU {self.gpu}" if self.gpu is not None else ""
        pid = f" pid {self.pid}" if self.pid is not None else ""
        return f"rank {self.rank}{where}{gpu}{pid}"


@dataclass(frozen=True, slots=True)
class RasPoll:
    """One report, parsed."""

    at: float
    status: str
    """``ok``, ``absent``, ``timeout``, ``error`` (the client's)."""
    ranks: tuple[RasRank, ...] = ()
    missing: tuple[RasRank, ...] = ()
    statuses: tuple[str, ...] = ()
    """Communicator statuses of the text form (``RUNNING``, ``MISMATCH``, ``INCOMPLETE``...)."""
    error: str | None = None

    def counts(self) -> dict[tuple[str, int | None], tuple[tuple[str, int], ...]]:
        return {(r.communicator, r.rank): r.counts for r in self.ranks}

    def pids(self) -> set[int]:
        return {r.pid for r in (*self.ranks, *self.missing) if r.pid is not None}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _ranks(comm: Mapping[str, Any], key: str, hash_: str) -> list[RasRank]:
    out = []
    for r in (comm.get(key) or [])[:MAX_RANKS]:
        if not isinstance(r, Mapping):
            continue
        counts = r.get("collective_counts") or {}
        pairs = (
            tuple(sorted((str(k), v) for k, v in counts.items() if _int(v) is not None))
            if isinstance(counts, Mapping)
            else ()
        )
        gpu = _int(r.get("cuda_dev"))
        out.append(
            RasRank(hash_, _int(r.get("rank")), str(r["host"])[:200] if r.get("host") else None,
                    _int(r.get("pid")), gpu if gpu is not None else _int(r.get("nvml_dev")), pairs)
        )  # fmt: skip
    return out


def parse_report(at: float, status: str, data: Any = None, summary: Mapping[str, Any] | None = None,
                 error: str | None = None) -> RasPoll:  # fmt: skip
    """A :class:`~gpu_triage.signals.nccl_ras.client.RasReport`'s parts -> :class:`RasPoll` (never raises)."""
    if status != "ok":
        return RasPoll(at, status, error=error)
    if isinstance(data, Mapping):
        ranks: list[RasRank] = []
        missing: list[RasRank] = []
        comms = data.get("communicators")
        for comm in (comms if isinstance(comms, list) else [])[:MAX_COMMUNICATORS]:
            if not isinstance(comm, Mapping):
                continue
            h = str(comm.get("hash") or "?")[:64]
            ranks += _ranks(comm, "ranks", h)
            missing += _ranks(comm, "missing_ranks", h)
        return RasPoll(at, "ok", tuple(ranks), tuple(missing))
    statuses = tuple(sorted((summary or {}).get("statuses", {}) or {}))
    return RasPoll(at, "ok", statuses=statuses)


@dataclass(frozen=True, slots=True)
class RasFacts:
    """What the polls say about one job (its ranks matched by pid)."""

    poll: RasPoll
    counts_frozen_since: float | None
    """When the first poll with the current counts was taken (None: counts moved, or unknown)."""
    missing: tuple[RasRank, ...]
    behind: tuple[RasRank, ...]
    """Ranks whose counts are below the others' in a communicator."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.poll.status,
            "polled_at": self.poll.at,
            "counts_frozen_since": self.counts_frozen_since,
            "missing_ranks": [r.name() for r in self.missing],
            "ranks_behind": [r.name() for r in self.behind],
            "statuses": list(self.poll.statuses),
            "error": self.poll.error,
        }


def _behind(ranks: Iterable[RasRank]) -> list[RasRank]:
    by_comm: dict[str, list[RasRank]] = {}
    for r in ranks:
        by_comm.setdefault(r.communicator, []).append(r)
    out = []
    for rs in by_comm.values():
        totals = {id(r): sum(n for _, n in r.counts) for r in rs}
        top = max(totals.values(), default=0)
        out += [r for r in rs if totals[id(r)] < top]
    return out


def ras_facts(first_same: RasPoll | None, latest: RasPoll | None, pids: set[int]) -> RasFacts | None:
    """``first_same``: the earliest poll whose counts equal ``latest``'s (the poller keeps it)."""
    if latest is None:
        return None
    if latest.status != "ok":
        return RasFacts(latest, None, (), ())
    mine = [r for r in latest.ranks if r.pid in pids]
    comms = {r.communicator for r in mine}
    if not mine:
        return None
    ranks = [r for r in latest.ranks if r.communicator in comms]
    frozen = None
    if first_same is not None and first_same.at < latest.at and any(r.counts for r in ranks):
        frozen = first_same.at
    return RasFacts(
        latest,
        frozen,
        tuple(r for r in latest.missing if r.communicator in comms),
        tuple(_behind(ranks)),
    )


__all__ = ["RasFacts", "RasPoll", "RasRank", "parse_report", "ras_facts"]
