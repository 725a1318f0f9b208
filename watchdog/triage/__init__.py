"""Offline triage of recorded nvidia-smi logs: states per GPU, time in each, and the power-only
deadlock rule. Reads recordings in chunks, so a file larger than memory gives the same answer."""

#: The power-only rule's default duration. Here, not in deadlock_rule (which needs numpy): the command
#: line's help shows it, and ``gpu-watchdog --version`` must answer in the base install (no extras).
DEFAULT_DEADLOCK_AFTER_S = 300.0
