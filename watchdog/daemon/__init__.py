"""The per-node daemon: the ``Daemon`` (``loop``) runs one cycle at a time - observe, classify, detect,
act, record, publish - and composes the parts that own their state: the Observer (``observe``: progress
files, rank processes and every registered signal into job views), the Recorder (``record``: the event
store and what a restart continues from) and the HealthBook (``health``: failed and degraded cycles,
input errors), with what ``build`` makes from the aggregate ``Config`` (``config``: the file, environment
and command-line overrides); ``reload`` (re-reading the config, signal handlers), ``summary`` (the
foreground line), ``runner`` (launch options), the state lock and sd_notify. No module here imports
``loop``. Layer 6: it may import every layer below (``serving``, ``actions``, ``journal``, ``verdicts``,
``signals``...), and only ``demo`` and ``cli`` import it."""
