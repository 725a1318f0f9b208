"""NCCL's RAS service as evidence: ``client`` (the bounded query), ``poller`` (``[ras]``: rarely, only
on suspicion, off the cycle thread), ``evidence`` (a report as facts about a job's communicators:
pure), ``signal`` (the registered signal; it reads the stacks' facts). Imports ``model`` and
``signals.stacks`` only.
"""
