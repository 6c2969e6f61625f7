"""Small shared widgets: error boxes, metric rows, option inputs (the downloads: ui.views.downloads)."""

from __future__ import annotations

import streamlit as st

from diagnostics.runner import JobOutcome


def show_failure(outcome: JobOutcome) -> None:
    """A readable error for a failed job, with the worker's last output folded away. A job still
    running (ui.jobs) draws nothing: its progress panel is on the page already."""
    if outcome.status == "running":
        return
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


def option_input(analysis: str, key: str, container=None, *, widget_key: str | None = None,
                 label: str | None = None, radio: bool = False, format_func=None, scale: float = 1.0, **kwargs):
    """A widget for one declared option of ``analysis``: its label, default, bounds, choices and help
    come from the declaration (diagnostics.declare), so the page never restates them. Returns the
    value in the option's own terms (``scale`` shows a fraction as a percentage and maps it back).

    ``radio``: a choice as horizontal radio buttons instead of a select box. Other keyword arguments go
    to the Streamlit widget (``step``, ``disabled``...). The value is kept across page switches
    (``persist_state="session"``), so a page shows the job its settings started when the user comes back."""
    from diagnostics.registry import ANALYSES

    o = ANALYSES[analysis].option(key)
    c = container or st
    # A page's settings survive a visit to another page: its job (ui.jobs) is found again on return.
    kwargs.setdefault("persist_state", "session")
    wkey = widget_key or f"{analysis}_{key}"
    label = label or o.title
    help_ = kwargs.pop("help", None) or o.help or None
    if o.kind == "bool":
        return c.checkbox(label, value=bool(o.default), key=wkey, help=help_, **kwargs)
    if o.kind == "choice":
        choices = list(o.choices)
        index = choices.index(o.default) if o.default in choices else 0
        if radio:
            return c.radio(label, choices, index=index, key=wkey, help=help_, horizontal=True,
                           format_func=format_func or str, **kwargs)
        return c.selectbox(label, choices, index=index, key=wkey, help=help_, format_func=format_func or str,
                           **kwargs)
    if o.kind == "multi":
        default = list(o.default) if o.default else list(kwargs.pop("default", []) or [])
        offered = list(kwargs.pop("choices", None) or o.choices)  # e.g. what this device supports
        return c.multiselect(label, offered, default=[d for d in default if d in offered], key=wkey, help=help_,
                             format_func=format_func or str, **kwargs)
    if o.kind in ("int", "float"):
        integer = o.kind == "int"
        cast = int if integer else float
        lo = kwargs.pop("min_value", None)
        if lo is None:  # from the declaration; strictly above gt: the smallest value the widget offers
            lo = o.lo if o.lo is not None else (None if o.gt is None else o.gt + (1 if integer else 1e-12))
        hi = kwargs.pop("max_value", o.hi)
        value = kwargs.pop("value", o.default)
        if not integer:
            kwargs.setdefault("format", "%g")
        def shown_as(x):  # rounded, so 0.2 x 100 reads 20 and maps back to exactly 0.2 (same cache key)
            return None if x is None else cast(round(x * scale, 12))

        shown = c.number_input(label, min_value=shown_as(lo), max_value=shown_as(hi), value=shown_as(value),
                               key=wkey, help=help_, **kwargs)
        return None if shown is None else cast(round(shown / scale, 12)) if scale != 1.0 else shown
    return c.text_input(label, value=o.default or "", key=wkey, help=help_, **kwargs)
