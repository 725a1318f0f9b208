"""``make run``'s demo: a simulated training job (``simjob``) under a daemon on simulated GPUs, driven
through its scenario (``run``). Layer 7: it imports ``daemon`` and the layers below; only ``cli`` imports
it."""
