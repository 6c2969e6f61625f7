"""Typed access to the session state shared across pages."""

from __future__ import annotations

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
