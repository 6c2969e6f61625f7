"""AppTest: the Memory page's Plan tab plans the current model on its button and shows the fit table, the
grid and the make-it-fit list; nothing runs before the button."""

import pytest

from tests.pages.test_memory_gradients_pages import click


def test_the_plan_tab_plans_on_its_button(new_app):
    at = new_app()
    at.session_state["sb_sample"] = "mlp"
    at.switch_page("pages/memory.py").run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [t.label for t in at.tabs]
    assert labels[0] == "Measured" and "Plan" in labels
    assert any("press **Plan**" in i.value for i in at.info)  # no plan job before the button
    at.text_input(key="plan_batch").set_value("32,30000000")
    at.selectbox(key="plan_device").set_value("L4-24GB")
    click(at, "Plan")
    labels = [m.label for m in at.metric]
    assert {"Fit", "Device memory", "Largest batch"} <= set(labels)
    fit = next(m.value for m in at.metric if m.label == "Fit")
    assert fit == "1 of 2"  # batch 32 fits an L4, batch 30 million does not
    table = next(d.value for d in at.dataframe if "configuration" in d.value.columns)
    assert table["fits"].tolist() == [True, False]
    assert any(t.label == "Make it fit" for t in at.tabs)


@pytest.mark.slow
def test_the_plan_tab_answers_a_budget_with_what_to_checkpoint(new_app):
    """'Fit in' a budget under the transformer's peak: the answer names the modules to checkpoint."""
    at = new_app()
    at.session_state["sb_sample"] = "transformer"
    at.switch_page("pages/memory.py").run()
    at.text_input(key="plan_budget").set_value("20MiB")
    at.selectbox(key="plan_device").set_value("cpu")
    click(at, "Plan")
    assert not at.exception, [e.value for e in at.exception]
    assert any(s.value.startswith("fits: checkpoint encoder.layers.") for s in at.success)
    table = next(d.value for d in at.dataframe if "chosen" in d.value.columns)
    assert set(table["module"]) == {"encoder.layers.0", "encoder.layers.1"} and table["chosen"].any()
