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


def test_a_store_that_is_not_a_database_is_moved_aside_and_a_fresh_one_serves(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec=None, options={}, cache_key="k", model_label="m", device="cpu")
    art = store.artifact_dir(rid)
    art.mkdir(parents=True, exist_ok=True)
    (art / "result.bin").write_bytes(b"kept")
    store.finish_run(rid, "ok", result={"metrics": {}})
    (tmp_path / "runs.sqlite").write_bytes(b"this is not a database, it was overwritten by a job" * 100)
    for side in ("-wal", "-shm"):
        (tmp_path / f"runs.sqlite{side}").unlink(missing_ok=True)
    again = Store(tmp_path)
    aside = list(tmp_path.glob("runs.sqlite.corrupt-*"))
    assert [p.name for p in aside if "-wal" not in p.name and "-shm" not in p.name] and again.notices
    assert "moved aside to runs.sqlite.corrupt-" in again.notices[0] and "artifacts are kept" in again.notices[0]
    assert (art / "result.bin").read_bytes() == b"kept"  # stored artifacts are never deleted
    new = again.create_run("summary", spec=None, options={}, cache_key="k2", model_label="m", device="cpu")
    again.finish_run(new, "ok", result={"metrics": {}})
    assert [r.id for r in again.list()] == [new]


def test_a_store_damaged_while_in_use_is_set_aside_on_the_next_call(tmp_path):
    store = Store(tmp_path)
    (tmp_path / "runs.sqlite").write_bytes(b"\0garbage" * 1000)
    for side in ("-wal", "-shm"):
        (tmp_path / f"runs.sqlite{side}").unlink(missing_ok=True)
    try:
        store.list()
    except Exception:
        pass  # the call that finds the damage may fail; the next one starts afresh
    assert store.list() == [] and store.notices
