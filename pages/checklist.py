"""Checklist page: run the optimization checklist on demand; findings, score, report, "Apply fix"."""

import streamlit as st

from diagnostics.registry import get_analysis
from diagnostics.results import ResultError, decode
from diagnostics.settings import safe_mode
from diagnostics.uploads import save_upload
from ui import state, views
from diagnostics.analyses.checklist.rank import fix_first, split_fix, trial_evidence
from ui.jobs import cached_outcome, get_store, run_analysis
from ui.views import checklist as checklist_view
from ui.frame import require_app
from ui.widgets import option_input, show_failure

require_app()

st.title("Checklist")
spec = state.current_spec()
st.caption("Reads the module tree, the device settings and a short profiled training step, then checks them "
           "against the rules below (the TensorBoard profiler plugin's seven and more). Rules that do not apply "
           "say why.")

with st.container(border=True):
    c1, c2 = st.columns(2)
    purpose = option_input("checklist", "purpose", c1, widget_key="cl_purpose", radio=True)
    iters = option_input("checklist", "iters", c2, widget_key="cl_iters", max_value=50)
    with st.expander("DataLoader (optional): feeds the data-pipeline rules"):
        use_dl = st.checkbox("Describe my DataLoader", key="cl_use_dl", persist_state="session")
        d1, d2, d3, d4, d5 = st.columns(5)
        dl = {"persist_state": "session", "disabled": not use_dl}  # kept across page switches, like option_input's
        dl_batch = d1.number_input("batch_size", 1, 65536, 32, key="cl_dl_batch", **dl)
        dl_workers = d2.number_input("num_workers", 0, 256, 0, key="cl_dl_workers", **dl)
        dl_prefetch = d3.number_input("prefetch_factor", 1, 64, 2, key="cl_dl_prefetch", **dl)
        dl_pin = d4.checkbox("pin_memory", key="cl_dl_pin", **dl)
        dl_persist = d5.checkbox("persistent_workers", key="cl_dl_persist", **dl)
        dataset_file = None
        if safe_mode():
            st.caption("Server-safe mode: dataset modules (Python files) are disabled; the description is still used.")
        else:
            dataset_file = st.file_uploader("Dataset module (.py defining build_dataset()) to measure loader time",
                                            type=["py"], key="cl_dataset", disabled=not use_dl)
    run = st.button("Run checklist", type="primary", icon=":material/play_arrow:", key="cl_run")

options = {"purpose": purpose, "iters": iters}
if use_dl:
    options["dataloader"] = {"batch_size": int(dl_batch), "num_workers": int(dl_workers),
                             "prefetch_factor": int(dl_prefetch), "pin_memory": bool(dl_pin),
                             "persistent_workers": bool(dl_persist)}
    if dataset_file is not None:
        path, _digest = save_upload(dataset_file.getvalue(), "python", get_store().data_dir, dataset_file.name)
        options["dataset_path"] = str(path)

outcome = run_analysis("checklist", spec, options, force=True) if run else cached_outcome("checklist", spec, options)
if outcome is None:
    st.info(f"No checklist yet for {spec.label} with these settings: press **Run checklist** (it times the "
            "device, so it runs one job at a time).")
    st.stop()
if not outcome.ok:
    show_failure(outcome)
    st.stop()


def apply_fix(fix_ref: str) -> None:
    mode, fix_id = split_fix(fix_ref)  # "train:activation_checkpointing" -> a training-mode trial
    st.session_state[state.OPTIMIZE_PRESELECT] = {"mode": mode, "fixes": [fix_id]}
    st.switch_page("pages/optimize.py")


def latest(analysis: str, accept=lambda result: True):
    """The newest successful run of ``analysis`` on this model and device, if any (History has it), as its
    typed result; a stored run that no longer fits the type is passed over (History shows it, with the reason)."""
    for rec in get_store().list(limit=50, analysis=analysis):
        if rec.status == "ok" and rec.model_label == spec.label and rec.device == spec.device:
            full = get_store().get(rec.id)
            if full is None or full.damaged:
                continue
            try:
                typed = decode(get_analysis(analysis), full.result)
            except ResultError:
                continue
            if typed is not None and accept(typed):
                return typed
    return None


profile_result = latest("profile")
trials = [latest("optimize", lambda r, m=m: (r.mode or "inference") == m) for m in ("inference", "train")]
sources = ", ".join(n for n, r in (("the latest profile's roofline", profile_result),
                                   ("the latest Optimize trials", trials[0]),
                                   ("the latest training-step trials", trials[1])) if r)
ranked = fix_first(outcome.result, profile_result, [t for t in trials if t])
checklist_view.show(outcome.result, apply_fix=apply_fix, ranked=ranked, sources=sources,
                    trial_note=lambda f: trial_evidence(f, [t for t in trials if t]))
views.downloads("checklist", outcome.result)  # the HTML report and the JSON every page offers
