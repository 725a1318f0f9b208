"""The per-node daemon (layer 6): :class:`~gpu_triage.daemon.loop.Daemon` runs one cycle per period and
composes the parts that own their state - the Observer (``observe``: progress files, rank processes and
every registered signal into job views), the Recorder (``record``: the event store and what a restart
continues from) and the HealthBook (``health``: failed and degraded cycles) - with what ``build`` makes
from the ``Config`` (``config``: every section composed, read from file, environment and flags).
It may import every lower layer (``serving``, ``actions``, ``verdicts``, ``journal``, ``signals``, ...);
only ``demo`` and ``cli`` import it. No module here imports ``loop``.
"""
