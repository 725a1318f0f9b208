"""One job, many nodes: each node's facts as metrics, the other nodes' facts read back from
Prometheus, and the pure rule that lets them complete or veto this node's own evidence
(docs/cluster.md).

- :mod:`~gpu_triage.signals.fleet.facts`: a node's facts about a job's ranks (typed values);
- :mod:`~gpu_triage.signals.fleet.exposition`: those facts as ``gpu_watchdog_fleet_*`` series;
- :mod:`~gpu_triage.signals.fleet.prom_client`: a bounded client for Prometheus's query API;
- :mod:`~gpu_triage.signals.fleet.remote`: a query's answer as the other nodes' facts;
- :mod:`~gpu_triage.signals.fleet.summary`: the recording rules' aggregates of one job (linear at scale);
- :mod:`~gpu_triage.signals.fleet.fusion`: the rule (pure);
- :mod:`~gpu_triage.signals.fleet.poller`: the daemon's background reader (off the cycle thread).

``gpu-watchdog cluster --prometheus`` (:mod:`gpu_triage.cli.cluster_prometheus`) reads the same facts.
"""
