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
