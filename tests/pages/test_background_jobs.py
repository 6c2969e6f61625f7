"""AppTest: a job started on a page runs on without it. Start a profile, open another page (the
script run that started it ends), come back: the profile is running or done, never cancelled."""

from ui.background import manager
from ui.jobs import get_store
from ui.state import SESSION_ID


def _small_profile(at):
    at.radio(key="prof_mode").set_value("inference")
    at.number_input(key="prof_wait").set_value(0)
    at.number_input(key="prof_active").set_value(1)
    at.number_input(key="prof_lat_warmup").set_value(1)
    at.number_input(key="prof_lat_iters").set_value(3)
    return at


def test_a_profile_goes_on_while_another_page_is_open_and_is_shown_on_return(new_app):
    at = new_app(follow_jobs=False)  # as a browser sees it between two refreshes: nothing waits for jobs
    at.run()
    at.sidebar.selectbox(key="sb_sample").set_value("cnn").run()
    at.sidebar.number_input(key="sb_batch_sample-cnn-").set_value(3).run()  # a model no other test ran
    session = at.session_state[SESSION_ID]
    assert manager().wait(session, 240)  # the Model page's summary, started on opening it
    at.switch_page("pages/profiler.py").run()
    _small_profile(at).button(key="prof_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]  # running is no failure
    (panel,) = at.status
    assert panel.label in ("Profiler: starting…", "Profiler: running…") and panel.state == "running", panel.label
    assert [b.label for b in at.button if b.key and b.key.startswith("cancel-")] == ["Cancel"]
    job = manager().pending(session)[0]
    assert job.title == "Profiler" and not job.done

    # Leave: the Gradient flow page computes on opening, so its job queues behind the profile.
    at.switch_page("pages/gradients.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [s.label for s in at.status] in (["Gradient flow: queued behind Profiler"], ["Gradient flow: running…"])
    assert manager().wait(session, 240)
    at.run()  # the page's own refresh once its job ended
    assert not at.status and any(m.label == "Layers flagged" for m in at.metric)

    # Come back: the profile finished while the page was closed, and is shown.
    at.switch_page("pages/profiler.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.status and not at.error
    assert [m.label for m in at.metric][:3] == ["Median latency", "p90", "p99"]
    profiles = [r for r in get_store().list(analysis="profile") if r.model_label == "cnn (sample)"]
    assert profiles[0].status == "ok", profiles[0].error
    assert "cancelled" not in {r.status for r in profiles}
