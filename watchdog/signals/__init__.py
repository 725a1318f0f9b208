"""What the node shows about its jobs (layer 2): the rank processes and their proof (``processes``,
values in ``rank_process``), the progress files (``progress``, values in ``progress_records``), Slurm,
cgroups and Kubernetes pods, the flight recorder; and the pluggable signals behind one interface
(``signal``: build from a config section, contribute facts to each job within the cycle, status,
reload, close) registered by name (``registry``): ``stacks/`` (py-spy), ``nccl_ras/`` (NCCL's RAS
service), ``fleet/`` (the other nodes' facts through Prometheus). It imports only ``model``, ``contract``
and the layer-1 packages; the pure values here are what ``verdicts`` reads.
"""
