"""Python stacks as evidence: ``config`` (``[stacks]``: the sampler's schedule and budget, and what
the detector makes of the dumps), ``sampler`` (py-spy off the cycle thread, under a CPU budget),
``dumps`` (parsing a dump, where a rank is: pure), ``evidence`` (a job's stack facts and findings:
pure), ``signal`` (the registered signal). Imports ``model`` only, besides itself.
"""
