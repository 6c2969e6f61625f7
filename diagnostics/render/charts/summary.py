"""Figures for the model summary: a parameter treemap and top layers by params or FLOPs."""

from __future__ import annotations

import pandas as pd

import plotly.graph_objects as go

from diagnostics.units import human_count, human_flops
from diagnostics.render.sections import Section
from diagnostics.render.charts.style import HIERARCHY_COLORSCALE, readable_axes, short_names

ROOT = "(model)"


def _module_label(name: str, type_: str) -> str:
    """A box's label: the module's qualified name from its parent's attribute on ('features.0',
    never a bare '0' of a Sequential) and its type."""
    parts = name.split(".")
    i = len(parts) - 1
    while i > 0 and parts[i].isdigit():  # 'features.0.1', not '0.1'
        i -= 1
    short = ".".join(parts[i:])
    return f"{short} · {type_}"


def build_param_treemap_figure(result: dict) -> go.Figure:
    """Parameters by module hierarchy; a box's area is the parameters under it (tied weights once)."""
    layers = [l for l in result["layers"] if l["params_total"] > 0]
    # Use totals consistent with the once-only ownership: a node's value is own + children values.
    own = {l["name"]: l["params"] for l in layers}
    children: dict[str, list[str]] = {}
    for l in layers:
        if l["parent"] is not None:
            children.setdefault(l["parent"], []).append(l["name"])

    def total(name: str) -> int:
        return own.get(name, 0) + sum(total(c) for c in children.get(name, []))

    ids = [l["name"] for l in layers]
    values = [total(n) for n in ids]
    types = [l["type"] for l in layers]
    labels = [_module_label(n, t) if n != ROOT else result.get("model_type", ROOT) for n, t in zip(ids, types)]
    fig = go.Figure(go.Treemap(
        ids=ids, labels=labels, parents=[l["parent"] or "" for l in layers], values=values,
        branchvalues="total", customdata=list(zip(ids, types, [human_count(v) for v in values])),
        hovertemplate="<b>%{customdata[0]}</b> (%{customdata[1]})<br>%{customdata[2]} parameters"
                      "<br>%{percentRoot:.1%} of the model<extra></extra>",
        texttemplate="%{label}<br>%{customdata[2]}",
        marker=dict(colors=values, colorscale=HIERARCHY_COLORSCALE, showscale=False),
    ))
    fig.update_layout(title="Parameters by module (area = parameter count)", margin=dict(t=40, l=5, r=5, b=5),
                      height=460)
    return fig


def build_top_layers_figure(result: dict, by: str = "params", n: int = 15) -> go.Figure:
    """Horizontal bars of the leaf layers with the most parameters or FLOPs."""
    leaves = [l for l in result["layers"] if l["is_leaf"] or (l["params"] and l["name"] != ROOT)]
    if by == "params":
        key, title, axis, fmt = "params", f"Top {n} layers by parameters", "parameters (count)", human_count
        rows = sorted(leaves, key=lambda l: l["params"], reverse=True)[:n]
        series = [("parameters", [l["params"] for l in rows], "#4C78A8")]
    else:
        key, title, axis, fmt = "flops", f"Top {n} layers by FLOPs (one batch)", "FLOPs per batch", human_flops
        rows = sorted(leaves, key=lambda l: (l["flops_forward"] or 0) + (l["flops_backward"] or 0), reverse=True)[:n]
        series = [("forward", [l["flops_forward"] for l in rows], "#4C78A8"),
                  ("backward", [l["flops_backward"] for l in rows], "#F58518")]
    full = [f"{l['name']} ({l['type']})" for l in rows]
    rows_names = short_names(full)
    fig = go.Figure()
    for label, values, color in series:
        fig.add_bar(y=rows_names, x=values, orientation="h", name=label, marker_color=color,
                    customdata=[[fmt(v), f] for v, f in zip(values, full)],
                    hovertemplate="%{customdata[1]}<br>%{customdata[0]}<extra>" + label + "</extra>")
    fig.update_layout(title=title, barmode="stack", xaxis_title=axis, yaxis=dict(autorange="reversed"),
                      height=max(300, 28 * len(rows) + 120), margin=dict(l=10, r=10, t=40, b=40),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return readable_axes(fig)


# ----------------------------------------------------------------------------- report sections
def summary_sections(result: dict) -> list[Section]:

    inputs = ", ".join(f"{i['name'] + '=' if i.get('name') else ''}{i['shape']} {i['dtype']}"
                       for i in result.get("inputs", []))
    overview = [f"{result.get('model', '?')} · {result.get('model_type', '?')} · inputs {inputs} · "
                f"output {result.get('output_shape')} · device {result.get('device')} · loss: {result.get('loss')}"]
    overview += [str(n) for n in result.get("notes", [])]
    layers = pd.DataFrame(result["layers"])
    if not layers.empty:
        if "flops_not_counted" not in layers:  # a result stored before the field existed
            layers["flops_not_counted"] = None
        leaves = layers[(layers["is_leaf"] | (layers["params"] > 0)) & (layers["name"] != "(model)")]
        leaves = leaves[["name", "type", "output_shape", "params", "pct_of_total", "trainable",
                         "flops_forward", "flops_backward", "flops_not_counted"]].copy()
        leaves["output_shape"] = leaves["output_shape"].map(lambda s: "" if s is None else str(s))
        leaves["pct_of_total"] = leaves["pct_of_total"].round(2)
    else:
        leaves = layers
    return [
        Section("Overview", text=overview),
        Section("Where the parameters are", figures=[build_param_treemap_figure(result),
                                                     build_top_layers_figure(result, "params")]),
        Section("Where the FLOPs are", figures=[build_top_layers_figure(result, "flops")]),
        Section("Layers", text=["Leaf layers and layers that own parameters; layers.csv has every module."],
                tables=[("layers", leaves)]),
    ]
