"""gpu-triage's trainer: DeepSpeed ZeRO-3 full fine-tuning that cannot hit the epoch-end deadlock.

The source folder is ``trainer/``; it installs as the import package ``ft_trainer`` (PyPI's ``trainer``
distribution owns the import name ``trainer``).

Light modules (config, data plan, gate, progress) import neither torch nor DeepSpeed, so ``ft-trainer
gate`` runs on a login node in seconds; only ``ft_trainer.train`` needs the ``trainer`` extra.
"""

__version__ = "0.1.0"
