"""PyTorch flight-recorder dumps, parsed safely and compared across ranks (pure).

A rank started with ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (or ``TORCH_FR_BUFFER_SIZE``) > 0 keeps its last
collectives in a ring; written through the debug-info pipe (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``) or on
a timeout into the dump directory, the dump is a pickle (or JSON) of a plain dict: ``version``,
``pg_config``, ``entries`` - each with ``pg_id`` (or ``process_group``), ``collective_seq_id``,
``profiling_name`` (``nccl:all_reduce``), ``state`` (``scheduled``, ``started``, ``completed``)...

**A dump file is hostile input**: it is read with a restricted unpickler that builds only plain
containers and scalars (any class or callable in the stream is refused, so a crafted file cannot run
code), and refused above ``MAX_DUMP_BYTES``.

:func:`compare` finds, per process group, the **first collective sequence number where the ranks
disagree** - a rank that never launched it (it is behind: the one the others wait for) or launched
another op under the same number (a mismatched collective) - and the ranks without a dump.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_DUMP_BYTES = 64 << 20
MAX_ENTRIES = 100_000


class FlightRecorderError(ValueError):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, bytes, numbers, booleans and None; nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: a flight-recorder dump holds plain data only")


def load_dump(data: bytes) -> dict[str, Any]:
    """A dump's bytes -> its dict. Raises :class:`FlightRecorderError` saying why not."""
    if len(data) > MAX_DUMP_BYTES:
        raise FlightRecorderError(f"dump is {len(data)} bytes, more than the {MAX_DUMP_BYTES} accepted")
    stripped = data.lstrip()
    try:
        doc = json.loads(stripped) if stripped[:1] == b"{" else _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, UnicodeDecodeError, TypeError) as e:
        raise FlightRecorderError(f"not a flight-recorder dump: {e}") from None
    except RecursionError:
        raise FlightRecorderError("not a flight-recorder dump: nested too deep") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries", []), list):
        raise FlightRecorderError("not a flight-recorder dump: expected a dict with an 'entries' list")
    return doc


@dataclass(frozen=True, slots=True)
class Entry:
    pg: str
    seq: int
    op: str
    state: str


def entries(doc: Mapping[str, Any]) -> list[Entry]:
    out = []
    for e in (doc.get("entries") or [])[:MAX_ENTRIES]:
        if not isinstance(e, Mapping) or e.get("is_p2p"):
            continue
        seq = e.get("collective_seq_id")
        if not isinstance(seq, int) or isinstance(seq, bool):
            continue
        pg = e.get("pg_id")
        if pg is None:
            group = e.get("process_group")
            pg = group[0] if isinstance(group, list | tuple) and group else group
        out.append(
            Entry(str(pg), seq, str(e.get("profiling_name") or "?")[:80], str(e.get("state") or "?")[:20])
        )
    return out


@dataclass(frozen=True, slots=True)
class Disagreement:
    pg: str
    seq: int
    """The first collective sequence number on which the ranks disagree."""
    ops: Mapping[int, str]
    """What each rank that has it launched under that number."""
    behind: tuple[int, ...]
    """Ranks that never launched it (the ones the others wait for)."""
    last_seq: Mapping[int, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "process_group": self.pg,
            "first_disagreeing_seq": self.seq,
            "ops": {str(r): op for r, op in sorted(self.ops.items())},
            "ranks_behind": list(self.behind),
            "last_seq": {str(r): s for r, s in sorted(self.last_seq.items())},
        }


def compare(dumps: Mapping[int, Iterable[Entry]], world: Iterable[int] = ()) -> dict[str, Any]:
    """Per process group, the first sequence number where the ranks' dumps disagree."""
    by_pg: dict[str, dict[int, dict[int, str]]] = {}
    for rank, es in dumps.items():
        for e in es:
            by_pg.setdefault(e.pg, {}).setdefault(rank, {})[e.seq] = e.op
    found: list[Disagreement] = []
    for pg, ranks in sorted(by_pg.items()):
        seqs = sorted({s for ops in ranks.values() for s in ops})
        lowest_last = {r: max(ops) for r, ops in ranks.items()}
        # a ring keeps the newest entries only: compare from where every rank still has records
        start = max(min(ops) for ops in ranks.values())
        for s in seqs:
            if s < start:
                continue
            have = {r: ops[s] for r, ops in ranks.items() if s in ops}
            if len(have) < len(ranks) or len(set(have.values())) > 1:
                behind = tuple(sorted(r for r in ranks if s not in ranks[r]))
                found.append(Disagreement(pg, s, have, behind, lowest_last))
                break
    present = set(dumps)
    return {
        "ranks_dumped": sorted(present),
        "ranks_without_dump": sorted(set(world) - present),
        "disagreements": [d.to_dict() for d in found],
    }


__all__ = ["Disagreement", "Entry", "FlightRecorderError", "compare", "entries", "load_dump"]
