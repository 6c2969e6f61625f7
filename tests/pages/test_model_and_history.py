"""AppTest: the app starts on the Model page with a sample model; History reopens a run."""

def test_model_page_shows_totals_and_table(new_app):
    at = new_app().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Model"
    labels = [m.label for m in at.metric]
    assert labels[:2] == ["Parameters", "Trainable"]
    assert at.metric[0].value == "94.8 k"  # the default sample: the small CNN
    assert len(at.dataframe) == 1
    df = at.dataframe[0].value
    assert {"features.0.0", "classifier"} <= set(df["name"])


def test_switching_sample_and_batch_updates_the_page(new_app):
    at = new_app().run()
    at.sidebar.selectbox(key="sb_sample").set_value("mlp").run()
    assert not at.exception
    assert at.metric[0].value == "26.1 k"
    at.sidebar.number_input(key="sb_batch_sample-mlp-").set_value(64).run()
    assert "batch 64" in at.metric[4].help


def test_bad_input_shape_keeps_previous_model(new_app):
    at = new_app().run()
    at.sidebar.selectbox(key="sb_sample").set_value("mlp").run()
    at.sidebar.text_input(key="sb_shape_sample-mlp-_0").set_value("64,abc").run()
    assert any("Input 1: shape '64,abc': dimensions must be positive integers separated by commas" in e.value
               for e in at.sidebar.error), [e.value for e in at.sidebar.error]
    assert not at.exception


def test_history_reopens_a_run_without_recomputing(new_app):
    at = new_app().run()
    at.switch_page("pages/history.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "History"
    assert "summary" in at.subheader[0].value
    assert [m.label for m in at.metric][:1] == ["Parameters"]


def test_history_names_its_runs_and_offers_each_download_once(new_app):
    from ui.jobs import get_store

    at = new_app().run()  # the Model page's summary: at least one run in the store
    at.switch_page("pages/history.py").run()
    newest = get_store().list(limit=1)[0]
    pick = at.selectbox(key="history_pick")
    assert pick.value == newest.id
    assert pick.options[0].startswith(f"{__import__('pandas').Timestamp(newest.started, unit='s'):%Y-%m-%d %H:%M:%S}"
                                      f" · {newest.analysis} · {newest.model_label} · {newest.status}")
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels.count("Download result (JSON)") == 1 and labels.count("Download report (HTML)") == 1, labels


def test_the_leaf_toggle_redraws_the_layer_table_in_its_fragment(new_app):
    """The toggle lives in a fragment with the table: switched off, the table lists the containers too
    (the model's row and Sequential blocks); the rest of the page is as it was."""
    at = new_app().run()
    leaves = set(at.dataframe[0].value["name"])
    assert "(model)" not in leaves and "features.0.0" in leaves
    at.toggle(key="summary_leaves").set_value(False).run()
    assert not at.exception, [e.value for e in at.exception]
    every = set(at.dataframe[0].value["name"])
    assert every > leaves and {"(model)", "features"} <= every
    assert at.metric[0].value == "94.8 k" and len(at.get("plotly_chart")) == 3
