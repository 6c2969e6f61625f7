"""Rendering of results: Plotly charts, the HTML report, text and CSV. Draws, never measures."""
