"""diagnostics.history: two stored runs compared metric by metric, and a metric's trend over runs."""

from __future__ import annotations

import math

import pytest

from diagnostics.history import (CompareError, Comparison, MEDIAN_SE_FACTOR, NOISE_Z, PerRun, SettingChange, TracePair,
                                 Trend, compare_runs, timing_noise, trend)
from diagnostics.results import to_plain
from diagnostics.store import RunRecord


def rec(run_id, analysis="profile", *, metrics, started=0.0, status="ok", options=None, model="cnn (sample)",
        spec=None, result=None, artifacts=None):
    return RunRecord(id=run_id, analysis=analysis, status=status, cache_key=None, model_label=model,
                     spec=spec or {"source": "sample", "name": "cnn", "batch_size": 8},
                     options=options or {"latency_iters": 30}, device="cpu", source="app", started=started,
                     finished=started + 1, duration_s=1.0, metrics=metrics,
                     result=result if result is not None else {"metrics": metrics}, error=None,
                     artifacts=artifacts or {})


def row(c, key):
    return next(r for r in c.rows if r.key == key)


def test_each_metric_gets_its_change_and_a_verdict_by_its_declared_direction():
    a = rec("a", metrics={"latency_median_ms": 10.0, "latency_std_ms": 0.1, "throughput_samples_per_s": 800.0,
                          "batch_size": 8, "mfu": 0.2})
    b = rec("b", metrics={"latency_median_ms": 8.0, "latency_std_ms": 0.1, "throughput_samples_per_s": 1000.0,
                          "batch_size": 8, "mfu": 0.1}, started=10)
    c = compare_runs(a, b)
    lat = row(c, "latency_median_ms")
    assert lat.delta == pytest.approx(-2.0) and lat.ratio == pytest.approx(0.8)
    assert lat.change_pct == pytest.approx(-20.0) and lat.verdict == "better"
    assert lat.a_text.startswith("10") and lat.a_text.endswith(" ms") and lat.b_text.startswith("8")
    assert row(c, "throughput_samples_per_s").verdict == "better"  # higher is better
    assert row(c, "mfu").verdict == "worse"
    assert row(c, "batch_size").verdict == "same"
    assert c.counts.better == 2 and c.counts.worse == 1
    assert [r.key for r in c.rows][:2] == ["latency_median_ms", "latency_std_ms"]  # declaration order


def test_a_latency_change_inside_the_runs_spread_is_within_noise():
    # std 2 ms over 30 iterations each: band = 2 * sqrt(2 * (1.2533 * 2)^2 / 30) ms
    band = NOISE_Z * math.sqrt(2 * (MEDIAN_SE_FACTOR * 2.0) ** 2 / 30)
    assert band == pytest.approx(1.2946, abs=1e-3)
    a = rec("a", metrics={"latency_median_ms": 10.0, "latency_std_ms": 2.0})
    near = rec("b", metrics={"latency_median_ms": 10.0 + 0.9 * band, "latency_std_ms": 2.0})
    far = rec("c", metrics={"latency_median_ms": 10.0 + 1.1 * band, "latency_std_ms": 2.0})
    assert timing_noise(a, near) == pytest.approx(band)
    assert row(compare_runs(a, near), "latency_median_ms").verdict == "within noise"
    assert row(compare_runs(a, far), "latency_median_ms").verdict == "worse"
    # p99 scatters more than the median: its band is wider (3.7328 vs 1.2533 standard errors per sigma)
    assert timing_noise(a, near, "latency_p99_ms") == pytest.approx(band * 3.7328 / MEDIAN_SE_FACTOR)
    a99 = rec("a", metrics={"latency_p99_ms": 10.0, "latency_std_ms": 2.0})
    b99 = rec("b", metrics={"latency_p99_ms": 10.0 + 2 * band, "latency_std_ms": 2.0})
    assert row(compare_runs(a99, b99), "latency_p99_ms").verdict == "within noise"
    # without a std the band is unknown: no "within noise", the direction decides
    bare = rec("d", metrics={"latency_median_ms": 10.5})
    assert timing_noise(a, bare) is None
    assert row(compare_runs(a, bare), "latency_median_ms").verdict == "worse"


def test_settings_that_differ_and_busy_runs_are_said():
    a = rec("a", metrics={"latency_median_ms": 1.0}, options={"latency_iters": 30, "record_shapes": True})
    b = rec("b", metrics={"latency_median_ms": 1.0}, options={"latency_iters": 30, "record_shapes": False},
            spec={"source": "sample", "name": "cnn", "batch_size": 16},
            result={"disturbance": {"disturbed": True}})
    c = compare_runs(a, b)
    assert SettingChange(setting="model.batch_size", a=8, b=16) in c.settings
    assert SettingChange(setting="record_shapes", a=True, b=False) in c.settings
    assert c.disturbed == PerRun(a=False, b=True)
    assert any("Run B was timed on a busy machine" in n for n in c.notes)
    assert any("not interleaved" in n for n in c.notes)


def test_missing_values_are_not_compared_as_zero():
    a = rec("a", "memory", metrics={"peak_train_bytes": 1000, "reserved_train_bytes": None})
    b = rec("b", "memory", metrics={"peak_train_bytes": 1500, "reserved_train_bytes": None})
    c = compare_runs(a, b)
    assert row(c, "peak_train_bytes").verdict == "worse" and row(c, "peak_train_bytes").ratio == 1.5
    r = row(c, "reserved_train_bytes")
    assert r.verdict == "n/a" and r.delta is None and r.a_text == "n/a"


def test_checklist_score_up_is_better_and_failures_down_is_better():
    a = rec("a", "checklist", metrics={"score": 60.0, "fail": 3})
    b = rec("b", "checklist", metrics={"score": 75.0, "fail": 1})
    c = compare_runs(a, b)
    assert row(c, "score").verdict == "better" and row(c, "fail").verdict == "better"


def test_both_traces_offered_for_a_diff_only_when_both_runs_kept_one(tmp_path):
    ta, tb = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    a = rec("a", metrics={"latency_median_ms": 1.0}, artifacts={"trace.json.gz": str(ta)})
    b = rec("b", metrics={"latency_median_ms": 1.0}, artifacts={"trace.json.gz": str(tb)})
    assert compare_runs(a, b).traces == TracePair(a=str(ta), b=str(tb))
    assert compare_runs(a, rec("c", metrics={"latency_median_ms": 1.0})).traces is None


def test_runs_that_cannot_be_compared_say_why():
    p = rec("p", metrics={"latency_median_ms": 1.0})
    with pytest.raises(CompareError, match="run A is a 'profile' run and run B a 'memory' run"):
        compare_runs(p, rec("m", "memory", metrics={"peak_train_bytes": 1}))
    failed = rec("f", metrics={}, status="failed")
    with pytest.raises(CompareError, match=r"run B \(f\) is 'failed', not ok"):
        compare_runs(p, failed)


def test_trend_orders_runs_by_time_and_counts_runs_without_the_metric():
    runs = [rec("r2", metrics={"latency_median_ms": 2.0}, started=20),
            rec("r1", metrics={"latency_median_ms": 3.0}, started=10),
            rec("r3", metrics={}, started=30),
            rec("r4", metrics={"latency_median_ms": 9.0}, started=40, model="mlp (sample)"),
            rec("r5", metrics={"latency_median_ms": 1.0}, started=50, status="failed")]
    t = trend(runs, "profile", "latency_median_ms", "cnn (sample)")
    assert [(r.id, r.value) for r in t.rows] == [("r1", 3.0), ("r2", 2.0)]
    assert t.missing == 1 and t.unit == "ms" and t.better == "lower"
    assert len(trend(runs, "profile", "latency_median_ms").rows) == 3
    with pytest.raises(CompareError, match="'profile' has no metric 'latency'; its metrics: latency_median_ms"):
        trend(runs, "profile", "latency")


def test_figures_have_units_and_colours_by_verdict():
    from diagnostics.render.charts.history import VERDICT_COLORS, build_compare_figure, build_trend_figure

    a = rec("a", metrics={"latency_median_ms": 10.0, "mfu": 0.2})
    b = rec("b", metrics={"latency_median_ms": 5.0, "mfu": 0.1})
    fig = build_compare_figure(compare_runs(a, b))
    bars = fig.data[0]
    assert list(bars.y) == ["Latency (median)", "MFU"] and list(bars.x) == [pytest.approx(-50.0), pytest.approx(-50.0)]
    assert list(bars.marker.color) == [VERDICT_COLORS["better"], VERDICT_COLORS["worse"]]
    assert fig.layout.xaxis.title.text == "change from run A (%)"
    mem = [rec(f"m{i}", "memory", metrics={"peak_train_bytes": v}, started=i * 60) for i, v in
           enumerate([3 * 2**20, 5 * 2**20])]
    tf = build_trend_figure(trend(mem, "memory", "peak_train_bytes"))
    assert list(tf.data[0].y) == [3.0, 5.0] and tf.layout.yaxis.title.text == "Training-step peak (MiB)"
    assert tf.layout.xaxis.tickformat == "%H:%M:%S"  # runs minutes apart: clock times, not milliseconds


def test_trend_lines_join_only_runs_of_the_same_mode_and_settings():
    """Issue #31: an inference profile (62 ms) and a training one (347 ms) on one line read as a
    regression. Each mode (and each other setting) is a series of its own, drawn as its own line."""
    from diagnostics.render.charts.history import build_trend_figure

    runs = [rec("i1", metrics={"latency_median_ms": 62.0}, started=10, options={"mode": "inference"}),
            rec("t1", metrics={"latency_median_ms": 347.0}, started=20, options={"mode": "train"}),
            rec("i2", metrics={"latency_median_ms": 60.0}, started=30, options={"mode": "inference"}),
            rec("t2", metrics={"latency_median_ms": 340.0}, started=40, options={"mode": "train"}),
            rec("b1", metrics={"latency_median_ms": 99.0}, started=50, options={"mode": "inference"},
                spec={"source": "sample", "name": "cnn", "batch_size": 16})]
    t = trend(runs, "profile", "latency_median_ms", "cnn (sample)")
    assert [s.label for s in t.series] == ["mode=inference, model.batch_size=8", "mode=train, model.batch_size=8",
                                                  "mode=inference, model.batch_size=16"]
    assert [(r.id, r.series) for r in t.rows] == [("i1", 0), ("t1", 1), ("i2", 0), ("t2", 1), ("b1", 2)]
    fig = build_trend_figure(t)
    lines = {tr.name: [float(y) for y in tr.y] for tr in fig.data}
    assert lines == {"mode=inference, model.batch_size=8": [62.0, 60.0], "mode=train, model.batch_size=8": [347.0, 340.0],
                     "mode=inference, model.batch_size=16": [99.0]}
    assert fig.data[2].mode == "markers" and fig.layout.showlegend  # a lone run is a point, not a line
    same = trend(runs[:1] + runs[2:3], "profile", "latency_median_ms")
    assert len(same.series) == 1 and same.series[0].label == "every run"


def test_the_compare_chart_keeps_small_changes_readable_beside_a_huge_one():
    """Issue #31: one "+200,000 %" bar squashed every other bar. The axis fits the changes it can show side
    by side; the huge one reaches the edge, hatched, its value written."""
    from diagnostics.render.charts.history import build_compare_figure

    a = rec("a", metrics={"latency_median_ms": 10.0, "mfu": 0.2, "kernel_time_ms": 0.001})
    b = rec("b", metrics={"latency_median_ms": 9.0, "mfu": 0.21, "kernel_time_ms": 2.001})
    fig = build_compare_figure(compare_runs(a, b))
    bars = fig.data[0]
    lo, hi = fig.layout.xaxis.range
    assert hi == -lo and hi <= 2 * 10.0 * 1.15  # the largest readable change (-10 %) sets the scale
    x = dict(zip(bars.y, bars.x))
    assert x["Latency (median)"] == pytest.approx(-10.0) and x["MFU"] == pytest.approx(5.0)
    assert 0 < x["GPU kernel time"] <= hi  # drawn to the edge, not 200,000 % wide
    text = dict(zip(bars.y, bars.text))
    assert text["GPU kernel time"] == "+200,000.0 % (off scale)" and text["MFU"] == "+5.0 %"
    assert dict(zip(bars.y, bars.marker.pattern.shape))["GPU kernel time"] == "/"


def test_a_comparison_and_a_trend_are_typed_records_whose_plain_form_keeps_the_old_keys():
    """History's compare and trend return Comparison / Trend; their plain form (``history ... --json``) keeps
    the keys the dicts had, the verdict counts keyed by the verdict's text, and decodes back to the record."""
    import msgspec

    a = rec("a", metrics={"latency_median_ms": 10.0, "mfu": 0.2})
    b = rec("b", metrics={"latency_median_ms": 10.0, "mfu": None}, started=10, result={"disturbance": {"disturbed": True}})
    c = compare_runs(a, b)
    assert isinstance(c, Comparison) and c.counts.same == 1 and c.counts.na == 1 and c.counts.within_noise == 0
    plain = to_plain(c)
    assert plain["counts"] == {"better": 0, "worse": 0, "same": 1, "within noise": 0, "changed": 0, "n/a": 1}
    assert list(plain) == ["analysis", "a", "b", "rows", "counts", "settings", "noise_ms", "disturbed", "notes",
                           "traces"]
    assert plain["a"] == {"id": "a", "started": 0.0, "model": "cnn (sample)", "device": "cpu"}
    assert plain["disturbed"] == {"a": False, "b": True} and plain["traces"] is None
    assert list(plain["rows"][0]) == ["key", "label", "unit", "better", "a", "b", "a_text", "b_text", "delta",
                                      "ratio", "change_pct", "verdict"]
    assert msgspec.convert(plain, Comparison) == c
    t = trend([a, b], "profile", "latency_median_ms")
    assert isinstance(t, Trend) and [(p.id, p.value, p.disturbed) for p in t.rows] == [("a", 10.0, False),
                                                                                       ("b", 10.0, True)]
    tp = to_plain(t)
    assert list(tp) == ["analysis", "metric", "label", "unit", "better", "model", "rows", "series", "missing",
                        "damaged"]
    assert tp["series"] == [{"label": "every run", "settings": {}, "runs": 2}]
    assert msgspec.convert(tp, Trend) == t
