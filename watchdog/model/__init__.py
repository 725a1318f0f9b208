"""Pure values every layer shares, and nothing else: GPU states and verdicts (``states``), the action
engine's actions, results and stages (``actions``), findings (``findings``), a job's evidence and its one
JSON form (``evidence``), hardware and node health (``health``), the published snapshot (``snapshot``),
telemetry samples and the ``TelemetrySource`` Protocol (``samples``), the one JSON sanitiser
(``jsonable``), input limits (``limits``), untrusted names (``names``), runbook anchors (``runbook``), the
monotonic timeline (``clock``) and the settings schema every config section is declared with
(``config_schema``, ``config_checks``). Layer 0: it imports nothing of ``gpu_triage`` but itself and no I/O
library (hardware, processes, network, storage); time is always passed in."""
