"""Invariants that hold on every trace: our samples, the public corpus (tests/data/traces/public) and the
generated ones. One step time across views (each figure labelled with what it spans), every long wait
on a critical path explained, no negative time anywhere in the communication split (issue #31)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import pytest

from diagnostics.results import to_plain
from diagnostics.trace import load_trace, temporal_breakdown
from diagnostics.trace.comm import rank_breakdown
from diagnostics.trace.critical_path import EXPLAIN_SHARE, critical_path
from diagnostics.trace.errors import TraceError
from diagnostics.trace.breakdowns import steps

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = sorted(str(p.relative_to(DATA)) for p in (DATA / "traces").rglob("*")
                if p.name.endswith((".json", ".json.gz")) and p.name != "hta_reference.json") \
    + sorted(str(p.relative_to(DATA)) for p in (DATA / "distributed" / "pair").glob("*.json"))


def _cp(trace):
    try:
        return to_plain(critical_path(trace))
    except TraceError as e:
        assert "no profiler step ranges" in str(e)
        return None


@pytest.mark.parametrize("rel", TRACES)
def test_one_step_time_across_views(rel):
    """The critical path's CPU step is the Steps table's, its GPU window is the per-step GPU figures',
    its length is its step time (to the end of the last GPU work), and when that is longer than the CPU
    step a note says what each spans, with both figures."""
    trace = load_trace(DATA / rel)
    cp = _cp(trace)
    if cp is None:
        return
    table = steps(trace).set_index("step")["dur_us"]
    assert cp["host_span_us"] == pytest.approx(float(table[cp["step"]]), abs=1e-6)
    windows = {r.step: r.window_us for r in temporal_breakdown(trace).gpu}
    assert cp["gpu_window_us"] == (pytest.approx(windows[cp["step"]]) if cp["step"] in windows else None)
    assert cp["length_us"] == pytest.approx(cp["step_us"], rel=1e-9, abs=1e-6)
    assert sum(r["us"] for r in cp["by_kind"]) == pytest.approx(cp["step_us"], rel=1e-9, abs=1e-6)
    assert all(r["us"] >= 0 for r in cp["by_kind"])
    if cp["step_us"] > cp["host_span_us"] * 1.01 + 1.0:
        said = " ".join(cp["notes"])
        assert f"{cp['step_us'] / 1e3:,.3f} ms" in said and f"{cp['host_span_us'] / 1e3:,.3f} ms" in said, cp["notes"]
        assert "CPU step" in said


@pytest.mark.parametrize("rel", TRACES)
def test_every_long_wait_on_a_critical_path_is_explained(rel):
    """A wait on the path (the GPU busy with earlier steps, a stream idle, a thread starting late) longer
    than EXPLAIN_SHARE of the step has a note saying what it waited for; and no idle-wait is as long as
    the step's CPU time (the reported 90.7 ms "idle-wait" of a 95.7 ms step)."""
    trace = load_trace(DATA / rel)
    cp = _cp(trace)
    if cp is None:
        return
    kinds = {r["kind"]: r["us"] for r in cp["by_kind"]}
    waits = [r for r in cp["path"] if r["wait_before_us"] > EXPLAIN_SHARE * cp["step_us"]
             and ("before the step" in r["waited_on"] or " gap)" in r["waited_on"]
                  or "first call" in r["waited_on"])]
    explained = [n for n in cp["notes"] if "% of the step)" in n]
    assert len(explained) >= len(waits), (waits, cp["notes"])
    assert kinds["idle-wait"] < 0.9 * cp["host_span_us"] or any("idle" in n for n in explained), cp["notes"]


def test_the_reported_step_reads_its_cpu_step_and_why_the_path_is_longer():
    """HTA's ns_resolution capture, step 103: the Steps table's 95.7 ms, the path's 185.2 ms, of which
    89.6 ms is the GPU finishing step 102's work (labelled, not "idle-wait")."""
    cp = to_plain(critical_path(load_trace(DATA / "traces" / "public" / "hta" / "ns_resolution_rank0.json.gz")))
    kinds = {r["kind"]: r["us"] for r in cp["by_kind"]}
    assert cp["step"] == 103
    assert cp["host_span_us"] == pytest.approx(95697.341) and cp["step_us"] == pytest.approx(185191.573)
    assert cp["gpu_window_us"] == pytest.approx(95570.75)
    assert kinds["earlier-steps"] == pytest.approx(89621.75) and kinds["idle-wait"] < 1200
    assert any("busy with earlier steps, not idle" in n for n in cp["notes"])
    assert any("0.9 steps behind the CPU" in n for n in cp["notes"])


@pytest.mark.parametrize("rel", TRACES)
def test_the_communication_split_is_never_negative(rel):
    """Per step: computation, communication, their overlap, exposed communication, other and busy time
    are all >= 0 and the overlap is at most each side (the Distributed view's columns, its "Hidden" share
    = overlap / communication in [0, 1])."""
    b = rank_breakdown(load_trace(DATA / rel))
    for s in b["steps"]:
        for key, v in s.items():
            if key.endswith("_ms"):
                assert v >= 0.0, (s["step"], key, v)
        assert s["overlap_ms"] <= min(s["comm_ms"], s["compute_ms"]) + 1e-9
        assert s["exposed_comm_ms"] + s["overlap_ms"] == pytest.approx(s["comm_ms"], abs=1e-9)
        if s["comm_ms"]:
            assert 0.0 <= s["overlap_ms"] / s["comm_ms"] <= 1.0
    assert all(c["dur_ms"] >= 0 for c in b["calls"])


def test_the_distributed_analysis_of_two_public_ranks_has_no_negative_figure(tmp_path):
    from diagnostics.analyses.distributed.job import analyze_folder_path

    result = analyze_folder_path(DATA / "traces" / "public" / "hta" / "multi_rank")
    for row in result["ranks"] + result["steps"]:
        for key, v in row.items():
            if key.endswith(("_ms", "_ratio")) and v is not None:
                assert v >= 0.0, (row.get("rank"), key, v)
    assert 0.0 <= result["metrics"]["overlap_ratio"] <= 1.0
    assert {c["family"] for c in result["collectives"] if c["where"] == "GPU"} == {"NCCL"}


# ---- host time per thread (issue #42) --------------------------------------------------------

@pytest.mark.parametrize("rel", TRACES)
def test_host_time_per_thread_is_its_busy_time_never_more_than_its_wall(rel):
    """One rule, innermost event wins, whatever nests under what: the self times of a thread's host
    events add up to the union of their spans (never past the thread's wall time), equal to a sweep that
    gives each instant to the open event that started last (model.innermost_self, an independent
    computation), and the Summary's busy time per thread is that same figure."""
    from diagnostics.trace import intervals as iv
    from diagnostics.trace import summary
    from diagnostics.trace.classify import host_mask
    from diagnostics.trace.model import innermost_self

    trace = load_trace(DATA / rel)
    nest = trace.nesting()
    rows = np.flatnonzero(host_mask(trace))
    lane = trace.lane_keys()[rows]
    ts = trace.events["ts"].to_numpy()[rows]
    end = ts + trace.events["dur"].to_numpy()[rows]
    busy = {}
    for ln in np.unique(lane):
        on = lane == ln
        own = float(np.nansum(nest["self_us"][rows[on]]))
        union = iv.length(iv.union(ts[on], end[on]))
        wall = float(end[on].max() - ts[on].min())
        assert own <= union + 1e-6 * on.sum() and union <= wall + 1e-6, (ln, own, union, wall)
        # clipping a child to its parent within OVERHANG_TOLERANCE_US is the one place they may differ
        assert own == pytest.approx(innermost_self(ts[on], end[on]).sum(), abs=1.0), ln
        busy[ln] = own
    threads = summary(trace).threads
    assert sum(t.busy_us for t in threads) == pytest.approx(sum(busy.values()), rel=1e-9, abs=1e-6)


WITH_STACK = DATA / "traces" / "with_stack"


def test_a_step_opened_inside_a_python_frame_still_gets_its_children():
    """TraceLens' H100 BERT-small trace: ProfilerStep#6 starts inside with_stack's
    `_record_function_enter_new` frame and outlives it. Its operators are its children, its own time is
    what nothing inside it covers, and the host groups of its thread add up to no more than the step."""
    trace = load_trace(WITH_STACK / "h100_bert_small_step_under_python.json.gz")
    st = steps(trace)
    assert st["step"].tolist() == [6]
    step_row = int(trace._cache["steps"]["row"][0])
    nest = trace.nesting()
    names = trace.strings("name")
    entry = int(nest["parent"][step_row])
    assert entry == -1 or "_record_function_enter" not in names[entry]   # no longer its parent
    kids = np.flatnonzero(nest["parent"] == step_row)
    assert len(kids) >= 2
    dur = float(st["dur_us"][0])
    groups = {r.group: r.self_us for r in temporal_breakdown(trace).cpu if r.step == 6}
    assert groups["untracked (step self time)"] < 0.02 * dur                   # was the whole step
    assert groups["python_function"] > 0.3 * dur and groups["op: matmul"] > 0
    lane = trace.lane_keys()
    ts = trace.events["ts"].to_numpy()
    s0 = float(ts[step_row])
    mine = (lane == lane[step_row]) & (ts >= s0) & (ts < s0 + dur) & np.isfinite(nest["self_us"])
    # the events put in the step (by their start) on its thread: no more time than from the step's start
    # to the last of their ends (prof.step()'s frame opens inside the step and ends 69 µs after it)
    wall = float(nest["end_us"][mine].max()) - s0
    assert float(nest["self_us"][mine].sum()) <= wall + 1e-6 and wall < dur + 100.0
    assert sum(groups.values()) <= wall + 1e-6   # the step's groups are its thread's: one thread here


def test_a_serving_trace_without_steps_reads_each_thread_within_its_wall():
    """SGLang decode (no profiler steps): python_function 465.9 + user_annotation 465.3 + cuda_runtime
    464.7 ms read in a 473.8 ms trace before; per thread the groups now add up to its busy time."""
    trace = load_trace(WITH_STACK / "sglang_qwen3_8b_decode.json.gz")
    tb = temporal_breakdown(trace)
    (window,) = tb.steps
    total = sum(r.self_us for r in tb.cpu)
    threads = {(t.pid, t.tid): t.busy_us for t in __import__("diagnostics.trace", fromlist=["summary"])
               .summary(trace).threads}
    assert total == pytest.approx(sum(threads.values()), rel=1e-9)
    assert max(threads.values()) <= window.dur_us + 1e-6
    assert total < 1.2 * window.dur_us      # 3x the trace before


@pytest.fixture(params=["one thread", "two threads"])
def search_threads(request, monkeypatch):
    """_levels' searches in one thread, or (as on a big trace) split between two from the first query on."""
    from diagnostics.trace import model

    if request.param == "two threads":
        monkeypatch.setattr(model, "THREADED_SEARCH_MIN", 2)
    return request.param


def test_nesting_again_from_the_earliest_moved_end_equals_nesting_the_whole_lane(search_threads):
    """nesting_of's repair rounds nest a lane again only from its first event starting at or after the
    earliest end the round moved (issue #42: with_stack traces repair a few frames per round, at the trace's
    end): on random nested lanes (zero-length events and shared starts included) whose ends are then moved
    earlier, depths and parents equal those of _levels over the whole lanes."""
    from diagnostics.trace import model

    rng = np.random.default_rng(7)
    for _ in range(30):
        n = int(rng.integers(20, 400))
        lane = np.sort(rng.integers(0, 3, n)).astype(np.int64)
        ts = np.round(rng.uniform(0, 1000, n), 0)            # shared starts are common
        dur = np.where(rng.random(n) < 0.1, 0.0, np.round(rng.exponential(60, n), 0))
        order = np.lexsort((-dur, ts, lane))
        ts, dur, lane = ts[order], dur[order], lane[order]
        end = ts + dur
        d0, _ = model._levels(ts, end, lane)
        moved = rng.choice(n, size=int(rng.integers(1, 6)), replace=False)
        end = end.copy()
        end[moved] = np.maximum(ts[moved], end[moved] - rng.uniform(0, 80, moved.size).round(0))
        d_full, p_full = model._levels(ts, end, lane)
        since = {ln: end[moved][lane[moved] == ln].min() for ln in np.unique(lane[moved])}
        redo = np.array([ln in since and t >= since[ln] for ln, t in zip(lane.tolist(), ts.tolist())])
        d_part, p_part = model._levels(ts, end, lane, redo=redo, depth=d0)
        assert np.array_equal(d_part, d_full)
        assert np.array_equal(p_part[redo], p_full[redo])
        _, p_before = model._levels(ts, ts + dur, lane)
        assert np.array_equal(p_before[~redo], p_full[~redo])   # the others keep their parents


def _stack_walk(ts, end, lane):
    """Depth and parent of events sorted by lane, start, longest first, by a stack per lane: the
    reference for _levels (one Python step per event)."""
    depth, parent = np.zeros(ts.size, np.int64), np.full(ts.size, -1, np.int64)
    stack, current = [], None
    for i, (t, ln) in enumerate(zip(ts.tolist(), lane.tolist())):
        if ln != current:
            stack, current = [], ln
        while stack and end[stack[-1]] <= t:
            stack.pop()
        depth[i], parent[i] = len(stack), stack[-1] if stack else -1
        stack.append(i)
    return depth, parent


def test_levels_equal_a_stack_walk_on_deep_and_wide_nesting(search_threads, monkeypatch):
    """_levels' parents (each level's positions searched among the level above's) equal a stack walk's on
    nested lanes: random trees, a chain 300 calls deep (past a uint8 depth) with siblings at every level,
    zero-length calls, and lanes whose last call would otherwise be taken for the next lane's parent."""
    from diagnostics.trace import model

    rng = np.random.default_rng(11)
    searched: list = []
    search = model._searchsorted
    monkeypatch.setattr(model, "_searchsorted", lambda *a: searched.append(a[1].size) or search(*a))

    def tree(a: int, b: int, level: int, out: list) -> None:
        t = a
        while t < b and rng.random() < 0.8:
            s = int(rng.integers(t, b))
            e = int(rng.integers(s, b + 1))
            out.append((s, e))
            if e > s and level < 12:
                tree(s, e, level + 1, out)
            t = e + int(rng.integers(0, 3))

    for case in range(12):
        lanes = []
        for ln in range(int(rng.integers(1, 4))):
            spans: list = []
            if case % 3 == 0:   # a deep chain, each level with a zero-length sibling and a leaf after it
                deep = 300
                spans += [(i * 4, 10_000 - i * 4) for i in range(deep)]
                spans += [(i * 4 + 1, i * 4 + 1) for i in range(deep)]
                spans += [(10_000 - i * 4 - 2, 10_000 - i * 4 - 1) for i in range(deep)]
            tree(10_001 if spans else 0, 20_000, 0, spans)   # after the chain: all of it nests
            lanes += [(ln, s, e) for s, e in spans or [(0, 5)]]
        arr = np.array(lanes, dtype=np.float64)
        lane, ts, end = arr[:, 0].astype(np.int64), arr[:, 1], arr[:, 2]
        order = np.lexsort((-(end - ts), ts, lane))
        lane, ts, end = lane[order], ts[order], end[order]
        searched.clear()
        d, p = model._levels(ts, end, lane)
        assert searched and (search_threads == "one thread" or ts.size < 10 or max(searched) >= 2)
        d_ref, p_ref = _stack_walk(ts, end, lane)
        assert np.array_equal(d, d_ref) and np.array_equal(p, p_ref), case
        if case % 3 == 0:
            assert d.max() >= 300
