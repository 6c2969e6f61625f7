"""AppTest: a running job's page shows what it measured so far (#36). The Optimize page draws each fix's
row once it is built and checked, and the speed-ups while the interleaved rounds run, before the job
ends; the Compile page Dynamo's graph breaks while the job compiles and times. What is drawn comes from the
job itself (ctx.partial, through the worker's pipe and the job's record)."""

import time
from pathlib import Path

from ui.background import manager
from ui.state import SESSION_ID


def _until_partial(at, session: str, found, timeout_s: float = 240.0):
    """Rerun the page (as the panel's refresh does) until ``found(at)`` is true; the job must still run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if found(at):
            return
        assert manager().pending(session), "the job ended before its partial result was seen"
        time.sleep(0.3)
    raise AssertionError("no partial result on the page")


def test_optimize_shows_each_trials_row_while_the_rounds_run(new_app):
    at = new_app(follow_jobs=False).run()  # as the browser sees it between two refreshes
    # the CNN, not the MLP: a thousand rounds of the MLP's trials took under two seconds on a quiet CI
    # machine, ended before a partial was seen; the CNN's take tens of seconds anywhere
    at.sidebar.selectbox(key="sb_sample").set_value("cnn").run()
    session = at.session_state[SESSION_ID]
    assert manager().wait(session, 240)  # the Model page's own job
    at.switch_page("pages/optimize.py").run()
    at.multiselect(key="opt_fixes_inference").set_value(["inference_mode", "torchscript"])
    at.number_input(key="opt_iters").set_value(1000)  # rounds enough to be seen running
    at.number_input(key="opt_warmup").set_value(1)
    at.checkbox(key="opt_early_stop").uncheck()
    at.button(key="opt_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    try:
        def measuring(at) -> bool:
            return any(df.value["verdict"].astype(str).str.startswith("measuring").any() for df in at.dataframe
                       if "verdict" in df.value.columns)

        _until_partial(at, session, measuring)
        (panel,) = at.status
        assert panel.label == "One-click fixes (trials): running…"
        (df,) = [d.value for d in at.dataframe]  # the rows so far, under the panel's progress bar
        assert list(df["fix"]) == ["Baseline (eval, no_grad)", "A/A control (the baseline, timed as if it were a fix)",
                                   "inference_mode", "TorchScript trace + freeze"]
        assert list(df["verdict"])[0] == "" and all(v.startswith("measuring… (round ") for v in list(df["verdict"])[1:])
        assert df["speed-up (x)"].iloc[2] > 0 and df["cosine"].iloc[3] > 0.99  # measured: a speed-up so far, fidelity
        assert not at.metric  # the result's tiles come with the result, not before
    finally:
        for job in manager().pending(session):
            manager().cancel(session, job.key)
        assert manager().wait(session, 60)


MLPS = Path(__file__).resolve().parents[2] / "sample_models" / "mlps.py"


def test_compile_page_shows_the_breaks_before_the_timing_ends(new_app):
    at = new_app(follow_jobs=False).run()
    at.sidebar.selectbox(key="sb_sample").set_value("graph_break_mlp").run()
    session = at.session_state[SESSION_ID]
    assert manager().wait(session, 240)
    at.switch_page("pages/compile.py").run()
    at.selectbox(key="cmp_backend").set_value("aot_eager")
    at.number_input(key="cmp_rounds").set_value(1000)  # rounds enough to be seen running
    at.button(key="cmp_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    item_line = next(i for i, l in enumerate(MLPS.read_text().splitlines(), 1) if "h.mean().item() > 0.5" in l)
    try:
        _until_partial(at, session, lambda at: any(e.label.startswith(f"mlps.py:{item_line} ·") for e in at.expander))
        (panel,) = at.status
        assert panel.label == "torch.compile explorer: running…"
        assert [m.label for m in at.metric] == ["Graphs", "Graph breaks", "Recompiles", "Compile time"]
        assert [m.value for m in at.metric][:2] == ["3", "2"]
        assert any(e.label.startswith(f"mlps.py:{item_line} · Unsupported Tensor.item() call") for e in at.expander)
        assert not any(m.label == "Speed-up" for m in at.metric)  # the timing has not ended
    finally:
        for job in manager().pending(session):
            manager().cancel(session, job.key)
        assert manager().wait(session, 60)
