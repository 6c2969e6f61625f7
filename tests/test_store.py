import json

from diagnostics.store import Store


def test_write_reopen_list_and_cache(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec={"name": "mlp"}, options={"a": 1}, cache_key="k1",
                           model_label="mlp (sample)", device="cpu")
    assert store.get(rid).status == "running"
    store.finish_run(rid, "ok", result={"metrics": {"params_total": 5}, "rows": [1, 2]})
    again = Store(tmp_path)  # a fresh handle on the same folder: nothing lost
    rec = again.get(rid)
    assert rec.status == "ok" and rec.result["rows"] == [1, 2] and rec.metrics == {"params_total": 5}
    assert rec.options == {"a": 1} and rec.duration_s >= 0
    assert [r.id for r in again.list()] == [rid]
    assert again.list()[0].result is None  # listing leaves bodies out
    assert again.find_cached("k1").id == rid
    assert again.find_cached("other") is None


def test_failed_runs_are_not_cache_hits(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec=None, options={}, cache_key="k", model_label=None, device="cpu")
    store.finish_run(rid, "error", error="the model rejected its inputs")
    assert store.find_cached("k") is None
    assert store.get(rid).error == "the model rejected its inputs"


def test_dead_running_rows_are_marked_interrupted(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec=None, options={}, cache_key=None, model_label=None, device="cpu",
                           pid=2**22 + 12345)
    assert store.mark_interrupted() == 1
    rec = store.get(rid)
    assert rec.status == "interrupted" and "stopped before it finished" in rec.error
