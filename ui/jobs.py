"""Run engine jobs from a page: cached by (spec, analysis, options), with progress and Cancel.

The same spec + options is never computed twice: a result is looked up in this session, then in
the run store (any session, the CLI too), and only then computed in a worker process. A failed
run is remembered in this session only (the store offers successes alone), so its error stays on
the page until the user asks for another try.

Cancel: the button's on_click records the job's key in ``state.cancelled()``. The click reruns
the script, and Streamlit interrupts the running script at its next ``st`` call (``on_tick``
touches an element a few times a second); the exception unwinds through ``run_job``, which kills
the worker and stores the run as 'cancelled'. The rerun then finds the key cancelled and shows
"Cancelled" with a "Run again" button instead of starting the same job again.
"""

from __future__ import annotations

import time
from dataclasses import replace

import streamlit as st

from diagnostics.registry import get_analysis
from diagnostics.runner import Job, JobOutcome, run_job
from diagnostics.spec import ModelSpec
from diagnostics.store import Store
from ui import state


@st.cache_resource
def get_store() -> Store:
    store = Store()
    store.mark_interrupted()  # rows left 'running' by a dashboard that stopped
    return store


def _outcome_from_record(rec) -> JobOutcome:
    return JobOutcome(rec.status, result=rec.result, error=rec.error, run_id=rec.id,
                      duration_s=rec.duration_s or 0.0, from_cache=True)


def cached_outcome(analysis: str, spec: ModelSpec | None, options: dict | None = None) -> JobOutcome | None:
    job = Job(analysis, spec, options or {})
    key = job.key()
    hit = state.results().get(key)
    if hit is None:
        rec = get_store().find_cached(key)
        if rec is not None:
            hit = state.results()[key] = _outcome_from_record(rec)
    return hit


def run_analysis(analysis: str, spec: ModelSpec | None, options: dict | None = None, *, force: bool = False,
                 timeout_s: float | None = None, label: str | None = None) -> JobOutcome:
    """Return the outcome of ``analysis`` on ``spec``: cached, or computed now with a progress panel."""
    job = Job(analysis, spec, options or {})
    key = job.key()
    title = label or get_analysis(analysis).title
    if not force:
        hit = cached_outcome(analysis, spec, options)
        if hit is not None:
            return hit
        if key in state.cancelled():
            return _cancelled(key, title)
    state.cancelled().discard(key)
    with st.status(f"{title}: running…", expanded=True) as box:
        st.button("Cancel", key=f"cancel-{key}", on_click=lambda: state.cancelled().add(key),
                  help="Stop the worker running this job")
        bar = st.progress(0.0, text="starting worker")
        clock = st.empty()
        last = {"fraction": 0.0, "message": "starting worker"}
        t0 = time.monotonic()

        def on_progress(fraction: float, message: str) -> None:
            if message.startswith("queued") and not last["message"].startswith("queued"):
                box.update(label=f"{title}: queued, waiting for the device")
            elif last["message"].startswith("queued") and not message.startswith("queued"):
                box.update(label=f"{title}: running…")
            last.update(fraction=fraction, message=message)
            bar.progress(fraction, text=message)

        def on_tick(_elapsed: float) -> None:
            # Touching an element lets Streamlit deliver a Cancel click (a rerun) to this script
            # run; the runner's finally then kills the worker.
            clock.caption(f"{time.monotonic() - t0:.1f} s elapsed")

        outcome = run_job(job, store=get_store(), timeout_s=timeout_s, on_progress=on_progress, on_tick=on_tick)
        if outcome.ok:
            box.update(label=f"{title}: done in {outcome.duration_s:.1f} s", state="complete", expanded=False)
        else:
            box.update(label=f"{title}: {outcome.status}", state="error", expanded=True)
    if outcome.status != "cancelled":
        # Failures are kept for this session too: a rerun (any widget touched) shows the error
        # again instead of restarting a job that crashed or timed out; the page's own
        # Run / Recompute button (force=True) tries again.
        state.results()[key] = replace(outcome, from_cache=True) if not outcome.ok else outcome
    return outcome


def _cancelled(key: str, title: str) -> JobOutcome:
    """The page after a Cancel: say so, and offer to start the job again (nothing runs until then)."""
    with st.status(f"{title}: cancelled", state="error", expanded=True):
        st.button("Run again", key=f"again-{key}", icon=":material/replay:",
                  on_click=lambda: state.cancelled().discard(key))
    return JobOutcome("cancelled", error="you cancelled this job; press Run again to start it again",
                      error_type="JobError")


def was_cancelled(analysis: str, spec: ModelSpec | None, options: dict | None = None) -> bool:
    return Job(analysis, spec, options or {}).key() in state.cancelled()
