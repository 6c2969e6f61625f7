"""AppTest: the Checklist page runs the checklist and hands a fix to the Optimize page, which runs trials."""

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

STORED = Path(__file__).resolve().parents[1] / "data" / "stored"


def _plant_latest(store, file: str, run_id: str, new_id: str) -> None:
    """A real stored run (tests/data/stored) planted as the newest run of the mlp sample on the CPU."""
    row = next(r for r in json.loads((STORED / file).read_text()) if r["id"] == run_id)
    row = {**row, "id": new_id, "model_label": "mlp (sample)", "device": "cpu", "cache_key": None,
           "started": time.time(), "finished": time.time()}
    with sqlite3.connect(store.db_path) as db:
        db.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


def _mlp_app(new_app):
    at = new_app().run()
    at.sidebar.selectbox(key="sb_sample").set_value("mlp").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_checklist_runs_and_apply_fix_preselects_it_on_optimize(new_app):
    at = _mlp_app(new_app)
    at.switch_page("pages/checklist.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Checklist"
    assert any("No checklist yet" in i.value for i in at.info)
    # the model's latest profile and training trials, as stored by older code: the page ranks their typed results
    from diagnostics.store import Store

    store = Store(os.environ["TORCHSCOPE_DATA_DIR"])
    planted = ("planted-profile-44", "planted-optimize-44")
    _plant_latest(store, "runs-7a4be04-more.json", "20261127-092130-2bef41f4", planted[0])
    _plant_latest(store, "runs-dbb9a2c.json", "20261127-111140-24c15be4", planted[1])
    try:
        at.number_input(key="cl_iters").set_value(2)
        at.button(key="cl_run").click().run()
    finally:
        for run_id in planted:
            store.delete(run_id)
    assert not at.exception, [e.value for e in at.exception]
    assert any("Also from: the latest profile's roofline, the latest training-step trials." in c.value
               for c in at.caption), [c.value for c in at.caption]
    labels = [m.label for m in at.metric]
    assert labels[:2] == ["Score", "Pass"]
    assert at.metric[0].value.endswith("/100") and 0 <= float(at.metric[0].value[:-4]) <= 100
    expanders = [e.label for e in at.expander]
    assert any(l.startswith("**Compute**") for l in expanders) and any("Thresholds" in l for l in expanders)
    assert len(at.get("download_button")) == 3  # Markdown, HTML, JSON
    assert any("torch.compile used" in m.value for m in at.markdown)
    at.button(key="apply_torch_compile").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Optimize"
    # the checklist's purpose is training: the fix comes as a training-step trial
    assert at.session_state["opt_mode"] == "Training step"
    assert at.multiselect(key="opt_fixes_train").value == ["torch_compile"]
    assert any("From the checklist" in i.value for i in at.info)


def test_optimize_runs_trials_and_shows_the_table(new_app):
    at = _mlp_app(new_app)
    at.switch_page("pages/optimize.py").run()
    assert not at.exception, [e.value for e in at.exception]
    at.multiselect(key="opt_fixes_inference").set_value(["inference_mode", "channels_last"])
    at.number_input(key="opt_iters").set_value(6)  # the fewest rounds with a 95% interval
    at.number_input(key="opt_warmup").set_value(1)
    at.button(key="opt_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    df, measured = at.dataframe[0].value, at.dataframe[1].value  # what decides; every measurement
    assert list(df["fix"]) == ["Baseline (eval, no_grad)", "A/A control (the baseline, timed as if it were a fix)",
                               "inference_mode", "channels_last memory format"]
    assert list(measured["status"]) == ["ok", "ok", "ok", "not_applicable"]
    assert "no Conv2d layers" in measured["why / notes"].iloc[3]
    assert df["assessment"].iloc[3].startswith("not applicable: ") and "no Conv2d layers" in df["assessment"].iloc[3]
    assert df["verdict"].iloc[0] == "" and df["verdict"].iloc[2].split(" (")[0] in ("faster", "slower", "within noise")
    assert df["95% interval"].iloc[1].startswith("[")  # the control's interval: the noise floor
    # what the fix buys or costs, in words with its numbers (inference_mode keeps the outputs exactly)
    from ui.views.optimize import FLAG_TEXT

    assert df["assessment"].iloc[2].split(":")[0] in FLAG_TEXT.values() and df["assessment"].iloc[0] == ""
    assert "fidelity" not in df["assessment"].iloc[2]
    assert [m.label for m in at.metric] == ["Baseline time", "Best speed-up", "Noise floor (A/A)", "Faster / slower"]
    # one baseline figure on the page: the tile's is the table's time (the one the speed-ups divide)
    scale = {"ns": 1e-6, "µs": 1e-3, "ms": 1.0, "s": 1e3}
    value, unit = at.metric[0].value.split()
    tile_ms, table = float(value.replace(",", "")) * scale[unit], df["time"].iloc[0]  # the table's in its column's unit
    assert any(tile_ms == pytest.approx(table * f, rel=0.01) for f in scale.values()), (tile_ms, table)
    assert at.metric[2].delta.startswith("[")  # the noise floor with its interval under the figure
    # the timed job says what the machine did meanwhile
    assert any(c.value.startswith("Machine: quiet run") for c in at.caption) or any(
        w.value.startswith("disturbed run") for w in at.warning)
    assert len(at.tabs) == 4


def test_a_training_fix_from_the_checklist_opens_a_training_step_trial(new_app):
    from ui.state import OPTIMIZE_PRESELECT

    at = _mlp_app(new_app)
    at.session_state[OPTIMIZE_PRESELECT] = {"mode": "train", "fixes": ["grad_accumulation"]}
    at.switch_page("pages/optimize.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["opt_mode"] == "Training step"
    assert at.multiselect(key="opt_fixes_train").value == ["grad_accumulation"]
    at.multiselect(key="opt_fixes_train").set_value(["grad_accumulation", "fused_optimizer"])
    at.number_input(key="opt_iters").set_value(2)
    at.number_input(key="opt_warmup").set_value(1)
    at.button(key="opt_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    df = at.dataframe[0].value
    assert list(at.dataframe[1].value["status"]) == ["ok"] * 4
    assert df["fix"].iloc[0].startswith("Baseline training step (AdamW, lr 0.001")
    # the same effective batch from micro-batches: the losses follow the baseline's, the gradients point alike
    assert df["loss diff (rel, max)"].iloc[2] < 1e-4 and df["gradient cosine"].iloc[2] > 0.9999
    assert [m.label for m in at.metric][0] == "Baseline step"
    assert [t.label for t in at.tabs] == ["Step time", "Speed-up", "Peak memory", "Loss and gradients"]
