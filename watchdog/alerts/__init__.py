"""Alerts: what an alert holds (``model``) and how each receiver wants it (``sinks``, by name)."""
