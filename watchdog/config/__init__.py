"""Not the configuration: only what every section needs from below -
:class:`~gpu_triage.config.secrets.ConfigError` (every config problem) and
:func:`~gpu_triage.config.secrets.load_secret` (the one way a secret file is read).
Each section's dataclass lives beside its component; the aggregate ``Config`` and the loader are
:mod:`gpu_triage.daemon.config`. Layer 2: it imports ``model`` only."""
