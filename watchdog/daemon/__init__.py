"""The per-node daemon: the ``Daemon`` (``loop``) that owns all state on the main thread and runs one
cycle at a time - observe, classify, detect, act, record, publish - composing the parts ``build`` makes
from the aggregate ``Config`` (``config``: the file, environment and command-line overrides), with the
observation (``observe``), recording (``record``), cycle health (``health``), reload and signal handlers
(``reload``), the foreground line (``summary``), launch options (``runner``), the state lock and
sd_notify. Layer 6: it may import every layer below (``serving``, ``actions``, ``journal``, ``verdicts``,
``signals``...), and only ``demo`` and ``cli`` import it."""
