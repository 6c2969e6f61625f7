"""The measurement layer: one timer, one training step, peak memory, state restore, comparisons."""
