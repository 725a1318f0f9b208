"""``[cluster]``: other nodes' facts about a job, from the Prometheus that scrapes every daemon."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.model.config_checks import choice, integer, number, optional_http_url
from gpu_triage.model.config_schema import setting


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Other nodes' facts about a job from the Prometheus that scrapes every daemon (docs/cluster.md)."""

    prometheus_url: str | None = setting(
        None, parse=optional_http_url, doc="Prometheus (or Thanos/Mimir) query API; empty: per-node only"
    )
    min_interval_s: float = setting(
        5.0, parse=number(1, 3600), doc="at most one query per suspicious job this often"
    )
    timeout_s: float = setting(3.0, parse=number(0.1, 60), doc="limit of one query")
    max_response_bytes: int = setting(
        32 << 20, parse=integer(1024, 1 << 30), doc="an answer larger than this is refused"
    )
    stale_after_s: float = setting(
        15.0, parse=number(1, 3600), doc="another node's facts older than this are unknown"
    )
    job_rules: str = setting(
        "auto",
        parse=choice("auto", "on", "off"),
        doc="read each job's aggregates from the gpu-watchdog-job recording rules (the answer's size "
        "independent of the job's); auto: the raw facts where the rules do not run",
    )
    node_lost_after_s: float = setting(
        60.0,
        parse=number(5, 3600),
        doc="a node of the job silent this long (target down or facts stale), every rank here frozen in a "
        "collective: the job is kill-worthy, cause 'node <name> lost'",
    )


__all__ = ["ClusterConfig"]
