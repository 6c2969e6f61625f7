"""Show the model summary: totals, the per-layer table, a treemap and top-layer charts."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.render.charts.summary import build_param_treemap_figure, build_top_layers_figure
from diagnostics.units import human_bytes
from ui.widgets import Tile, metric_row


def layer_table(result: dict, leaves_only: bool) -> pd.DataFrame:
    df = pd.DataFrame(result["layers"])
    if "flops_not_counted" not in df:  # a result stored before the field existed
        df["flops_not_counted"] = None
    if leaves_only:
        df = df[df["is_leaf"] | (df["params"] > 0)]
        df = df[df["name"] != "(model)"]
    df = df.assign(output_shape=df["output_shape"].map(lambda s: "" if s is None else str(s)),
                   trainable=(df["trainable"] > 0).where(df["params"] > 0))
    cols = ["name", "type", "output_shape", "params", "pct_of_total", "trainable", "flops_forward", "flops_backward"]
    if df["flops_not_counted"].notna().any():  # only when some op was left out (the notes name it too)
        cols.append("flops_not_counted")
    return df[cols]


def tiles(result: dict) -> list[Tile]:
    m = result["metrics"]
    return [
        Tile("Parameters", m["params_total"], "count", f"{m['params_total']:,} in total; tied weights counted once"
                                                        f" ({m['tied_parameters']} tied)"),
        Tile("Trainable", m["params_trainable"], "count", f"{m['params_trainable']:,} trainable parameters"),
        Tile("Frozen", m["params_frozen"], "count", f"{m['params_frozen']:,} frozen parameters"),
        Tile("Parameter memory", m["param_bytes"], "bytes", f"{m['param_bytes']:,} bytes of parameters; buffers: "
                                                            f"{human_bytes(m['buffer_bytes'])}"),
        Tile("Forward FLOPs", m["flops_forward"], "flop", "see the note below" if m["flops_forward"] is None else
             f"{m['flops_forward']:,} FLOPs for one forward pass at batch {m['batch_size']}", missing="not counted"),
        Tile("Fwd + bwd FLOPs", m["flops_train_step"], "flop", None if m["flops_train_step"] is None else
             f"{m['flops_train_step']:,} FLOPs for one training step (without the optimizer)", missing="not counted"),
    ]


def show(result: dict) -> None:
    st.caption(f"{result['model']} · {result['model_type']} · inputs "
               + ", ".join(f"{i['name'] + '=' if i.get('name') else ''}{i['shape']} {i['dtype']}" for i in result["inputs"])
               + f" · output {result['output_shape']} · device {result['device']} · loss: {result['loss']}")
    metric_row(tiles(result))
    for note in result.get("notes", []):
        st.info(note)
    tab_table, tab_tree, tab_top = st.tabs(["Layers", "Parameter treemap", "Top layers"])
    with tab_table:
        leaves = st.toggle("Leaf layers only", value=True, key="summary_leaves")
        table = layer_table(result, leaves)
        st.dataframe(
            table, hide_index=True, width="stretch",
            height=min(36 * (len(table) + 1) + 3, 720),  # small models show every row without scrolling
            column_config={
                "name": st.column_config.TextColumn("Layer (qualified name)"),
                "type": st.column_config.TextColumn("Type"),
                "output_shape": st.column_config.TextColumn("Output shape"),
                "params": st.column_config.NumberColumn("Params", format="localized"),
                # small: the table fits a 1280 px window, the FLOP columns included
                "pct_of_total": st.column_config.ProgressColumn("% of params", format="%.1f%%", min_value=0,
                                                                max_value=100, width="small"),
                "trainable": st.column_config.CheckboxColumn("Trains", width="small",
                                                             help="the layer has trainable parameters"),
                "flops_forward": st.column_config.NumberColumn("Forward (FLOP)", format="compact",
                                                               help="FLOPs of one forward pass at this batch"),
                "flops_backward": st.column_config.NumberColumn("Backward (FLOP)", format="compact",
                                                                help="FLOPs of the backward pass"),
                "flops_not_counted": st.column_config.TextColumn("FLOPs not counted for"),
            },
        )
    with tab_tree:
        st.plotly_chart(build_param_treemap_figure(result), width="stretch")
    with tab_top:
        c1, c2 = st.columns(2)
        c1.plotly_chart(build_top_layers_figure(result, "params"), width="stretch")
        c2.plotly_chart(build_top_layers_figure(result, "flops"), width="stretch")
