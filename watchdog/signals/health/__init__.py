"""health: the node's hardware health - NVML health reads and events, the kernel log, the Xid catalog."""
