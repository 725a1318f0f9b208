"""The detector, pure: from one cycle's job views (``views``, built by ``fusion`` from progress files,
rank processes, stacks and RAS facts) to each job's verdict, kill-worthiness, findings and evidence.
``detector.Detector`` is the facade; ``memory`` keeps per-job state across cycles, ``facts`` one cycle's
facts, ``budgets`` the freeze budgets, ``hang_rules`` the proofs of a hang (K1-K6), ``stall_rules`` the
verdicts without proof, ``decision`` the verdict, ``job_evidence`` its findings and evidence, ``settings``
the ``[detector]`` section. Layer 3 and pure: it imports ``model``, ``signals`` and the layers
below, no I/O library, and time is passed in."""
