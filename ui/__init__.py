"""Streamlit glue: session-state keys, cached engine calls with progress, shared widgets and views.

The only package besides app.py and pages/ that imports streamlit.
"""
