"""What the node shows about its jobs, one module or subpackage per signal: rank processes and their
kernel proofs (``processes``), progress files (``progress``), Slurm, cgroups and pods, the flight
recorder, py-spy stacks (``stacks/``), NCCL RAS (``nccl_ras/``) and other nodes' facts through Prometheus
(``fleet/``). Each reads the node under a bound and returns typed facts for the detector. Layer 2: it
imports only layers 0 and 1 (``contract``, ``model``, ``alerts``, ``recordings``), never its siblings
``config``, ``telemetry`` and ``classify`` nor anything above."""
