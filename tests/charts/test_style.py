"""charts.style: category names shortened only past MAX_NAME_CHARS (full name kept for the hover),
axes that make room for their labels, and the static report's figure styling."""

import json

import plotly.graph_objects as go

from diagnostics.render.charts.style import MAX_NAME_CHARS, TITLE_STANDOFF, for_report, short_names


def figures_in_report(html: str) -> list[dict]:
    """The (data, layout) of every Plotly.newPlot call in a report page, read back as JSON."""
    out, dec, start = [], json.JSONDecoder(), 0
    while (i := html.find("Plotly.newPlot(", start)) >= 0:
        pos = i + len("Plotly.newPlot(")
        values = []
        for _ in range(3):  # the div id, the data, the layout
            while html[pos] in " \n\t,":
                pos += 1
            value, pos = dec.raw_decode(html, pos)
            values.append(value)
        out.append({"data": values[1], "layout": values[2]})
        start = pos
    return out


def test_short_names_keep_names_up_to_the_limit():
    ok = "aten::scaled_dot_product_attention [[8, 4, 64, 32], [8, 4, 64, 32]]"[:MAX_NAME_CHARS]
    long_a = "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>(int)"
    long_b = long_a.replace("(int)", "(long)")
    labels = short_names([ok, long_a, long_b, "aten::mm"])
    assert labels[0] == ok and labels[3] == "aten::mm"
    assert labels[1] == long_a[:MAX_NAME_CHARS - 1] + "…" and len(labels[1]) == MAX_NAME_CHARS
    assert labels[2] == labels[1] + " (2)"  # two names that shorten alike stay two bars


def test_for_report_white_template_uncut_axes_and_coloured_icicle():
    fig = go.Figure(go.Bar(y=["a" * 40], x=[1], orientation="h"))
    fig.update_layout(margin=dict(l=10), yaxis_title="operator")
    ice = go.Figure(go.Icicle(ids=["m", "m.a"], labels=["m", "a"], parents=["", "m"], values=[1.0, 2.0]))
    styled, styled_ice = for_report(fig), for_report(ice)
    assert styled.layout.yaxis.automargin is True and styled.layout.xaxis.automargin is True
    assert styled.layout.yaxis.title.standoff == TITLE_STANDOFF
    assert styled.layout.template.layout.plot_bgcolor == "white"
    assert list(styled_ice.data[0].marker.colors) == [1.0, 2.0] and styled_ice.data[0].marker.colorscale
    assert fig.layout.yaxis.automargin is None  # the dashboard's figure is left as it was


def test_treemap_and_icicle_label_boxes_with_module_names(tmp_path):
    """Sequential children read 'features.0.0 · Conv2d', never a bare '0'; the boxes are coloured."""
    from diagnostics.render.charts.profiler import _module_label
    from diagnostics.render.charts.summary import build_param_treemap_figure
    from diagnostics.runner import Job, execute
    from diagnostics.spec import ModelSpec

    result = execute(Job("summary", ModelSpec(name="cnn")), tmp_path / "summary")
    tree = build_param_treemap_figure(result).data[0]
    label = dict(zip(tree.ids, tree.labels))
    types = {l.name: l.type for l in result.layers}
    assert label["features.0.0"] == f"features.0.0 · {types['features.0.0']}" == "features.0.0 · Conv2d"
    assert label["features"] == "features · Sequential" and label["classifier"].startswith("classifier · ")
    assert not any(l.split(" · ")[0].isdigit() for l in tree.labels)
    assert list(tree.marker.colors) == list(tree.values) and tree.marker.colorscale
    assert [_module_label(n) for n in ("features.0.1", "blocks.3.attn", "0", "2.0", "head")] == [
        "features.0.1", "attn", "0", "2.0", "head"]
