"""AppTest: the Compile page compiles the sample with graph breaks and shows each break's line."""

from pathlib import Path

MLPS = Path(__file__).resolve().parents[2] / "sample_models" / "mlps.py"


def test_compile_page_shows_the_breaks_of_the_sample_that_has_them(new_app):
    at = new_app().run()
    at.sidebar.selectbox(key="sb_sample").set_value("graph_break_mlp").run()
    at.switch_page("pages/compile.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "torch.compile explorer"
    assert any("Not compiled yet" in i.value for i in at.info)
    at.selectbox(key="cmp_backend").set_value("eager")
    at.number_input(key="cmp_rounds").set_value(2)
    at.button(key="cmp_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [m.label for m in at.metric] == ["Graphs", "Graph breaks", "Recompiles", "Compile time",
                                           "Speed-up"]
    assert [m.value for m in at.metric][:2] == ["3", "2"]
    item_line = next(i for i, l in enumerate(MLPS.read_text().splitlines(), 1) if "h.mean().item() > 0.5" in l)
    assert any(e.label.startswith(f"mlps.py:{item_line} · Unsupported Tensor.item() call") for e in at.expander)
    assert any("fullgraph=True fails" in e.value for e in at.error)
    assert any("What to change" in m.value for m in at.markdown)
