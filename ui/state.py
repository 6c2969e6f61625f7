"""Typed access to the session state shared across pages."""

from __future__ import annotations

import uuid

import streamlit as st

from diagnostics.spec import ModelSpec
from sample_models import DEFAULT_SAMPLE

SPEC = "ts_spec"  # the current ModelSpec (validated)
RESULTS = "ts_results"  # cache_key -> JobOutcome, this session's results
CANCELLED = "ts_cancelled"  # cache keys whose run the user cancelled
MODEL_INFO = "ts_model_info"  # validate result for an uploaded model: inputs, output shape
LOAD_ERROR = "ts_load_error"  # the last upload's error message, shown in the sidebar
HISTORY_OPEN = "ts_history_open"  # run id the History page shows
OPTIMIZE_PRESELECT = "ts_optimize_preselect"  # fix ids the Checklist's "Apply fix" hands to Optimize
SESSION_ID = "ts_session_id"  # this session's background jobs are filed under it (ui.background)
PENDING_LOAD = "ts_pending_load"  # an upload being checked in the background: {"spec", "name"}
JOB_RERUN = "ts_job_rerun"  # set when a job's panel reruns the page because the job ended


def current_spec() -> ModelSpec:
    if SPEC not in st.session_state:
        st.session_state[SPEC] = ModelSpec(source="sample", name=DEFAULT_SAMPLE)
    return st.session_state[SPEC]


def set_spec(spec: ModelSpec) -> None:
    st.session_state[SPEC] = spec


def results() -> dict:
    return st.session_state.setdefault(RESULTS, {})


def cancelled() -> set:
    return st.session_state.setdefault(CANCELLED, set())


def session_id() -> str:
    """This browser session's id for its background jobs: lives as long as its session state (a
    reload starts a new session; its jobs go on and are stored)."""
    return st.session_state.setdefault(SESSION_ID, uuid.uuid4().hex)
