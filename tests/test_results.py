"""Typed results (diagnostics.results) and what their declaration says (diagnostics.declare): units on the
metrics' fields, typed table rows, one plain form that round-trips, stored results of older runs read."""

from __future__ import annotations

import json
import math
from typing import Annotated

import msgspec
import pytest

from diagnostics.declare import Analysis, column, metric, table
from diagnostics.results import (UNSET, Disturbance, Record, Result, ResultError, UnsetType, checked, decode,
                                 disturbance_of, metrics_of, notes_of, to_json, to_plain, with_disturbance)


class Layer(Record, frozen=True, kw_only=True):
    name: str
    params: Annotated[int, column("count", "parameters")]
    flops: Annotated[int | None, column("flop", "FLOPs")]
    shape: tuple[int, ...] | None = None


class Part(Record, frozen=True, kw_only=True):
    kind: str
    peak_bytes: Annotated[int, column("bytes", "peak")]


class Estimate(Record, frozen=True, kw_only=True):
    parts: Annotated[tuple[Part, ...], table("Estimate by kind")]
    total_bytes: int


class DemoMetrics(Record, frozen=True, kw_only=True):
    params_total: Annotated[int, metric("count", "Parameters", better="lower")]
    latency_ms: Annotated[float | None, metric("ms", "Latency", better="lower")]
    per_token: Annotated[float | None | UnsetType, metric("flop", "FLOPs per token")] = UNSET


class DemoResult(Result, frozen=True, kw_only=True):
    model: str
    metrics: DemoMetrics
    layers: Annotated[tuple[Layer, ...], table("Layers")]
    estimate: Estimate


DEMO = Analysis("demo", "Demo", "x:y", result=DemoResult, view="ui.views.validate:show")


def demo(**metrics) -> DemoResult:
    m = DemoMetrics(params_total=10, latency_ms=1.5, **metrics)
    return DemoResult(model="mlp (sample)", metrics=m, notes=("one note",),
                      layers=(Layer(name="fc", params=10, flops=None, shape=(2, 3)),),
                      estimate=Estimate(parts=(Part(kind="weights", peak_bytes=40),), total_bytes=40))


def test_the_declaration_reads_units_and_tables_from_the_result_type():
    assert [(m.key, m.unit, m.label, m.better) for m in DEMO.metrics] == [
        ("params_total", "count", "Parameters", "lower"), ("latency_ms", "ms", "Latency", "lower"),
        ("per_token", "flop", "FLOPs per token", "")]
    assert [(t.path, t.title, [(c.key, c.unit) for c in t.columns]) for t in DEMO.tables] == [
        ("layers", "Layers", [("params", "count"), ("flops", "flop")]),
        ("estimate.parts", "Estimate by kind", [("peak_bytes", "bytes")])]
    assert DEMO.metric("latency_ms").unit == "ms" and DEMO.table("estimate.parts").unit("peak_bytes") == "bytes"


class NoUnit(Record, frozen=True, kw_only=True):
    latency_ms: float


class Bad(Result, frozen=True, kw_only=True):
    metrics: NoUnit


class NotRows(Result, frozen=True, kw_only=True):
    layers: Annotated[tuple[int, ...], table("Layers")]


def test_a_metric_without_a_unit_or_a_table_without_rows_is_refused_at_declaration():
    with pytest.raises(ValueError, match=r"NoUnit.latency_ms: a metric without a unit"):
        Analysis("bad", "Bad", "x:y", result=Bad, view="m:f")
    with pytest.raises(ValueError, match=r"NotRows.layers: a table must hold typed rows"):
        Analysis("bad", "Bad", "x:y", result=NotRows, view="m:f")
    with pytest.raises(ValueError, match=r"declared on its result type DemoResult"):
        Analysis("bad", "Bad", "x:y", result=DemoResult, view="m:f", metrics=DEMO.metrics)
    with pytest.raises(ValueError, match=r"declare its view"):
        Analysis("bad", "Bad", "x:y")
    with pytest.raises(ValueError, match=r"its report must be 'module:function', not 'charts.demo'"):
        Analysis("bad", "Bad", "x:y", view="m:f", report="charts.demo")
    with pytest.raises(ValueError, match=r"metric 'Latency': unknown unit 'msec'"):
        metric("msec", "Latency")


def test_the_plain_form_round_trips_and_leaves_unset_fields_out():
    r = demo()
    plain = to_plain(r)
    assert plain == json.loads(to_json(r))  # lists, not tuples: the plain form is what JSON reads back
    assert plain["metrics"] == {"params_total": 10, "latency_ms": 1.5}  # per_token not measured: left out
    assert "disturbance" not in plain and "timing_cv" not in plain
    assert plain["layers"] == [{"name": "fc", "params": 10, "flops": None, "shape": [2, 3]}]
    assert decode(DEMO, plain) == r and decode(DEMO, json.loads(to_json(r))) == r
    assert to_plain(demo(per_token=None))["metrics"]["per_token"] is None  # measured, not available: kept
    assert metrics_of(r) == plain["metrics"] and notes_of(r) == ("one note",)
    # NaN survives as the store always wrote it (Python's json), not as null
    nan = demo(per_token=float("nan"))
    assert math.isnan(decode(DEMO, json.loads(to_json(nan))).metrics.per_token)


def test_decoding_is_lenient_with_old_keys_and_strict_with_types():
    plain = to_plain(demo())
    old = dict(plain, removed_field=1, metrics=dict(plain["metrics"], dropped_metric=3))
    assert decode(DEMO, old) == demo()  # keys a type no longer has: ignored
    with pytest.raises(ResultError, match=r"this demo result does not fit DemoResult: Expected `int`, got `str` - "
                                          r"at `\$.layers\[0\].params`"):
        decode(DEMO, dict(plain, layers=[dict(plain["layers"][0], params="ten")]))
    with pytest.raises(ResultError, match=r"Object missing required field `model`"):
        decode(DEMO, {k: v for k, v in plain.items() if k != "model"})
    with pytest.raises(ResultError, match=r"demo returned a list, not its result type DemoResult"):
        checked(DEMO, [1])


def test_an_untyped_analysis_keeps_its_plain_dict():
    untyped = Analysis("old", "Old", "x:y", view="m:f")
    plain = {"metrics": {"a": 1}, "notes": ["n"], "disturbance": None}
    assert decode(untyped, plain) is plain and to_plain(plain) is plain and checked(untyped, plain) == plain
    assert metrics_of(plain) == {"a": 1} and notes_of(plain) == ("n",) and disturbance_of(plain) is None


def test_the_runners_disturbance_report_goes_into_a_typed_result():
    report = {"wall_s": 1.0, "cpu_s": 0.9, "cpu_cores_used": 0.9, "other_processes_cores": 0.8, "cores": 2,
              "torch_threads": 2, "load_avg_1m_start": 1.0, "load_avg_1m_end": 1.2, "cv": 0.1, "disturbed": True,
              "reasons": ["other processes used 0.80 CPU cores"], "thresholds": {"cv": 0.3}}
    r = with_disturbance(demo(), report)
    assert isinstance(r.disturbance, Disturbance) and r.disturbance.disturbed and r.disturbance.cores == 2
    assert to_plain(r)["disturbance"] == report and disturbance_of(r) == r.disturbance
    assert with_disturbance({"metrics": {}}, report)["disturbance"] == report  # a dict result, as before


def test_results_are_frozen_and_pickle():
    import pickle

    r = demo()
    with pytest.raises(AttributeError):
        r.model = "x"
    assert pickle.loads(pickle.dumps(r)) == r  # results go through st.cache_data and the runner's pipe
    assert isinstance(r, msgspec.Struct)


def test_the_store_keeps_the_plain_form_and_it_decodes_back(tmp_path):
    from diagnostics.store import Store

    store = Store(tmp_path)
    run = store.create_run("demo", spec=None, options={}, cache_key="k", model_label="m", device="cpu")
    r = demo()
    store.finish_run(run, "ok", result=r)
    rec = store.get(run)
    assert rec.result == to_plain(r) and rec.metrics == {"params_total": 10, "latency_ms": 1.5}
    assert decode(DEMO, rec.result) == r


def test_a_job_building_its_result_from_a_dict_may_not_write_undeclared_keys():
    from diagnostics.results import build

    plain = to_plain(demo())
    assert build(DemoResult, plain) == demo()
    with pytest.raises(ResultError, match=r"the result has fields DemoResult does not declare: \$.layers\[0\].flop$"):
        build(DemoResult, dict(plain, layers=[dict(plain["layers"][0], flop=3)]))
    with pytest.raises(ResultError, match=r"the result does not fit DemoResult: Expected `str`, got `int` - at `\$.model`"):
        build(DemoResult, dict(plain, model=3))


class DemoPartial(Record, frozen=True, kw_only=True):
    stage: str
    layers: tuple[Layer, ...]
    total_bytes: int | UnsetType = UNSET


def test_a_partial_result_has_its_own_declared_type_and_the_same_serialisation():
    from diagnostics.results import checked_partial, decode_partial

    with_partial = Analysis("demo", "Demo", "x:y", result=DemoResult, partial=DemoPartial, view="ui.views.validate:show")
    sent = DemoPartial(stage="built", layers=(Layer(name="fc", params=10, flops=None),))
    got = checked_partial(with_partial, sent)  # what the worker's pipe and the runner make of it
    assert got == sent and to_plain(got) == {"stage": "built", "layers": [{"name": "fc", "params": 10, "flops": None,
                                                                           "shape": None}]}
    assert decode_partial(with_partial, to_plain(got)) == sent
    with pytest.raises(ResultError, match=r"this demo partial result does not fit DemoPartial: Expected `int`, "
                                          r"got `str` - at `\$.total_bytes`"):
        decode_partial(with_partial, {"stage": "built", "layers": [], "total_bytes": "40"})
    with pytest.raises(ResultError, match="demo reported a DemoResult, not its partial type DemoPartial"):
        checked_partial(with_partial, demo())
    assert decode_partial(DEMO, {"stage": "x"}) == {"stage": "x"}  # no partial type declared: a plain dict
    with pytest.raises(ValueError, match="its partial result type must be a Struct or a dataclass"):
        Analysis("demo", "Demo", "x:y", partial=dict, view="ui.views.validate:show")
