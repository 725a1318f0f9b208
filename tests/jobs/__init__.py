"""Stand-alone training scripts that are *not* this project's trainer (no progress files, no
integration): what most users run. The daemon's stack-evidence tests launch them as real ranks."""
