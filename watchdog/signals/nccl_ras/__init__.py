"""nccl_ras."""
