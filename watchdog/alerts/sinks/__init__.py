"""One module per receiver kind, each a :class:`~gpu_triage.alerts.sinks.protocol.SinkKind`."""
