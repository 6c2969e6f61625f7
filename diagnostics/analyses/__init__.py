"""Analyses: one module per analysis, each `analyze(ctx, options) -> dict` (see registry.py)."""
