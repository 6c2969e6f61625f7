"""Small shared widgets: error boxes, metric rows, downloads."""

from __future__ import annotations

import json

import streamlit as st

from diagnostics.runner import JobOutcome


def show_failure(outcome: JobOutcome) -> None:
    """A readable error for a failed job, with the worker's last output folded away."""
    heading = {"timeout": "Timed out", "crashed": "The worker crashed", "oom": "Out of memory",
               "cancelled": "Cancelled"}.get(outcome.status, "Failed")
    st.error(f"**{heading}:** {outcome.error}")
    if outcome.from_cache:
        st.caption("This is the last attempt's error; it does not run again by itself. Fix the cause (model, "
                   "inputs, options), or press the page's run button to try again.")
    if outcome.log_tail:
        with st.expander("Worker output (last lines)"):
            st.code(outcome.log_tail[-2000:], language=None)


def metric_row(items: list[tuple[str, str, str | None]]) -> None:
    """items: (label, value, help)."""
    cols = st.columns(len(items))
    for col, (label, value, help_) in zip(cols, items):
        col.metric(label, value, help=help_)


def json_download(result: dict, name: str, label: str = "Download result (JSON)") -> None:
    st.download_button(label, json.dumps(result, indent=1, default=str).encode(), file_name=name,
                       mime="application/json", on_click="ignore")
