"""The NCCL RAS signal: a client of NCCL's RAS socket, text and JSON forms (``client``), a poller that
asks it in the background within a deadline (``poller``, with the ``[ras]`` section), and the pure reading
of its reports as facts - launched-operation counts frozen between polls, missing ranks named
(``ras_facts``). Part of ``signals`` (layer 2): it imports ``model`` and the lower layers only."""
