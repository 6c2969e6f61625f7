"""AppTest: fix trials on the "Run a script" page (Try fixes ticked from the last run's findings, progress per
candidate, Stop) and the trials view on a stored result."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from diagnostics.analyses.trials.protocol import suggested_fixes
from diagnostics.findings import Finding
from diagnostics.results import to_json
from tests.attach.harness import SCRIPTS
from tests.attach.test_trials_unit import sample_record


def _open(new_app):
    at = new_app().run()
    at.switch_page("pages/run_script.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_findings_tick_the_fixes_they_point_to():
    fs = [Finding(id="data_wait", title="t", category="data pipeline", status="fail", evidence="e",
                  numbers={"workers_needed": 3}),
          Finding(id="host_bound", title="t", category="compute", status="pass", evidence="e"),
          Finding(id="launch_bound", title="t", category="compute", status="warn", evidence="e")]
    assert suggested_fixes(fs) == ["loader_workers=3", "persistent_workers", "pin_memory", "compile", "cudnn_benchmark"]


def test_the_view_shows_a_stored_trials_result(tmp_path):
    from streamlit.testing.v1 import AppTest

    from diagnostics.analyses.trials.job import build_result

    path = tmp_path / "result.json"
    path.write_text(to_json(build_result(sample_record(), "/f")))

    def page(path):
        import json as _json

        from ui import views

        views.show_stored("trials", _json.loads(open(path).read()))  # decoded, as History does

    at = AppTest.from_function(page, default_timeout=60, kwargs={"path": str(path)}).run()
    assert not at.exception, [e.value for e in at.exception]
    assert [m.label for m in at.metric][:4] == ["Baseline step", "Best speed-up", "Fixes faster", "A/A control"]
    assert at.metric[1].value.startswith("x2.0") and at.metric[2].value == "1"
    assert any("DataLoader(..., num_workers=2) at t.py:9" in m.value for m in at.markdown)
    df = at.dataframe[0].value
    assert list(df["fix"])[:3] == ["baseline", "control", "loader_workers=2"]
    assert df.set_index("fix").loc["channels_last", "why not / failure"] == "no 4-D tensor"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_try_fixes_runs_from_the_page_with_progress_and_stop_keeps_what_was_measured(new_app, tmp_path):
    at = _open(new_app)
    at.text_input(key="attach_cmd").set_value(f"{sys.executable} {SCRIPTS / 'data_bound.py'} 3")
    at.text_input(key="attach_cwd").set_value(str(SCRIPTS))
    at.multiselect(key="trials_fixes").set_value(["loader_workers", "channels_last"])
    at.number_input(key="trials_n").set_value(2)
    at.number_input(key="trials_rounds").set_value(6).run()
    at.button(key="attach_try").click().run()
    assert not at.exception, [e.value for e in at.exception]
    run = at.session_state["attach_run"]
    assert run.trials
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and (run.status().get("runs") or 0) < 5:  # round 1 and a run of round 2
        time.sleep(0.5)
    status = run.status()
    assert status["message"].startswith("round ") and status["mode"] == "trials"
    children = psutil.Process(run.proc.pid).children(recursive=True)
    run.stop()
    while not run.done and time.monotonic() < deadline:
        time.sleep(0.5)
    assert run.done and not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    final = json.loads(Path(run.status_file).read_text())
    from ui.jobs import get_store

    rec = get_store().get(final["run_id"])
    assert rec.analysis == "trials" and rec.status == "cancelled" and rec.source == "dashboard"
    rows = {r["fix"]: r for r in rec.result["trials"]}
    assert rows["loader_workers=2"]["rounds"] >= 1 and rows["channels_last"]["verdict"] == "not applicable"
    assert any("Trials stopped" in w.value for w in at.warning)
    assert [m.label for m in at.metric][0] == "Baseline step"
    # stopped before the rounds an interval needs: nothing decided (it read "none", beside a faster bar)
    assert {m.label: m.value for m in at.metric}["Best speed-up"] == "not decided"
