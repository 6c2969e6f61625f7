"""The parsed-trace cache (diagnostics.trace.cache): hits, misses on a changed file, corrupt entries
rebuilt, LRU eviction under the bound, concurrent writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest

from diagnostics.trace import Trace, TraceError, load_trace
from diagnostics.trace import cache
from diagnostics.trace.cache import cached_load, entries, total_bytes

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "traces"


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def _same_trace(a: Trace, b: Trace) -> None:
    pd.testing.assert_frame_equal(a.events, b.events)
    for f in fields(Trace):
        if f.name not in Trace.EVENT_FIELDS:   # the events: compared as the frame above
            assert getattr(a, f.name) == getattr(b, f.name), f.name


def _trace_with(tmp_path: Path, name: str, kernel: str, n: int = 3) -> Path:
    """A small real-schema trace: n kernels named `kernel` on stream 7 and their launches."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 100 * n}]
    for i in range(n):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": 10 + 100 * i, "dur": 5, "args": {"correlation": i + 1}})
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": 20 + 100 * i,
                       "dur": 50, "args": {"correlation": i + 1, "device": 0, "stream": 7,
                                           "grid": [64, 1, 1], "block": [128, 1, 1]}})
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_a_deferred_write_keeps_the_entry_only_when_finished(tmp_path):
    """defer_write (the trace job, issue #42: the Summary first, then the Arrow file): no entry until
    finish_write, whose entry is then a hit equal to a fresh parse; dropping the views in between (a
    communication pattern) keeps the pending write; a second finish_write and one of a cache hit do nothing."""
    path = _copy(DATA / "gpu_small.json", tmp_path / "gpu_small.json")
    root = tmp_path / "cache"
    trace, hit = cached_load(path, root, defer_write=True)
    assert hit is False and entries(root) == [] and trace._frame is None
    trace.drop_views()
    cache.finish_write(trace)
    assert len(entries(root)) == 1 and trace._cache[cache.ENTRY] == entries(root)[0][2]
    cache.finish_write(trace)
    again, hit = cached_load(path, root, defer_write=True)
    assert hit is True and len(entries(root)) == 1
    cache.finish_write(again)
    assert len(entries(root)) == 1
    _same_trace(load_trace(path), again)


@pytest.mark.parametrize("name", ["gpu_small.json", "cpu_small.pt.trace.json.gz"])
def test_a_hit_after_a_miss_gives_the_same_trace(tmp_path, name):
    path = _copy(DATA / name, tmp_path / name)
    root = tmp_path / "cache"
    first, hit1 = cached_load(path, root)
    second, hit2 = cached_load(path, root)
    assert (hit1, hit2) == (False, True)
    _same_trace(first, second)
    _same_trace(load_trace(path), second)  # and the same as a fresh parse, category dtypes included
    assert second.events["name"].cat.categories.dtype == object
    assert len(entries(root)) == 1


def test_a_touched_or_resized_file_is_a_miss(tmp_path):
    path = _trace_with(tmp_path, "t.json", "kernel_a")
    root = tmp_path / "cache"
    assert cached_load(path, root)[1] is False
    assert cached_load(path, root)[1] is True
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000))  # touched: 1 µs later, same bytes
    assert cached_load(path, root)[1] is False
    assert cached_load(path, root)[1] is True
    # Rewritten with other content of the same size: a miss by the mtime the rewrite leaves ...
    text = path.read_text().replace("kernel_a", "kernel_b")
    path.write_text(text)
    trace, hit = cached_load(path, root)
    assert hit is False and "kernel_b" in set(trace.events["name"].astype(str))
    # ... and a changed size with the mtime put back is a miss too.
    mtime = path.stat().st_mtime_ns
    path.write_text(text + "\n ")
    os.utime(path, ns=(mtime, mtime))
    assert cached_load(path, root)[1] is False


def test_a_runs_stamp_is_the_caches_a_touch_within_the_second_is_a_new_job(tmp_path):
    from argparse import Namespace

    from diagnostics.cli.trace import trace_job

    path = _trace_with(tmp_path, "t.json", "kernel_a")
    args = Namespace(trace_command="analyze", path=str(path), top=None)
    _, before = trace_job(args)
    assert before["stamp"] == cache.stamp(path)  # one stamp: the run's options and the cache's key
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000))  # 1 µs later: seconds would not see it
    assert trace_job(args)[1]["stamp"] != before["stamp"]
    with pytest.raises(TraceError, match=f"trace file not found: {tmp_path / 'nope.json'}"):
        cache.stamp(tmp_path / "nope.json")


def test_link_events_shares_the_entry_file_or_says_it_cannot(tmp_path):
    path = _trace_with(tmp_path, "t.json", "k")
    root = tmp_path / "cache"
    for expect_hit in (False, True):  # kept on the first open, read on the second: both know their entry
        trace, hit = cached_load(path, root)
        assert hit is expect_hit
        dest = tmp_path / f"kept-{hit}.feather"
        assert cache.link_events(trace, dest) is True
        [(_, _, folder)] = entries(root)
        assert dest.stat().st_ino == (folder / cache.EVENTS_FILE).stat().st_ino
    assert cache.link_events(load_trace(path), tmp_path / "other.feather") is False  # not from the cache
    dest = tmp_path / "older.feather"
    dest.write_bytes(b"an older file")
    assert cache.link_events(trace, dest) is True  # replaced, not written through
    assert dest.stat().st_ino == (folder / cache.EVENTS_FILE).stat().st_ino
    _same_trace(trace, cached_load(path, root)[0])  # the entry is intact
    cache.evict(root, 0)  # evicted: the linked copy still reads
    assert not entries(root)
    pd.testing.assert_frame_equal(pd.read_feather(dest), pd.read_feather(tmp_path / "kept-False.feather"))
    assert cache.link_events(trace, tmp_path / "gone.feather") is False  # its entry is gone


def test_the_ingest_options_are_part_of_the_key(tmp_path):
    path = _trace_with(tmp_path, "t.json", "k")
    root = tmp_path / "cache"
    cached_load(path, root)
    assert cached_load(path, root, allow_truncated=True)[1] is False
    assert len(entries(root)) == 2


@pytest.mark.parametrize("damage", ["events", "meta", "missing_events", "other_stamp"])
def test_a_corrupt_entry_is_rebuilt_not_an_error(tmp_path, damage):
    path = _copy(DATA / "gpu_small.json", tmp_path / "gpu.json")
    root = tmp_path / "cache"
    good, _ = cached_load(path, root)
    [(_, _, folder)] = entries(root)
    if damage == "events":
        (folder / cache.EVENTS_FILE).write_bytes(b"ARROW1\x00\x00 not really")
    elif damage == "meta":
        text = (folder / cache.META_FILE).read_text()
        (folder / cache.META_FILE).write_text(text[: len(text) // 2])
    elif damage == "missing_events":
        (folder / cache.EVENTS_FILE).unlink()
    else:  # an entry that names another file's stamp
        meta = json.loads((folder / cache.META_FILE).read_text())
        meta["stamp"]["size"] += 1
        (folder / cache.META_FILE).write_text(json.dumps(meta))
    again, hit = cached_load(path, root)
    assert hit is False
    _same_trace(good, again)
    assert cached_load(path, root)[1] is True  # rebuilt
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # nothing left aside


def test_eviction_keeps_the_total_under_the_bound_least_recently_used_first(tmp_path):
    root = tmp_path / "cache"
    paths = [_trace_with(tmp_path, f"t{i}.json", f"kernel_{i}", n=50) for i in range(4)]
    cached_load(paths[0], root, limit=10 << 20)
    one = total_bytes(root)
    limit = int(2.5 * one)  # room for two entries of this size
    cached_load(paths[1], root, limit=limit)
    os.utime(entries(root)[0][2], ns=(1, 1))  # entry 0 used long ago ...
    assert cached_load(paths[0], root, limit=limit)[1] is True  # ... and now again: entry 1 is the oldest
    cached_load(paths[2], root, limit=limit)
    assert total_bytes(root) <= limit and len(entries(root)) == 2
    assert cached_load(paths[0], root, limit=limit)[1] is True
    assert cached_load(paths[2], root, limit=limit)[1] is True
    assert cached_load(paths[1], root, limit=limit)[1] is False  # evicted
    cached_load(paths[3], root, limit=limit)
    assert total_bytes(root) <= limit and len(entries(root)) == 2
    # An entry bigger than the whole bound is not kept at all, and evicts nothing.
    before = sorted(p.name for _, _, p in entries(root))
    big = _trace_with(tmp_path, "big.json", "big", n=400)
    assert cached_load(big, root, limit=limit)[1] is False
    assert sorted(p.name for _, _, p in entries(root)) == before


def test_a_zero_bound_turns_the_cache_off_and_a_bad_setting_is_named(tmp_path, monkeypatch):
    path = _trace_with(tmp_path, "t.json", "k")
    root = tmp_path / "cache"
    monkeypatch.setenv(cache.MAX_BYTES_ENV, "0")
    assert cached_load(path, root)[1] is False and cached_load(path, root)[1] is False
    assert not root.exists()
    monkeypatch.setenv(cache.MAX_BYTES_ENV, "lots")
    with pytest.raises(TraceError, match=r"TORCHSCOPE_TRACE_CACHE_MB='lots' is not a number"):
        cached_load(path, root)
    monkeypatch.setenv(cache.MAX_BYTES_ENV, "-1")
    with pytest.raises(TraceError, match=r"TORCHSCOPE_TRACE_CACHE_MB='-1' must be 0 or more"):
        cache.max_bytes()
    monkeypatch.setenv(cache.MAX_BYTES_ENV, "inf")
    with pytest.raises(TraceError, match=r"TORCHSCOPE_TRACE_CACHE_MB='inf' must be a finite number of megabytes"):
        cache.max_bytes()
    monkeypatch.setenv(cache.MAX_BYTES_ENV, "0.5")
    assert cache.max_bytes() == 2**19
    monkeypatch.setenv(cache.MAX_BYTES_ENV, " ")
    assert cache.max_bytes() == cache.MAX_BYTES == 4 << 30


_WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from diagnostics.trace import load_trace
from diagnostics.trace.cache import cache_key, stamp, write_entry
path, out = Path({path!r}), Path({out!r})
trace = load_trace(path)
s = stamp(path)
key = cache_key(s, {{"allow_truncated": False}})
go = Path({go!r})
import time
while not go.exists():
    time.sleep(0.001)
for _ in range(20):
    write_entry(out, key, trace, s, 1 << 30)
print("ok")
"""


def test_two_concurrent_writers_leave_one_whole_entry(tmp_path):
    path = _copy(DATA / "cpu_small.pt.trace.json.gz", tmp_path / "cpu.json.gz")
    root, go = tmp_path / "cache", tmp_path / "go"
    code = _WRITER.format(root=str(ROOT), path=str(path), out=str(root), go=str(go))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err
    assert len(entries(root)) == 1
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary folder left
    trace, hit = cached_load(path, root)
    assert hit is True
    _same_trace(load_trace(path), trace)


def test_a_runs_kept_columns_are_the_caches_form_read_back_checked(tmp_path):
    """One writer and one reader for an entry and a run's kept columns (issue 44): what a run keeps reads back
    as the trace it kept; a damaged, mismatched or other-version copy is a TraceError naming its folder; the
    form runs kept before (no version, no stamp) still reads when its columns match."""
    path = _copy(DATA / "gpu_small.json", tmp_path / "gpu.json")
    trace, _ = cached_load(path, tmp_path / "cache")   # kept: the run links the entry's events
    run = tmp_path / "run"
    run.mkdir()
    cache.write_columns(trace, run, cache.stamp(path))
    assert os.path.samefile(run / cache.EVENTS_FILE, trace._cache[cache.ENTRY] / cache.EVENTS_FILE)
    _same_trace(cache.read_columns(run), load_trace(path))
    _same_trace(cache.read_columns(run, cache.stamp(path)), trace)
    with pytest.raises(TraceError, match="kept for another file"):
        cache.read_columns(run, {**cache.stamp(path), "size": 1})

    meta = json.loads((run / cache.META_FILE).read_text())
    legacy = {k: v for k, v in meta.items() if k not in ("cache_version", "stamp", "n_events")}
    (run / cache.META_FILE).write_text(json.dumps(legacy))
    _same_trace(cache.read_columns(run), trace)
    with pytest.raises(TraceError, match="another version"):   # an entry must carry its version
        cache.read_columns(run, cache.stamp(path))
    (run / cache.META_FILE).write_text(json.dumps({**meta, "cache_version": cache.CACHE_VERSION - 1}))
    with pytest.raises(TraceError, match=rf"{run} was kept by another version \({cache.CACHE_VERSION - 1}"):
        cache.read_columns(run)
    (run / cache.META_FILE).write_text(json.dumps({**meta, "n_events": meta["n_events"] + 1}))
    with pytest.raises(TraceError, match="does not hold the columns and events it was kept with"):
        cache.read_columns(run)
    (run / cache.META_FILE).write_text(json.dumps(meta))
    os.unlink(run / cache.EVENTS_FILE)   # the link only: the entry's file stays
    (run / cache.EVENTS_FILE).write_bytes(b"ARROW1\x00\x00 not really")
    with pytest.raises(TraceError, match=rf"the parsed trace in {run} cannot be read \(Arrow"):
        cache.read_columns(run)
    assert cached_load(path, tmp_path / "cache")[1] is True   # the entry untouched


@pytest.mark.parametrize("rel", ["gpu_small.json", "cpu_small.pt.trace.json.gz",
                                 "public/hta/ns_resolution_rank0.json.gz",
                                 "public/tracelens/vllm_decode_hip_graph.json.gz",
                                 "with_stack/h100_bert_small_step_under_python.json.gz"])
def test_an_entry_is_read_into_columns_without_pandas_equal_to_the_dataframe_way(tmp_path, rel):
    """read_columns makes the Trace straight from the Arrow buffers (issue #42: the Summary of a cached trace
    before pandas): the same codes (dtype included), strings, NaN and -1 (absent) as to_pandas then
    Trace.from_frame, writable, with no DataFrame made."""
    import numpy as np
    import pyarrow.feather as feather

    t = load_trace(DATA / rel)
    cache.write_columns(t, tmp_path, {"stamp": 1})
    got = cache.read_columns(tmp_path)
    assert got._frame is None
    meta = json.loads((tmp_path / cache.META_FILE).read_text())
    for k in ("cache_version", "stamp", "n_events"):
        meta.pop(k)
    table = feather.read_table(tmp_path / cache.EVENTS_FILE, memory_map=False)
    ref = Trace.from_frame(cache._object_categories(table.to_pandas()), **meta)
    for k, y in ref.columns.items():
        x = got.columns[k]
        assert x.dtype == y.dtype and x.flags.writeable, k
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k
    assert {k: list(v) for k, v in got.tables.items()} == {k: list(v) for k, v in ref.tables.items()}
    assert got.events.equals(ref.events)
    assert (got.columns["occupancy"] != got.columns["occupancy"]).any()       # NaN kept (an Arrow null)
    assert (got.columns["grid"] == -1).any()                                   # absent: code -1 (a null)
