"""The py-spy stack signal: dumping each rank's stacks under a deadline and parsing them (``dumps``),
sampling them over time without blocking the loop (``sampler``), turning a job's stacks into detector
facts and findings (``stack_facts``: frozen in collectives, the odd ranks - the K6 evidence) and the
``[stacks]`` section (``config``). Part of ``signals`` (layer 2): it imports ``model`` and the lower
layers only."""
