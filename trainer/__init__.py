"""gpu-triage's trainer: DeepSpeed ZeRO-3 full fine-tuning that cannot hit the epoch-end deadlock.

Light modules (config, data plan, gate, progress) import neither torch nor DeepSpeed, so ``ft-trainer
gate`` runs on a login node in seconds; only ``trainer.train`` needs the ``trainer`` extra.
"""

__version__ = "0.1.0"
