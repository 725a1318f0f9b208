"""gpu-triage's watchdog: GPU power-band classification, deadlock detection and offline triage.

The source folder is ``watchdog/``; it installs as the import package ``gpu_triage`` (setuptools
``package-dir``), because PyPI's filesystem-events package owns the import name ``watchdog`` and two
distributions shipping one top-level package overwrite each other. ``gpu_triage`` matches this
distribution's own name, so nothing else can ship it. This module imports nothing: the client side
(the progress contract and the framework integrations) installs into a training environment
without the daemon's dependencies.
"""

from __future__ import annotations

__version__ = "0.1.0"
DISTRIBUTION = "gpu-triage"
