"""The ``gpu-triage`` command line: one module per command group (``run``, ``status``, ``ops``,
``cluster``, ``slurm_health``...), registered in ``main``; ``extras`` says which install extra is missing.
Each command parses flags, prints and exits with its documented code, and calls the layers below for the
work; argparse lives only here. The top layer: it may import anything in ``gpu_triage``, and nothing of
``gpu_triage`` imports it (the trainer reads ``extras`` lazily for its install hint)."""
