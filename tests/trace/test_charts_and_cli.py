"""Chart builders draw every result (and empty ones); the CLI prints and exits as documented."""

import json
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest

from diagnostics.render.charts import traces as charts
from diagnostics.results import to_json
from diagnostics.trace import (
    diff_traces, idle_time, launch_stats, load_trace, summary, temporal_breakdown, timeline_data,
    top_operators,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "traces"


@pytest.mark.parametrize("name", ["gpu_small.json", "cpu_small.pt.trace.json.gz"])
def test_every_builder_returns_a_figure(name):
    t = load_trace(DATA / name)
    top = top_operators(t, n=20)
    tb = temporal_breakdown(t)
    figs = [charts.build_category_figure(summary(t)),
            charts.build_gpu_breakdown_figure(tb),
            charts.build_cpu_breakdown_figure(tb),
            charts.build_top_operators_figure(top, "operators"),
            charts.build_top_operators_figure(top, "kernels"),
            charts.build_idle_time_figure(idle_time(t)),
            charts.build_launch_figure(launch_stats(t, n=20)),
            charts.build_timeline_figure(timeline_data(t)),
            charts.build_diff_figure(diff_traces(t, t))]
    for fig in figs:
        assert isinstance(fig, go.Figure)
        fig.to_json()


def test_gpu_breakdown_values():
    fig = charts.build_gpu_breakdown_figure(temporal_breakdown(load_trace(DATA / "gpu_small.json")))
    bars = {b.name: list(b.y) for b in fig.data}
    assert bars["compute"] == [0.032, 0.040] and bars["idle"] == [0.039, 0.013]   # step 1: until step 2's GPU work


def test_diff_figure_colours_by_status():
    r = diff_traces(load_trace(DATA / "diff_before.json"), load_trace(DATA / "diff_after.json"))
    fig = charts.build_diff_figure(r)
    assert sum(len(t.y) for t in fig.data) == 4   # unchanged rows are left out
    # a trace per status, named in the legend, in its colour
    assert {t.name: (list(t.y), t.marker.color) for t in fig.data} == {
        s: ([n], charts.STATUS_COLORS[s]) for s, n in (("faster", "aten::mm"), ("slower", "aten::copy_"),
                                                       ("added", "aten::relu"), ("removed", "aten::add"))}
    assert list(fig.layout.yaxis.categoryarray)[::-1] == [row.name for row in r.rows if row.status != "unchanged"]


def cli(capsys, tmp_path, *argv) -> tuple[int, str, str]:
    """``python -m diagnostics trace ...`` in this process (the job still runs in a worker)."""
    from diagnostics.cli.main import main

    try:
        code = main(["trace", *map(str, argv), "--no-report", "-q", "--data-dir", str(tmp_path / "data")])
    except SystemExit as e:  # argparse refusing the command line
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_analyze_text_and_json(capsys, tmp_path):
    code, out, _ = cli(capsys, tmp_path, "analyze", DATA / "gpu_small.json", "--top", "2")
    assert code == 0 and "41 events" in out and "2 steps" in out and "aten::mm" in out
    code, out, _ = cli(capsys, tmp_path, "analyze", DATA / "gpu_small.json", "--json")
    data = json.loads(out)
    assert data["summary"]["n_steps"] == 2
    assert data["top_operators"]["operators"][0]["name"] == "aten::mm"


def test_cli_diff_and_errors(capsys, tmp_path):
    before, after = DATA / "diff_before.json", DATA / "diff_after.json"
    code, out, _ = cli(capsys, tmp_path, "diff", before, after)
    assert code == 0 and "1 added, 1 removed, 1 faster, 1 slower" in out
    code, out, _ = cli(capsys, tmp_path, "diff", before, after, "--json")
    assert json.loads(out)["diff"]["counts"]["added"] == 1
    bad = tmp_path / "bad.json.gz"
    bad.write_text("{}")
    code, _, err = cli(capsys, tmp_path, "analyze", bad)
    assert code == 2 and "not gzip" in err  # what was given cannot be used: exit 2, the reason named
    code, _, err = cli(capsys, tmp_path, "frobnicate")
    assert code == 2 and "invalid choice: 'frobnicate'" in err


def test_module_entry_point_and_no_streamlit(tmp_path):
    code = ("import sys, diagnostics.trace, diagnostics.render.text, diagnostics.render.charts.traces; "
            "assert 'streamlit' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    out = subprocess.run([sys.executable, "-m", "diagnostics", "trace", "analyze", str(DATA / "cpu_small.pt.trace.json.gz"),
                          "--no-report", "-q", "--data-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "3 steps" in out.stdout


def test_text_is_formatted_from_a_result_and_top_limits_its_rows(tmp_path):
    from diagnostics.render.text import format_analysis, format_diff
    from diagnostics.runner import Job, execute

    result = execute(Job("trace", None, {"path": str(DATA / "gpu_small.json")}), tmp_path)
    assert len(result.top_operators.operators) == 4  # every operator kept (fewer than TOP_N)
    text = format_analysis(result, 1)
    assert "Top 1 of 4 operators by self time" in text and "Top 1 of 5 GPU kernels" in text
    r = diff_traces(load_trace(DATA / "diff_before.json"), load_trace(DATA / "diff_after.json"))
    lines = format_diff(r, "a.json", "b.json", 2).splitlines()
    assert lines[0].startswith("a.json -> b.json (per step)") and len(lines) == 2 + 1 + 2  # head, blank, header, 2


def test_diagnostics_trace_json_is_the_trace_layer_s_figures(tmp_path, capsys):
    """`python -m diagnostics trace analyze --json` (a worker job) prints what the trace layer computes in process."""
    path = DATA / "cpu_small.pt.trace.json.gz"
    code, out, _ = cli(capsys, tmp_path, "analyze", path, "--json")
    assert code == 0
    shown = json.loads(out)
    t = load_trace(path)
    parts = {"summary": summary(t), "top_operators": top_operators(t, n=20), "temporal_breakdown": temporal_breakdown(t),
             "idle_time": idle_time(t), "launch_stats": launch_stats(t, n=20)}
    bare = {key: json.loads(to_json(part)) for key, part in parts.items()}
    for key in ("summary", "top_operators", "temporal_breakdown", "idle_time", "launch_stats"):
        assert shown[key] == bare[key], key
    assert shown["name"] == path.name and shown["path"] == str(path.resolve())
    assert shown["metrics"]["steps"] == bare["summary"]["n_steps"] == 3


def test_an_uploaded_trace_is_named_by_its_own_file_name_in_errors_and_results(tmp_path):
    from diagnostics.runner import Job, execute
    from diagnostics.trace.errors import TraceError

    stored = tmp_path / "trace.json"  # how uploads are stored
    stored.write_text('{"traceEvents": {"ph": "X"}}')
    with pytest.raises(TraceError, match=r"^worker3\.json: not a trace: its traceEvents is an object"):
        execute(Job("trace", None, {"path": str(stored), "display_name": "worker3.json"}), tmp_path / "a")
    stored.write_text((DATA / "gpu_small.json").read_text())
    result = execute(Job("trace", None, {"path": str(stored), "display_name": "worker3.json"}), tmp_path / "b")
    assert result.name == "worker3.json"


def test_diff_figure_axis_in_the_scale_of_its_changes():
    """The recorded pair changes by 5-20 µs: the axis reads µs (as the page's tiles and table do), not
    0.02 ms; each bar is the row's delta in that unit."""
    r = diff_traces(load_trace(DATA / "diff_before.json"), load_trace(DATA / "diff_after.json"))
    fig = charts.build_diff_figure(r)
    assert fig.layout.xaxis.title.text == "change in time (µs)"
    deltas = {row.name: row.delta_us for row in r.rows if row.status != "unchanged"}
    assert {y: x for t in fig.data for y, x in zip(t.y, t.x)} == deltas
    assert fig.layout.yaxis.automargin is True


def test_kernels_whose_names_share_a_long_prefix_stay_apart_in_rank_order():
    """The public vLLM trace: two ck_tile RMSNorm kernels alike for their first 60 characters were cut to one
    label and drawn as one bar at the chart's bottom (the 6th kernel below the 25th). Each row gets its own
    label, the larger the plain one, and the bars keep the table's order (the chart draws bottom-up)."""
    from msgspec.structs import replace

    t = load_trace(DATA / "gpu_small.json")
    top = top_operators(t, n=20)
    assert len(top.kernels) >= 3
    stem = "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePass"
    kernels = list(top.kernels)
    kernels[0] = replace(kernels[0], name=stem + "ILb1EEE")
    kernels[-1] = replace(kernels[-1], name=stem + "ILb0EEE")
    (bar,) = charts.build_top_operators_figure(replace(top, kernels=tuple(kernels)), "kernels").data
    labels = list(bar.y)[::-1]  # top of the chart first, as the table
    assert len(set(labels)) == len(labels) == len(kernels)
    assert labels[0].endswith("…") and labels[-1] == labels[0] + " (2)"
    assert list(bar.x)[::-1] == pytest.approx([k.total_us / 1000 for k in kernels])
    assert [c[2] for c in bar.customdata][::-1] == [k.name for k in kernels]  # the hover keeps the full names


def test_diff_bars_of_names_alike_stay_apart():
    t = load_trace(DATA / "gpu_small.json")
    d = diff_traces(t, t)
    from msgspec.structs import replace

    rows = [replace(r, name="x" * 80 + str(i), status="slower", delta_us=10.0 - i) for i, r in enumerate(d.rows[:3])]
    fig = charts.build_diff_figure(replace(d, rows=tuple(rows)))
    order = list(fig.layout.yaxis.categoryarray)[::-1]
    assert len(set(order)) == 3 and order[1].endswith(" (2)") and sorted(fig.data[0].y) == sorted(order)


def test_a_trace_without_steps_is_one_bar_named_for_what_it_is():
    """The vLLM server trace has no ProfilerStep: its per-step charts drew one bar labelled '-1'."""
    tb = temporal_breakdown(load_trace(DATA / "with_stack" / "vllm_prefilldecode_piecewise.json.gz"))
    assert [r.step for r in tb.gpu] == [-1]
    gpu = charts.build_gpu_breakdown_figure(tb)
    cpu = charts.build_cpu_breakdown_figure(tb)
    assert {x for fig in (gpu, cpu) for t in fig.data for x in t.x} == {"whole trace (no steps)"}
    busy = sum(t.y[0] for t in gpu.data if t.name != "idle")
    assert busy == pytest.approx(156.1, abs=0.05)  # the GPU busy time the Summary's stream table reads
    tb2 = temporal_breakdown(load_trace(DATA / "gpu_small.json"))
    assert all(x.isdigit() for t in charts.build_gpu_breakdown_figure(tb2).data for x in t.x)
