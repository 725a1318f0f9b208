"""The low, generic part of the configuration: :class:`~gpu_triage.config.secrets.ConfigError` and
:func:`~gpu_triage.config.secrets.load_secret`. Each section's dataclass lives beside its component; the
aggregate ``Config`` and the loader are :mod:`gpu_triage.daemon.config`."""
