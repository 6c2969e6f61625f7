"""Plotly figure builders: build_*_figure(result) -> plotly Figure. They draw, never compute."""
