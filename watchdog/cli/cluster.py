"""``gpu-watchdog cluster URL...``: several daemons' ``/status`` side by side.

The question it answers is the one operators ask when one GPU in a thousand stalls a multi-node job:
which node entered the spin band (``checkpoint_or_deadlock``) first, which rank's step lags, and what
each node's verdict is. It fetches ``GET /status`` from every daemon in parallel (short timeout),
then :func:`analyse` - pure: documents in, a :class:`ClusterView` out - compares them.

- A node entered the spin band at the earliest ``state_since`` among its GPUs that are in the band
  now; the node with the earliest such time entered first. Times are the nodes' own clocks, so the
  order across nodes assumes synchronised clocks (NTP); a node whose clock differs from this host's
  by more than :data:`CLOCK_SKEW_WARN_S` is flagged.
- For each training job, the ranks reported by every node are pooled: the slowest rank(s) (minimum
  optimizer step) are named with their node when they are behind the furthest one. Phases are
  pooled too: a minority phase (one rank in ``epoch_end`` while the others ``train``) is the
  epoch-end deadlock's signature.

Exit codes (contract): 0 ok; 1 a deadlock verdict (``deadlock_suspected`` or ``deadlock_confirmed``)
on any node; 2 any daemon unreachable or answering something that is not a ``/status`` document
(named by URL). The highest applicable code wins.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import httpx

from gpu_triage.model.jsonable import finite_number

EXIT_OK, EXIT_DEADLOCK, EXIT_UNREACHABLE = 0, 1, 2
DEFAULT_PORT = 9410
DEFAULT_TIMEOUT_S = 2.0
SPIN_STATE = "checkpoint_or_deadlock"
DEADLOCK_VERDICTS = frozenset({"deadlock_suspected", "deadlock_confirmed"})
#: Above this difference between a node's clock and ours (seconds, beyond one period), say that the
#: spin-band order across nodes may be wrong.
CLOCK_SKEW_WARN_S = 5.0
MAX_ERROR_DETAIL_CHARS = 200


# --------------------------------------------------------------------------------------------------
# Fetching


class BadStatus(ValueError):
    """A document that is not a ``/status`` answer; ``str()`` names the offending field."""


def base_url(url: str) -> str:
    """``node-a`` -> ``http://node-a:9410``; ``http://node-a:9410/status`` -> ``http://node-a:9410``.

    A bare host (no scheme) gets the daemon's default port; a URL with a scheme is taken as given."""
    text = url.strip()
    if not text:
        raise ValueError("empty URL")
    has_scheme = "://" in text
    parts = urlsplit(text if has_scheme else "http://" + text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    netloc = parts.netloc
    if not has_scheme and parts.port is None:
        netloc = f"{netloc}:{DEFAULT_PORT}"
    path = parts.path.rstrip("/").removesuffix("/status")
    return urlunsplit((parts.scheme, netloc, path, "", ""))


def _number_or_none(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadStatus(f"{where} is not a number: {value!r}")
    return float(value)


def validate_status(document: Any) -> dict[str, Any]:
    """Check the fields this tool reads (extra fields are welcome: newer daemons may add some)."""
    if not isinstance(document, dict):
        raise BadStatus(f"expected a JSON object, got {type(document).__name__}")
    for name in ("node", "gpus", "jobs"):
        if name not in document:
            raise BadStatus(f"missing field {name!r}")
    if not isinstance(document["node"], str):
        raise BadStatus("'node' is not a string")
    _number_or_none(document.get("time"), "'time'")
    if not isinstance(document["gpus"], list):
        raise BadStatus("'gpus' is not a list")
    for i, gpu in enumerate(document["gpus"]):
        if (
            not isinstance(gpu, dict)
            or not isinstance(gpu.get("gpu"), int)
            or not isinstance(gpu.get("state"), str)
        ):
            raise BadStatus(f"gpus[{i}] needs an integer 'gpu' and a string 'state'")
        _number_or_none(gpu.get("state_since"), f"gpus[{i}].state_since")
        _number_or_none(gpu.get("power_w"), f"gpus[{i}].power_w")
    if not isinstance(document["jobs"], list):
        raise BadStatus("'jobs' is not a list")
    for i, job in enumerate(document["jobs"]):
        if (
            not isinstance(job, dict)
            or not isinstance(job.get("job"), str)
            or not isinstance(job.get("verdict"), str)
        ):
            raise BadStatus(f"jobs[{i}] needs a string 'job' and a string 'verdict'")
        ranks = job.get("ranks", [])
        if not isinstance(ranks, list):
            raise BadStatus(f"jobs[{i}].ranks is not a list")
        for j, rank in enumerate(ranks):
            if not isinstance(rank, dict) or not isinstance(rank.get("rank"), int):
                raise BadStatus(f"jobs[{i}].ranks[{j}] needs an integer 'rank'")
            step = rank.get("step")
            if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
                raise BadStatus(f"jobs[{i}].ranks[{j}].step is not an integer: {step!r}")
    return document


@dataclass(frozen=True)
class Fetched:
    """One daemon's answer: its ``/status`` document, or why there is none."""

    url: str
    status: dict[str, Any] | None
    error: str | None
    received_at: float
    """This host's clock when the answer (or the failure) arrived."""


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = str(detail) if detail is not None else response.text
    text = " ".join(text.split())
    return text[:MAX_ERROR_DETAIL_CHARS] + ("..." if len(text) > MAX_ERROR_DETAIL_CHARS else "")


def fetch_status(
    client: httpx.Client, url: str, *, timeout_s: float, clock: Callable[[], float] = time.time
) -> Fetched:
    """``GET {url}/status``; never raises: every failure is a :class:`Fetched` with ``error`` set."""
    try:
        base = base_url(url)
    except ValueError as bad_url:
        return Fetched(url, None, f"bad URL: {bad_url}", clock())
    error: str
    try:
        response = client.get(base + "/status", headers={"Accept": "application/json"})
    except httpx.TimeoutException:
        error = f"no answer within {timeout_s:g} s"
    except httpx.ConnectError as failure:
        error = f"cannot connect ({failure})"
    except (httpx.HTTPError, httpx.InvalidURL) as failure:
        error = f"{type(failure).__name__}: {failure}"
    else:
        received_at = clock()
        if response.status_code != 200:
            detail = _detail(response)
            return Fetched(
                base, None, f"HTTP {response.status_code}{': ' + detail if detail else ''}", received_at
            )
        try:
            document = response.json()
        except ValueError:
            return Fetched(base, None, "answer is not JSON", received_at)
        try:
            return Fetched(base, validate_status(document), None, received_at)
        except BadStatus as bad:
            return Fetched(base, None, f"not a /status document: {bad}", received_at)
    return Fetched(base, None, error, clock())


def fetch_all(
    urls: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, clock: Callable[[], float] = time.time
) -> list[Fetched]:
    """Fetch every daemon's ``/status`` in parallel; results in the order of ``urls``."""
    if not urls:
        return []
    with (
        httpx.Client(timeout=httpx.Timeout(timeout_s), follow_redirects=False) as client,
        ThreadPoolExecutor(max_workers=min(32, len(urls)), thread_name_prefix="cluster-fetch") as pool,
    ):
        return list(pool.map(lambda url: fetch_status(client, url, timeout_s=timeout_s, clock=clock), urls))


# --------------------------------------------------------------------------------------------------
# Analysis (pure)


@dataclass(frozen=True)
class JobOnNode:
    job: str
    verdict: str
    onset: float | None
    raised: float | None
    ranks: int


@dataclass(frozen=True)
class NodeView:
    url: str
    label: str
    """The node's name, made unique with its URL when two daemons report the same name."""
    node: str | None
    error: str | None = None
    source: str | None = None
    mode: str | None = None
    armed: bool | None = None
    cycle: int | None = None
    time: float | None = None
    version: str | None = None
    gpu_states: dict[str, int] = field(default_factory=dict)
    gpus: int = 0
    spin_gpus: tuple[int, ...] = ()
    spin_since: float | None = None
    """When the node entered the spin band: earliest state_since of its GPUs in the band now."""
    spin_first_gpu: int | None = None
    """The GPU with that earliest state_since."""
    jobs: tuple[JobOnNode, ...] = ()
    clock_offset_s: float | None = None
    """The node's cycle time minus this host's time at reception (negative: up to a period old)."""

    @property
    def reachable(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class RankAt:
    rank: int
    step: int | None
    phase: str | None
    node: str
    url: str


@dataclass(frozen=True)
class ClusterJob:
    job: str
    verdicts: dict[str, str]
    """Node label -> verdict."""
    ranks: int
    min_step: int | None
    max_step: int | None
    lagging: tuple[RankAt, ...]
    """Ranks at the minimum step, when it is below the maximum."""
    leading: RankAt | None
    """One rank at the maximum step."""
    phases: dict[str, tuple[int, ...]]
    """Phase -> ranks in it, across every node."""
    duplicate_ranks: tuple[int, ...] = ()

    @property
    def lag_steps(self) -> int | None:
        if self.min_step is None or self.max_step is None:
            return None
        return self.max_step - self.min_step


@dataclass(frozen=True)
class SpinEntry:
    label: str
    url: str
    since: float | None
    first_gpu: int | None
    gpus: tuple[int, ...]
    after_first_s: float | None


@dataclass(frozen=True)
class ClusterView:
    time: float
    nodes: tuple[NodeView, ...]
    spin_order: tuple[SpinEntry, ...]
    jobs: tuple[ClusterJob, ...]
    warnings: tuple[str, ...] = ()

    @property
    def unreachable(self) -> tuple[NodeView, ...]:
        return tuple(node for node in self.nodes if not node.reachable)

    @property
    def first_in_spin_band(self) -> SpinEntry | None:
        timed = [entry for entry in self.spin_order if entry.since is not None]
        return timed[0] if timed else None

    @property
    def deadlock(self) -> bool:
        return any(job.verdict in DEADLOCK_VERDICTS for node in self.nodes for job in node.jobs)

    @property
    def exit_code(self) -> int:
        if self.unreachable:
            return EXIT_UNREACHABLE
        return EXIT_DEADLOCK if self.deadlock else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        first = self.first_in_spin_band
        return {
            "time": self.time,
            "exit_code": self.exit_code,
            "deadlock": self.deadlock,
            "nodes": [_node_json(node) for node in self.nodes],
            "first_in_spin_band": _spin_json(first) if first else None,
            "spin_order": [_spin_json(entry) for entry in self.spin_order],
            "jobs": [_job_json(job) for job in self.jobs],
            "unreachable": [{"url": node.url, "error": node.error} for node in self.unreachable],
            "warnings": list(self.warnings),
        }


def _node_json(node: NodeView) -> dict[str, Any]:
    return {
        "url": node.url,
        "node": node.node,
        "label": node.label,
        "reachable": node.reachable,
        "error": node.error,
        "source": node.source,
        "mode": node.mode,
        "armed": node.armed,
        "cycle": node.cycle,
        "time": node.time,
        "version": node.version,
        "gpus": node.gpus,
        "gpu_states": dict(node.gpu_states),
        "spin_since": node.spin_since,
        "spin_first_gpu": node.spin_first_gpu,
        "spin_gpus": list(node.spin_gpus),
        "clock_offset_s": node.clock_offset_s,
        "jobs": [
            {"job": j.job, "verdict": j.verdict, "onset": j.onset, "raised": j.raised, "ranks": j.ranks}
            for j in node.jobs
        ],
    }


def _rank_json(rank: RankAt) -> dict[str, Any]:
    return {"rank": rank.rank, "step": rank.step, "phase": rank.phase, "node": rank.node, "url": rank.url}


def _spin_json(entry: SpinEntry) -> dict[str, Any]:
    return {
        "node": entry.label,
        "url": entry.url,
        "since": entry.since,
        "first_gpu": entry.first_gpu,
        "gpus": list(entry.gpus),
        "after_first_s": entry.after_first_s,
    }


def _job_json(job: ClusterJob) -> dict[str, Any]:
    return {
        "job": job.job,
        "verdicts": dict(job.verdicts),
        "ranks": job.ranks,
        "min_step": job.min_step,
        "max_step": job.max_step,
        "lag_steps": job.lag_steps,
        "lagging": [_rank_json(rank) for rank in job.lagging],
        "leading": _rank_json(job.leading) if job.leading else None,
        "phases": {phase: list(ranks) for phase, ranks in job.phases.items()},
        "duplicate_ranks": list(job.duplicate_ranks),
    }


def _labels(fetched: Sequence[Fetched]) -> list[str]:
    names = [f.status["node"] if f.status else f.url for f in fetched]
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return [
        name if counts[name] == 1 or f.status is None else f"{name}@{f.url}"
        for name, f in zip(names, fetched, strict=True)
    ]


def _node_view(fetched: Fetched, label: str) -> NodeView:
    status = fetched.status
    if status is None:
        return NodeView(url=fetched.url, label=label, node=None, error=fetched.error)
    states: dict[str, int] = {}
    spin: list[tuple[int, float | None]] = []
    for gpu in status["gpus"]:
        states[gpu["state"]] = states.get(gpu["state"], 0) + 1
        if gpu["state"] == SPIN_STATE:
            spin.append((gpu["gpu"], finite_number(gpu.get("state_since"))))
    timed = sorted((t, g) for g, t in spin if t is not None)
    node_time = finite_number(status.get("time"))
    jobs = tuple(
        JobOnNode(
            job=job["job"],
            verdict=job["verdict"],
            onset=finite_number(job.get("onset")),
            raised=finite_number(job.get("raised")),
            ranks=len(job.get("ranks", [])),
        )
        for job in status["jobs"]
    )
    return NodeView(
        url=fetched.url,
        label=label,
        node=status["node"],
        source=status.get("source"),
        mode=status.get("mode"),
        armed=status.get("armed"),
        cycle=status.get("cycle"),
        time=node_time,
        version=status.get("version"),
        gpu_states=dict(sorted(states.items(), key=lambda item: (-item[1], item[0]))),
        gpus=len(status["gpus"]),
        spin_gpus=tuple(sorted(g for g, _t in spin)),
        spin_since=timed[0][0] if timed else None,
        spin_first_gpu=timed[0][1] if timed else None,
        jobs=jobs,
        clock_offset_s=None if node_time is None else node_time - fetched.received_at,
    )


def _job_views(fetched: Sequence[Fetched], labels: Sequence[str]) -> tuple[ClusterJob, ...]:
    verdicts: dict[str, dict[str, str]] = {}
    ranks: dict[str, list[RankAt]] = {}
    for f, label in zip(fetched, labels, strict=True):
        if f.status is None:
            continue
        for job in f.status["jobs"]:
            verdicts.setdefault(job["job"], {})[label] = job["verdict"]
            for rank in job.get("ranks", []):
                step = rank.get("step")
                phase = rank.get("phase")
                ranks.setdefault(job["job"], []).append(
                    RankAt(rank["rank"], step, phase if isinstance(phase, str) else None, label, f.url)
                )
    views = []
    for name in sorted(verdicts):
        pooled = sorted(ranks.get(name, []), key=lambda r: (r.rank, r.node))
        seen: dict[int, int] = {}
        for rank in pooled:
            seen[rank.rank] = seen.get(rank.rank, 0) + 1
        stepped = [r for r in pooled if r.step is not None]
        min_step = min((r.step for r in stepped if r.step is not None), default=None)
        max_step = max((r.step for r in stepped if r.step is not None), default=None)
        lagging: tuple[RankAt, ...] = ()
        leading = None
        if min_step is not None and max_step is not None:
            leading = next(r for r in stepped if r.step == max_step)
            if min_step < max_step:
                lagging = tuple(r for r in stepped if r.step == min_step)
        phases: dict[str, list[int]] = {}
        for rank in pooled:
            phases.setdefault(rank.phase or "unknown", []).append(rank.rank)
        views.append(
            ClusterJob(
                job=name,
                verdicts=verdicts[name],
                ranks=len(seen),
                min_step=min_step,
                max_step=max_step,
                lagging=lagging,
                leading=leading,
                phases={p: tuple(r) for p, r in sorted(phases.items(), key=lambda item: -len(item[1]))},
                duplicate_ranks=tuple(sorted(r for r, n in seen.items() if n > 1)),
            )
        )
    return tuple(views)


def analyse(fetched: Sequence[Fetched], now: float | None = None) -> ClusterView:
    """Compare the daemons' answers (pure: no I/O; ``now`` defaults to the latest reception time)."""
    labels = _labels(fetched)
    nodes = tuple(_node_view(f, label) for f, label in zip(fetched, labels, strict=True))
    in_band = [n for n in nodes if n.reachable and n.spin_gpus]
    in_band.sort(key=lambda n: (n.spin_since is None, n.spin_since if n.spin_since is not None else 0.0))
    first_since = in_band[0].spin_since if in_band else None
    spin_order = tuple(
        SpinEntry(
            label=n.label,
            url=n.url,
            since=n.spin_since,
            first_gpu=n.spin_first_gpu,
            gpus=n.spin_gpus,
            after_first_s=(
                n.spin_since - first_since if n.spin_since is not None and first_since is not None else None
            ),
        )
        for n in in_band
    )
    warnings = []
    for n in nodes:
        if n.clock_offset_s is not None and abs(n.clock_offset_s) > CLOCK_SKEW_WARN_S:
            direction = "ahead of" if n.clock_offset_s > 0 else "behind"
            warnings.append(
                f"{n.label}'s clock (or its last cycle) is {abs(n.clock_offset_s):.1f} s {direction} this "
                "host's: the spin-band order across nodes assumes synchronised clocks"
            )
    jobs = _job_views(fetched, labels)
    for job in jobs:
        if job.duplicate_ranks:
            warnings.append(
                f"job {job.job}: rank(s) {_ranks_text(job.duplicate_ranks)} reported by more than one daemon"
            )
    when = now if now is not None else max((f.received_at for f in fetched), default=time.time())
    return ClusterView(time=when, nodes=nodes, spin_order=spin_order, jobs=jobs, warnings=tuple(warnings))


# --------------------------------------------------------------------------------------------------
# Rendering


def utc(epoch: float | None, *, date: bool = True) -> str:
    if epoch is None:
        return "-"
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ" if date else "%H:%M:%SZ")


def duration(seconds: float | None) -> str:
    """``42.0 s``, ``3m05s``, ``2h04m``."""
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 60:
        return f"{sign}{s:.1f} s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, trailing blanks stripped."""
    body = [list(map(str, row)) for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in body)]) for i, h in enumerate(headers)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(headers), *body]
    ]
    return "\n".join(lines)


def _ranks_text(ranks: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def _gpus_text(gpus: Sequence[int]) -> str:
    if gpus and list(gpus) == list(range(gpus[0], gpus[0] + len(gpus))) and len(gpus) > 2:
        return f"GPUs {gpus[0]}-{gpus[-1]}"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(map(str, gpus))


def _mode_text(node: NodeView) -> str:
    if node.mode is None:
        return "-"
    return f"{node.mode} (armed)" if node.armed else node.mode


def render(view: ClusterView) -> str:
    first = view.first_in_spin_band
    reachable = [n for n in view.nodes if n.reachable]
    rows = []
    for node in view.nodes:
        if not node.reachable:
            rows.append([node.label, "-", "UNREACHABLE", "-", "-", "-", node.error or ""])
            continue
        states = ", ".join(f"{count} {state}" for state, count in node.gpu_states.items()) or "no GPUs"
        if node.spin_gpus and node.spin_since is not None:
            ago = duration(node.time - node.spin_since) if node.time is not None else "-"
            spin = f"{utc(node.spin_since, date=False)} ({ago})"
            if first is not None and node.label == first.label:
                spin += " FIRST"
            else:
                entry = next(e for e in view.spin_order if e.label == node.label)
                spin += f" +{duration(entry.after_first_s)}" if entry.after_first_s is not None else ""
        elif node.spin_gpus:
            spin = "time unknown"
        else:
            spin = "-"
        verdicts = ", ".join(f"{j.job}: {j.verdict}" for j in node.jobs) or "no jobs"
        rows.append(
            [node.label, node.source or "-", _mode_text(node), str(node.gpus), states, spin, verdicts]
        )
    out = [
        f"gpu-watchdog cluster: {len(reachable)} of {len(view.nodes)} daemons answered at {utc(view.time)}",
        "",
        table(["NODE", "SOURCE", "MODE", "GPUS", "GPU STATES", "IN SPIN BAND SINCE", "VERDICTS"], rows),
        "",
    ]
    if first is not None:
        later = [e for e in view.spin_order if e is not first]
        then = (
            "; then "
            + ", ".join(
                f"{e.label} +{duration(e.after_first_s)}"
                if e.after_first_s is not None
                else f"{e.label} (time unknown)"
                for e in later
            )
            if later
            else ""
        )
        out.append(
            f"Entered the spin band first: {first.label} at {utc(first.since)} (GPU {first.first_gpu} first; "
            f"{_gpus_text(first.gpus)} in the band now){then}."
        )
    elif view.spin_order:
        out.append("GPUs are in the spin band, but no daemon reports since when.")
    else:
        out.append("No GPU is in the spin band (checkpoint_or_deadlock).")
    for job in view.jobs:
        nodes = len(job.verdicts)
        head = f"Job {job.job} ({job.ranks} ranks on {nodes} node{'s' if nodes != 1 else ''})"
        if job.min_step is None or job.max_step is None:
            out.append(f"{head}: no rank reports a step.")
        elif not job.lagging:
            out.append(f"{head}: every rank at step {job.max_step}.")
        else:
            lagging = job.lagging
            who = ", ".join(f"rank {r.rank} on {r.node}" for r in lagging[:4])
            if len(lagging) > 4:
                who += f" and {len(lagging) - 4} more ranks"
            lead = job.leading
            assert lead is not None
            out.append(
                f"{head}: steps {job.min_step}..{job.max_step}; lagging: {who} at step {job.min_step}, "
                f"{job.lag_steps} behind rank {lead.rank} on {lead.node}."
            )
        if len(job.phases) > 1:
            minority = list(job.phases.items())[1:]
            parts = [f"{phase} {len(ranks)}" for phase, ranks in job.phases.items()]
            odd = "; ".join(f"{phase}: ranks {_ranks_text(ranks)}" for phase, ranks in minority)
            out.append(f"  phases disagree: {', '.join(parts)} ({odd})")
    out.extend(f"Warning: {warning}" for warning in view.warnings)
    return "\n".join(out)


def run(
    urls: Sequence[str],
    *,
    as_json: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Fetch, compare, print; return the exit code."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    view = analyse(fetch_all(urls, timeout_s=timeout_s))
    if as_json:
        json.dump(view.to_json(), out, indent=1, allow_nan=False)
        out.write("\n")
    else:
        out.write(render(view) + "\n")
    for node in view.unreachable:
        err.write(f"gpu-watchdog cluster: error: {node.url}: {node.error}\n")
    return view.exit_code
