"""The trace explorer's tables: headers with their units and acronyms, and long names that leave the numbers
beside them in view (the vLLM trace's kernel table cut its 'Mean' and share columns at 1280 px)."""

import pandas as pd
import pytest

from ui.views import traces


@pytest.fixture
def shown(monkeypatch):
    calls = []
    monkeypatch.setattr(traces.st, "dataframe", lambda df, **kw: calls.append((df, kw)))
    monkeypatch.setattr(traces.st, "caption", lambda *a, **kw: calls.append((None, a)))
    return calls


def test_headers_keep_acronyms_and_units(shown):
    traces._table(pd.DataFrame({"phase": ["mixed"], "median_us": [307_700.0], "median_gpu_busy_us": [156_100.0],
                                "GEMM_us": [120.0], "pct": [53.4], "batch_size_median": [46.0]}))
    (df, kw), = shown
    labels = {c: v["label"] for c, v in kw["column_config"].items()}
    assert labels == {"phase": "Phase", "median_us": "Median (ms)", "median_gpu_busy_us": "Median GPU busy (ms)",
                      "GEMM_us": "GEMM (ms)", "pct": "Share (%)", "batch_size_median": "Batch size median"}
    assert df["median_gpu_busy_us"].tolist() == [156.1]  # one scale, ms, for the table's times


def test_a_long_name_column_gets_a_width_and_short_ones_fit_their_text(shown):
    name = "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1_AFC1"
    traces._table(pd.DataFrame({"name": [name, "kernel_unified_attention_2d"], "kind": ["compute"] * 2,
                                "calls": [24, 24], "total_us": [9150.0, 5150.0], "max_us": [390.0, 310.0],
                                "mean_us": [380.0, 210.0], "pct": [5.86, 3.3]}))
    (df, kw), = shown
    config = kw["column_config"]
    assert config["name"]["width"] == 260  # beside six columns: the numbers keep 560 px of an 820 px table
    assert "width" not in config["kind"] or config["kind"]["width"] is None
    assert df["name"].tolist()[0] == name  # the cell keeps the whole name
    traces._table(pd.DataFrame({"annotation": [name], "time_us": [1.0]}))
    assert shown[-1][1]["column_config"]["annotation"]["width"] == 400  # few columns: wider


def test_a_missing_number_reads_as_said_never_none(shown):
    """The diff table showed 'None' as an added operator's after / before ratio."""
    traces._table(pd.DataFrame({"name": ["aten::mm", "aten::relu"], "time_us_before": [40.0, 0.0],
                                "ratio": [0.5, None], "batch_size": [None, None]}),
                  {"ratio": "After / before (x)"}, missing={"ratio": "new"})
    (df, kw), = shown
    assert df["ratio"].tolist() == ["0.5", "new"] and df["batch_size"].tolist() == ["n/a", "n/a"]
    assert kw["column_config"]["ratio"]["label"] == "After / before (x)"
    assert kw["column_config"]["ratio"]["alignment"] == "right"
