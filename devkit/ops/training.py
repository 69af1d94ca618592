"""Training ops: gradients, losses and optimizer updates (being written)."""
