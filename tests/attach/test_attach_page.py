"""AppTest: the "Run a script" page (off in server-safe mode, a bad command named, a real run to its
result) and the attach view on a stored result."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from diagnostics.results import to_json
from tests.attach.harness import SCRIPTS


def _open(new_app):
    at = new_app().run()
    at.switch_page("pages/run_script.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_page_is_off_in_server_safe_mode_and_says_why(new_app, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    at = _open(new_app)
    assert at.title[0].value == "Run a script"
    assert any("Running scripts is off in server-safe mode" in w.value and "arbitrary" not in w.value
               and "any command" in w.value for w in at.warning)
    assert not [b for b in at.button if b.key == "attach_go"]


def test_the_page_names_the_account_scripts_run_as_even_without_user(new_app, monkeypatch):
    import os
    import pwd

    monkeypatch.delenv("USER", raising=False)
    at = _open(new_app)
    name = pwd.getpwuid(os.getuid()).pw_name
    assert any(f"Scripts run as **{name}**" in c.value for c in at.caption), [c.value for c in at.caption]


def test_a_command_that_cannot_run_is_named_and_nothing_starts(new_app):
    at = _open(new_app)
    at.text_input(key="attach_cmd").set_value("no-such-program-xyz --lr 1").run()
    at.button(key="attach_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("command not found: no-such-program-xyz" in e.value for e in at.error)
    assert "attach_run" not in at.session_state


@pytest.mark.slow
def test_a_script_runs_live_and_its_result_is_shown_and_stored(new_app, tmp_path):
    at = _open(new_app)
    at.text_input(key="attach_cmd").set_value(f"{sys.executable} {SCRIPTS / 'host_bound.py'}")
    at.text_input(key="attach_cwd").set_value(str(SCRIPTS))
    at.number_input(key="attach_at").set_value(4)
    at.number_input(key="attach_steps").set_value(3).run()
    at.button(key="attach_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    run = at.session_state["attach_run"]
    deadline = time.monotonic() + 240
    while not run.done and time.monotonic() < deadline:
        time.sleep(1)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [m.label for m in at.metric]
    assert labels[:2] == ["Step", "Bottleneck"] and at.metric[1].value == "host"
    status = json.loads(Path(run.status_file).read_text())
    from ui.jobs import get_store

    rec = get_store().get(status["run_id"])
    assert rec.analysis == "attach" and rec.status == "ok" and rec.source == "dashboard"
    assert rec.result["bottleneck"]["category"] == "host" and rec.result["profiled_steps"] == [4, 6]


def test_the_view_shows_a_stored_result_with_its_findings_and_gradients(tmp_path):
    from streamlit.testing.v1 import AppTest

    from tests.attach.test_attach_unit import _step, _write_run
    from diagnostics.analyses.attach.job import analyse_run

    steps = [_step(n, {"data_wait": 30.0, "forward": 2.0, "host": 1.0}, profiled=n in (4, 5)) for n in range(1, 9)]
    _write_run(tmp_path, steps, {"window": [4, 5], "loaders": [{"id": 1, "num_workers": 0, "batch_size": 8,
                                                                  "iters": 1, "len": 10}]})
    result = analyse_run(tmp_path, exit_code=1, command=["python", "t.py"])
    path = tmp_path / "result.json"
    path.write_text(to_json(result))

    def page(path):
        import json as _json

        from ui import views

        views.show_stored("attach", _json.loads(open(path).read()))  # decoded, as History does

    at = AppTest.from_function(page, default_timeout=60, kwargs={"path": str(path)}).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("The script exited with code 1" in e.value for e in at.error)
    assert [m.label for m in at.metric][:3] == ["Step", "Bottleneck", "Data wait"]
    assert at.metric[1].value == "data_wait"
    assert any("The step waits for data" in m.value for m in at.markdown)


def test_a_run_without_a_step_stored_before_typed_results_still_opens(tmp_path):
    """tests/data/stored/attach-no-steps-fc36ebc.json: a script that never imported torch, run attached by the code
    before the typed result; the parts only a step fills in were stored as {}. They read back empty (nothing
    invented: no step, no window, no workers), every other stored value as it was, and the view shows it."""
    from streamlit.testing.v1 import AppTest

    from diagnostics.analyses.attach.result import AttachResult
    from diagnostics.registry import ANALYSES
    from diagnostics.results import decode, to_plain

    (row,) = json.loads((Path(__file__).parents[1] / "data" / "stored" / "attach-no-steps-fc36ebc.json").read_text())
    stored = json.loads(row["result_json"])
    r = decode(ANALYSES["attach"], stored)
    assert isinstance(r, AttachResult) and r.status == "no steps" and r.steps == 0
    assert r.window.first is None and r.window.steps_profiled == 0 and r.workers.per_worker == ()
    assert r.workers.loader is None and r.model.modules == () and r.memory.peak_bytes is None
    plain = to_plain(r)
    empty = {k for k, v in stored.items() if v == {}}
    assert empty == {"breakdown_ms", "window", "overhead", "workers", "model", "memory"}
    assert {k: v for k, v in plain.items() if k in stored and k not in empty} == \
        {k: v for k, v in stored.items() if k not in empty}
    path = tmp_path / "result.json"
    path.write_text(row["result_json"])

    def page(path):
        import json as _json

        from ui import views

        views.show_stored("attach", _json.loads(open(path).read()))

    at = AppTest.from_function(page, default_timeout=60, kwargs={"path": str(path)}).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error if "cannot be shown" in e.value]
    assert any("never imported torch" in i.value for i in at.info)
    assert at.metric[1].value == "n/a"  # no bottleneck without a step


def test_a_bad_plan_spec_is_named_and_nothing_starts(new_app):
    at = _open(new_app)
    at.text_input(key="attach_cmd").set_value(f"{sys.executable} {SCRIPTS / 'host_bound.py'}")
    at.checkbox(key="attach_plan").check().run()
    at.text_input(key="attach_plan_spec").set_value("shard=zero3").run()
    at.button(key="attach_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("--plan: shard=zero3 needs the number of ranks: add ranks=N" in e.value for e in at.error)
    assert "attach_run" not in at.session_state


def test_the_view_shows_a_stored_runs_plan_beside_its_measured_peak(tmp_path):
    from streamlit.testing.v1 import AppTest

    from diagnostics.analyses.attach.job import analyse_run
    from diagnostics.analyses.attach.protocol import AttachConfig
    from tests.attach.test_attach_unit import _step, _write_run

    steps = [_step(n, {"forward": 2.0, "backward": 3.0, "host": 1.0}, profiled=n in (4, 5)) for n in range(1, 9)]
    _write_run(tmp_path, steps, {"window": [4, 5]}, AttachConfig(steps=2, at=4, plan="batch=2x"))
    rows = [{"scale": "1x", "batch": 8, "dtype": "fp32", "as_run": True, "peak_bytes": 3 << 20, "phase": "backward",
             "fits": True},
            {"scale": "2x", "batch": 16, "dtype": "fp32", "error": "TraceFailure: in (model) during forward: boom"},
            {"scale": "1x", "batch": 8, "dtype": "fp32", "seq": "2x", "inputs": ["input_ids [8, 128] int64"],
             "peak_bytes": 5 << 20, "phase": "backward", "fits": True},
            {"scale": "1x", "batch": 8, "dtype": "fp32", "shard": "zero3", "ranks": 4, "per_rank": {"0": 1 << 20},
             "peak_bytes": 1 << 20, "phase": "forward", "fits": True, "state_bytes": 1000}]
    (tmp_path / "proc-1234" / "plan.json").write_text(json.dumps(
        {"spec": "batch=2x", "device": "cpu", "optimizer": "SGD", "rows": rows, "held_bytes": {"parameters": 10}}))
    result = analyse_run(tmp_path, exit_code=0, command=["python", "t.py"])
    assert result.plan.rows[0].peak_bytes == 3 << 20 and result.plan.rows[1].error.startswith("TraceFailure")
    path = tmp_path / "result.json"
    path.write_text(to_json(result))

    def page(path):
        import json as _json

        from ui import views

        views.show_stored("attach", _json.loads(open(path).read()))

    at = AppTest.from_function(page, default_timeout=60, kwargs={"path": str(path)}).run()
    assert not at.exception, [e.value for e in at.exception]
    text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "memory plan, batch 8 (1x), fp32, SGD: 3.00 MiB predicted (peak in backward), fits cpu" in text, text
    assert "memory plan, batch 16 (2x), fp32, SGD: not planned: TraceFailure" in text
    assert "memory plan, batch 8 (1x), fp32, SGD, seq 2x (input_ids [8, 128] int64): 5.00 MiB predicted" in text
    assert "memory plan, batch 8 (1x per rank), fp32, SGD, zero3 x4 ranks: 1.00 MiB predicted (peak in forward)" in text
