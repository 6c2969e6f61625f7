"""Show a distributed run: headline numbers, per-rank step/busy time with the straggler
threshold, the compute/communication/overlap/other split, collectives and the per-step table."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.analyses.distributed.result import DistributedResult
from diagnostics.render.charts.distributed import (build_breakdown_figure, build_collectives_figure,
                                            build_overlap_figure, build_rank_step_figure)
from diagnostics.render.tables import frame
from diagnostics.units import human_bytes
from ui.widgets import Tile, md_text, metric_row, unit_columns


def _ranks(ranks: list) -> str:
    """'none', 'rank 1', 'ranks 1, 3', or '5 ranks' when the list would not fit a tile."""
    if not ranks:
        return "none"
    text = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
    return text if len(text) <= 12 else f"{len(ranks)} ranks"


def tiles(result: DistributedResult) -> list[Tile]:
    m, t = result.metrics, result.thresholds
    stragglers = result.stragglers
    return [
        Tile("Median step", m.median_step_ms, "ms", "median over every rank's profiled steps (ProfilerStep)"),
        Tile("Slowest step", m.max_step_ms, "ms", "the slowest profiled step of any rank"),
        Tile("Communication", m.comm_fraction, "fraction", "share of step time with a collective running"),
        Tile("Exposed comm.", m.exposed_comm_fraction, "fraction",
             "share of step time spent communicating while nothing computes"),
        Tile("Overlap", m.overlap_ratio, "fraction",
             "communication/computation overlap: overlap time / communication time, how much communication is "
             "hidden behind computation"),
        Tile("Stragglers", _ranks(stragglers), "text",
             (("ranks " + ", ".join(str(r) for r in stragglers) + ": ") if stragglers else "")
             + f"busy time over {t.threshold_ms:.2f} ms"),
    ]


def show(result: DistributedResult) -> None:
    m, t = result.metrics, result.thresholds
    launch = result.launch
    source = (f"torchrun, {launch.nproc} processes, backend {launch.backend}, {launch.duration_s:.1f} s" if launch
              else f"traces loaded from {md_text(result.folder)}")
    st.caption(f"{source} · {m.ranks_loaded} of {m.world_size} ranks · {m.steps_per_rank} profiled steps "
               f"per rank · {result.device_kind} · backend {result.backend}")
    stragglers = result.stragglers
    metric_row(tiles(result))
    if stragglers:
        st.warning(f"**Straggler{'s' if len(stragglers) > 1 else ''}: "
                   + ", ".join(f"rank {r}" for r in stragglers)
                   + f".** Busy time (step minus exposed communication) over {t.threshold_ms:.2f} ms "
                     f"= the median of the other ranks ({t.median_ms:.2f} ms) plus the larger of "
                     f"{t.margin:.0%} and {t.min_excess_ms:g} ms. The other ranks wait for "
                     "it inside their collectives.")
    else:
        st.success(f"No straggler: every rank's busy time is within the median of the other ranks plus the "
                   f"larger of {t.margin:.0%} and {t.min_excess_ms:g} ms (for the busiest rank, a limit of "
                   f"{t.threshold_ms:.2f} ms).")
    for note in result.notes:
        st.info(note)

    tab_ranks, tab_coll, tab_steps = st.tabs(["Ranks", "Collectives", "Steps"])
    with tab_ranks:
        c1, c2, c3 = st.columns([2, 2, 1.2])
        c1.plotly_chart(build_rank_step_figure(result), width="stretch")
        c2.plotly_chart(build_breakdown_figure(result), width="stretch")
        c3.plotly_chart(build_overlap_figure(result), width="stretch")
        c4 = st.container()  # the per-rank table gets the full width
        df = frame(result.ranks)[["rank", "step_ms", "wall_step_ms", "busy_ms", "compute_ms", "comm_ms",
                                            "overlap_ms", "exposed_comm_ms", "other_ms", "overlap_ratio",
                                            "straggler", "file"]]
        df, config = unit_columns(df, {
            "step_ms": ("Step", "ms", "median ProfilerStep"),
            "wall_step_ms": ("Wall", "ms", "step, wall clock: perf_counter / CUDA events around each step"),
            "busy_ms": ("Busy", "ms", "step minus exposed communication"), "compute_ms": ("Compute", "ms"),
            "comm_ms": ("Comm", "ms"), "overlap_ms": ("Overlap", "ms"), "exposed_comm_ms": ("Exposed", "ms", "communication while nothing computes"),
            "other_ms": ("Other", "ms"),
            "overlap_ratio": ("Hidden", "fraction", "overlap time / communication time: the share of "
                                                    "communication hidden behind computation")}, {
            "rank": st.column_config.NumberColumn("Rank", width="small"),
            "straggler": st.column_config.CheckboxColumn("Straggler", width="small"),
            })
        # the trace files below the table, so its figures keep the page's width
        c4.dataframe(df.drop(columns=["file"]), hide_index=True, width="stretch", column_config=config)
        c4.caption("Trace files: " + ", ".join(f"rank {r.rank}: {r.file}" for r in result.ranks))
    with tab_coll:
        if result.collectives:
            st.plotly_chart(build_collectives_figure(result), width="stretch")
            cdf = frame(result.collectives).assign(
                mean_message=lambda d: d["mean_bytes"].map(lambda b: "not recorded" if pd.isna(b) else human_bytes(b)))
            cdf, config = unit_columns(
                cdf.assign(family=cdf["family"].fillna("-"))[
                    ["name", "family", "where", "calls", "ranks", "total_ms", "mean_ms", "max_ms", "mean_message",
                     "bytes"]],
                {"total_ms": ("Total", "ms"), "mean_ms": ("Mean", "ms"), "max_ms": ("Max", "ms"),
                 "bytes": ("Total moved", "bytes")}, {
                    "name": st.column_config.TextColumn("Collective"),
                    "family": st.column_config.TextColumn("Family", help="the communication family the name "
                                                          "belongs to (NCCL, RCCL, expert-parallel all-to-all...)"),
                    "where": st.column_config.TextColumn("Runs on"),
                    "calls": st.column_config.NumberColumn("Calls"),
                    "ranks": st.column_config.NumberColumn("Ranks"),
                    "mean_message": st.column_config.TextColumn("Mean message")})
            st.dataframe(cdf, hide_index=True, width="stretch", column_config=config)
        else:
            st.info("No collective events in the profiled steps.")
    with tab_steps:
        steps = frame(result.steps)
        steps, config = unit_columns(steps, {c: (c[:-3].replace("_", " ").capitalize(), "ms") for c in steps.columns
                                             if c.endswith("_ms")})
        st.dataframe(steps, hide_index=True, width="stretch", column_config=config)
    if launch and launch.command:
        with st.expander("torchrun command"):
            st.code(launch.command, language="bash")
