"""stacks."""
