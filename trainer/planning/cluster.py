"""World size, hostfile and launcher agreement. Pure checks plus a tolerant hostfile parser.

A hostfile is DeepSpeed's format: one host per line, ``hostname slots=N``; ``#`` starts a comment; blank
lines are ignored. ``torchrun`` takes no hostfile, but when one is given it is checked the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Host", "HostfileError", "check_cluster", "parse_hostfile"]

_LINE = re.compile(r"^(?P<host>[^\s#]+)(?:\s+slots\s*=\s*(?P<slots>\d+))?\s*$")


class HostfileError(ValueError):
    """A malformed hostfile line: ``file:line: ...``."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: int
    line: int


def parse_hostfile(text: str, name: str = "hostfile") -> list[Host]:
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise HostfileError(f"{name}:{i}: expected 'hostname slots=N', got {raw.strip()!r}")
        if m["slots"] is None:
            raise HostfileError(f"{name}:{i}: {m['host']} has no slots=N (GPUs on that host)")
        if m["host"] in seen:
            raise HostfileError(f"{name}:{i}: {m['host']} listed twice (first on line {seen[m['host']]})")
        seen[m["host"]] = i
        hosts.append(Host(m["host"], int(m["slots"]), i))
    return hosts


def check_cluster(
    *,
    world_size: int,
    nodes: int,
    gpus_per_node: int,
    launcher: str,
    hosts: list[Host] | None,
    hostfile_name: str = "hostfile",
) -> list[str]:
    """Every disagreement between world size, nodes x GPUs per node, the hostfile and the launcher."""
    problems: list[str] = []
    if world_size != nodes * gpus_per_node:
        problems.append(
            f"world_size {world_size} != nodes {nodes} x gpus_per_node {gpus_per_node} = "
            f"{nodes * gpus_per_node}: "
            "fix cluster.world_size (or drop it: it defaults to nodes x gpus_per_node)"
        )
    if launcher == "local" and nodes != 1:
        problems.append(
            f"launcher 'local' runs on one node, but nodes = {nodes}: use 'deepspeed' or 'torchrun'"
        )
    if launcher == "deepspeed" and nodes > 1 and hosts is None:
        problems.append(
            f"launcher 'deepspeed' on {nodes} nodes needs cluster.hostfile (one 'host slots=N' per node)"
        )
    if hosts is not None:
        slots = sum(h.slots for h in hosts)
        if len(hosts) != nodes:
            problems.append(f"{hostfile_name} lists {len(hosts)} host(s), cluster.nodes = {nodes}")
        odd = [h for h in hosts if h.slots != gpus_per_node]
        if odd:
            problems.append(
                f"{hostfile_name}: "
                + ", ".join(f"{h.name} (line {h.line}) has slots={h.slots}" for h in odd)
                + f", cluster.gpus_per_node = {gpus_per_node}"
            )
        if slots != world_size:
            problems.append(
                f"{hostfile_name} has {slots} slots in all, world_size = {world_size}: the launcher "
                f"would start {slots} ranks for a plan of {world_size}"
            )
    return problems


def load_hosts(path: Path | None) -> list[Host] | None:
    if path is None:
        return None
    return parse_hostfile(Path(path).read_text(encoding="utf-8"), str(path))
