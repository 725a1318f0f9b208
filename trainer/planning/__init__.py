"""Pure numbers the gate and the trainer share: what a job will do, computed before it runs.

``presets`` (model architectures, parameter counts, FLOPs per token), ``estimates`` (ZeRO-3 memory and
checkpoint sizes), ``plan`` (the packing plan: every rank gets the same number of steps), ``equalize``
(the step-count rule and the one collective that enforces it), ``cluster`` (hostfile and world size).
The lowest layer of the trainer: imports nothing else from :mod:`ft_trainer`; no torch at import.
"""
