"""Run engine jobs from a page: cached by (spec, analysis, options), run on the server in the background.

The same spec + options is never computed twice: a result is looked up in this session, then in
the run store (any session, the CLI too), and only then computed. A failed run is remembered in
this session only (the store offers successes alone), so its error stays on the page until the
user asks for another try.

A job runs in a server thread (ui.background), not in the page's script run: the page submits it
and draws its record, a status panel with progress and a Cancel button, refreshed every REFRESH_S
by a fragment, so the rest of the page and the navigation stay usable. Leaving the page does not
stop the job; coming back (or a rerun) finds it running, or finished: its outcome then goes into
this session's results under the same key as before, so the page shows it as if computed there.
While the job runs, ``run_analysis`` and ``cached_outcome`` return an outcome with status
"running" (pages treat it as "not ok"; ``widgets.show_failure`` draws nothing for it, the panel
is on the page already). A session's jobs run one at a time in the order started; the panel of a
waiting one says what it waits for.

Cancel is explicit: the button kills the job's worker (the run is stored 'cancelled'), the panel
turns into "cancelled" with a "Run again" button, and the job is not started again by itself.
"""

from __future__ import annotations

import time
from dataclasses import replace

import streamlit as st

from diagnostics.errors import TorchScopeError
from diagnostics.registry import get_analysis
from diagnostics.results import decode
from diagnostics.runner import Job, JobOutcome
from diagnostics.spec import ModelSpec
from diagnostics.store import Store, StoreError
from ui import state
from ui.background import BackgroundJob, manager

#: Seconds between two refreshes of a running job's panel.
REFRESH_S = 1.0
#: A job's first FAST_FOR_S seconds are polled every FAST_REFRESH_S instead: a short job (a cold
#: page's summary, in a warm spare) shows its result within a quarter second of its end, not one.
FAST_REFRESH_S = 0.25
FAST_FOR_S = 4.0
#: The status of the outcome returned while a job is still running.
RUNNING = "running"


@st.cache_resource
def get_store() -> Store:
    store = Store()
    store.mark_interrupted()  # rows left 'running' by a dashboard that stopped
    return store


def store_problem() -> str | None:
    """Why the run store cannot serve (a read-only data folder, a full disk: diagnostics.store's one
    message), or None. The app stops on it rather than fail in every page."""
    try:
        get_store()
    except StoreError as e:
        return str(e)
    return None


def _outcome_from_record(rec) -> JobOutcome | None:
    """A stored run as an outcome, its result decoded into the analysis' type; None when the stored result
    no longer fits that type (stored by an older TorchScope): then it is computed again, and History
    still shows the stored JSON with the reason."""
    try:
        result = decode(get_analysis(rec.analysis), rec.result)
    except TorchScopeError:
        return None
    return JobOutcome(rec.status, result=result, error=rec.error, run_id=rec.id,
                      duration_s=rec.duration_s or 0.0, from_cache=True)


def _collect() -> None:
    """This session's finished background jobs -> its results (a cancelled one: its key is marked)."""
    for bj in manager().collect(state.session_id()):
        outcome = bj.outcome
        if outcome.status == "cancelled":
            state.cancelled().add(bj.key)
        else:
            # Failures are kept for this session too: a rerun (any widget touched) shows the error
            # again instead of restarting a job that crashed or timed out; the page's own
            # Run / Recompute button (force=True) tries again.
            state.results()[bj.key] = outcome if outcome.ok else replace(outcome, from_cache=True)


def _stored(key: str) -> JobOutcome | None:
    hit = state.results().get(key)
    if hit is None:
        rec = get_store().find_cached(key)
        hit = _outcome_from_record(rec) if rec is not None else None
        if hit is not None:
            state.results()[key] = hit
    return hit


def cached_outcome(analysis: str, spec: ModelSpec | None, options: dict | None = None) -> JobOutcome | None:
    """The outcome of a job already run (this session's, or a stored success), the panel of one still
    running (its outcome has status "running"), or None: nothing is started here."""
    key = Job(analysis, spec, options or {}).key()
    _collect()
    bj = manager().find(state.session_id(), key)
    if bj is not None:
        return _follow(bj)
    return _stored(key)


def run_analysis(analysis: str, spec: ModelSpec | None, options: dict | None = None, *, force: bool = False,
                 timeout_s: float | None = None, label: str | None = None) -> JobOutcome:
    """Return the outcome of ``analysis`` on ``spec``: cached, or started in the background (then the
    panel is drawn and the outcome's status is "running" until a later run of the page)."""
    job = Job(analysis, spec, options or {})
    key = job.key()
    _collect()
    bj = manager().find(state.session_id(), key)
    if bj is None:
        title = label or get_analysis(analysis).title
        if not force:
            hit = _stored(key)
            if hit is not None:
                return hit
            if key in state.cancelled():
                return _cancelled(key, title)
        state.cancelled().discard(key)
        bj = manager().submit(state.session_id(), job, title=title, store=get_store(), timeout_s=timeout_s,
                              replaceable=not force)
    return _follow(bj)


def _panel_label(bj: BackgroundJob, snap, ahead: list[BackgroundJob]) -> str:
    if snap.cancelling:
        return f"{bj.title}: cancelling…"
    if ahead:
        more = f" and {len(ahead) - 1} more" if len(ahead) > 1 else ""
        return f"{bj.title}: queued behind {ahead[0].title}{more}"
    if snap.state == "queued":
        return f"{bj.title}: starting…"  # the session's thread is about to take it
    if snap.message.startswith("queued"):
        return f"{bj.title}: queued, waiting for the device"
    return f"{bj.title}: running…"


def refresh_every(snap, ahead: list) -> float:
    """Seconds between two refreshes of a job's panel: FAST_REFRESH_S while it starts (nothing of its
    session ahead of it) or has run under FAST_FOR_S, else REFRESH_S."""
    if snap.state == "running":
        return FAST_REFRESH_S if snap.elapsed_s < FAST_FOR_S else REFRESH_S
    return FAST_REFRESH_S if snap.state == "queued" and not ahead else REFRESH_S


def _follow(bj: BackgroundJob) -> JobOutcome:
    """Draw the job's panel, refreshed every REFRESH_S (FAST_REFRESH_S in its first FAST_FOR_S) until
    the job ends; then rerun the page, whose next run collects the outcome and shows it."""
    session = state.session_id()
    since = time.monotonic()
    every = refresh_every(bj.snapshot(), manager().ahead_of(bj))
    fast = every == FAST_REFRESH_S

    @st.fragment(run_every=every)
    def panel() -> None:
        snap = bj.snapshot()
        if snap.done or (fast and time.monotonic() - since > FAST_FOR_S):
            # Done: the page's next run shows the outcome. A long job: one rerun of the page, after
            # which its panel is refreshed every REFRESH_S.
            st.session_state[state.JOB_RERUN] = True  # not the user's doing: ui.notices keeps its notes
            st.rerun()
        ahead = manager().ahead_of(bj) if snap.state == "queued" else []
        # Written to, not entered: leaving a `with st.status` block marks it complete.
        box = st.status(_panel_label(bj, snap, ahead), state="running", expanded=True)
        box.button("Cancel", key=f"cancel-{bj.key}", disabled=snap.cancelling,
                   on_click=manager().cancel, args=(session, bj.key),
                   help="Stop this job (its worker is killed; nothing else is stopped)")
        if ahead:
            box.progress(0.0, text="waiting for this session's earlier jobs: it runs one job at a time, "
                                   "in the order they were started")
        else:
            box.progress(snap.fraction, text=snap.message if snap.state == "running" else "starting worker")
        when = f"{snap.elapsed_s:.1f} s elapsed · " if snap.state == "running" else ""
        box.caption(when + "This runs on the server: you may open other pages and come back to it.")

    panel()
    return JobOutcome(RUNNING, error=f"{bj.title} is still running", error_type="JobError")


def _cancelled(key: str, title: str) -> JobOutcome:
    """The page after a Cancel: say so, and offer to start the job again (nothing runs until then)."""
    with st.status(f"{title}: cancelled", state="error", expanded=True):
        st.button("Run again", key=f"again-{key}", icon=":material/replay:",
                  on_click=lambda: state.cancelled().discard(key))
    return JobOutcome("cancelled", error="you cancelled this job; press Run again to start it again",
                      error_type="JobError")


def was_cancelled(analysis: str, spec: ModelSpec | None, options: dict | None = None) -> bool:
    return Job(analysis, spec, options or {}).key() in state.cancelled()
