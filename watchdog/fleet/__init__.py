"""One job, many nodes: each node's facts as metrics, the other nodes' facts read back from
Prometheus, and the pure rule that lets them complete or veto this node's own evidence
(docs/cluster.md).

- :mod:`~gpu_triage.fleet.facts`: a node's facts about a job's ranks (typed values);
- :mod:`~gpu_triage.fleet.exposition`: those facts as ``gpu_watchdog_fleet_*`` series;
- :mod:`~gpu_triage.fleet.prom_client`: a bounded client for Prometheus's query API;
- :mod:`~gpu_triage.fleet.remote`: a query's answer as the other nodes' facts;
- :mod:`~gpu_triage.fleet.fusion`: the rule (pure);
- :mod:`~gpu_triage.fleet.poller`: the daemon's background reader (off the cycle thread).
"""
