"""Drop-in integrations that write the progress contract (:mod:`gpu_triage.contract`).

- :class:`Progress` (``gpu_triage.integrations.loop``): plain loops, ``with progress.checkpoint(): ...``;
- ``gpu_triage.integrations.hf``: a Hugging Face ``TrainerCallback``;
- ``gpu_triage.integrations.lightning``: a Lightning ``Callback``;
- ``gpu_triage.integrations.accelerate``: accelerate ``save_state``/``load_state`` under leases.

Only this package and ``loop`` are imported here; each framework module imports its framework when it
is itself imported, so the base install (no dependencies) never needs transformers, Lightning or
accelerate. See docs/integrations.md.
"""

from gpu_triage.integrations.loop import Progress

__all__ = ["Progress"]
