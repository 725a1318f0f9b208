"""Offline triage of recorded nvidia-smi logs: states per GPU, time in each, and the power-only
deadlock rule. Reads recordings in chunks, so a file larger than memory gives the same answer."""
