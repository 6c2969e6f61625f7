"""AppTest: the Memory page (with its batch scan) and the Gradient-flow page, on small samples.

Each page is opened directly with the sample preselected, so no other page's job runs first; every
job is a worker process, which is what makes these tests slow on a loaded machine.
"""


def open_page(new_app, page, sample):
    at = new_app()
    at.session_state["sb_sample"] = sample
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def click(at, label):
    at.button[[b.label for b in at.button].index(label)].click().run()
    assert not at.exception, [e.value for e in at.exception]


def test_memory_page_shows_peaks_breakdown_and_runs_a_scan(new_app):
    at = open_page(new_app, "pages/memory.py", "mlp")
    assert at.title[0].value == "Memory"
    assert "mlp (sample)" in at.caption[0].value or any("mlp (sample)" in c.value for c in at.caption)
    labels = [m.label for m in at.metric]
    assert labels[:2] == ["Training peak", "Inference peak"]
    assert "Estimate" in labels
    assert at.metric[0].value.split()[-1] in ("KiB", "MiB")
    assert any("skipped (CPU device)" in i.value for i in at.info)  # no CUDA snapshot on the CPU
    assert len(at.tabs) >= 4
    assert any(d.value["category"].tolist()[:1] == ["parameters"] for d in at.dataframe)
    # the scan runs only on its button
    assert any("Run batch scan" in i.value for i in at.info)
    at.number_input(key="scan_max_batch").set_value(4)
    at.selectbox(key="scan_mode").set_value("inference")
    click(at, "Run batch scan")
    scan_metrics = {m.label: m.value for m in at.metric}
    assert scan_metrics["Largest batch"] == "4"
    assert any("every batch up to 4 fits" in s.value for s in at.success)
    scan_table = at.dataframe[-1].value
    assert scan_table["batch"].tolist() == [1, 2, 4]


def test_gradient_page_flags_the_vanishing_sample_and_reruns(new_app):
    at = open_page(new_app, "pages/gradients.py", "deep_sigmoid_mlp")
    assert at.title[0].value == "Gradient flow"
    assert any("vanishing" in e.value for e in at.error)
    assert at.metric[1].label == "Vanishing" and int(at.metric[1].value) >= 10
    tables = [d.value for d in at.dataframe]
    assert "vanishing" in set(tables[0]["status"])
    assert "VANISHING_RATIO" in set(tables[-1]["name"])  # the thresholds table
    at.number_input(key="grad_steps").set_value(1)
    click(at, "Run again")
    assert any("1 step of sgd" in c.value for c in at.caption)
