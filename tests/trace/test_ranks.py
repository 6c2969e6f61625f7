"""diagnostics.trace.ranks: several ranks' traces as map -> reduce (per-rank summaries in parallel, cross-rank
views), checked for being one run, the picked ranks on one timeline."""

import statistics
from pathlib import Path

import pytest

from diagnostics.trace import TraceError
from diagnostics.trace.ranks import START_SKEW_MAX_S, analyse_ranks, rank_paths
from tests.trace.rank_traces import BASE_NS, BUSY_US, COMM_US, COMPUTE_US, OVERLAP_US, write_rank

DATA_TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
STEPS = {0: [1000, 1200, 1100], 1: [2000, 1000, 3000], 2: [1500, 1500, 1600]}


@pytest.fixture
def three(tmp_path):
    d = tmp_path / "job"
    for r, steps in STEPS.items():
        write_rank(d, f"host{r}.pt.trace.json", r, 3, steps, start_us=1000.0 + 2000 * r)
    return d


def _checks(out):
    return [p["check"] for p in out["problems"]]


def test_per_rank_table_against_hand_values(three):
    out = analyse_ranks([three], parallel=False)
    assert [r["rank"] for r in out["ranks"]] == [0, 1, 2]
    for row in out["ranks"]:
        steps = STEPS[row["rank"]]
        assert row["rank_source"] == "distributedInfo"
        assert row["steps"] == 3
        assert row["step_ms_median"] == pytest.approx(statistics.median(steps) / 1e3)
        assert row["step_ms_max"] == pytest.approx(max(steps) / 1e3)
        assert row["compute_ms_median"] == pytest.approx(COMPUTE_US / 1e3)
        assert row["comm_ms_median"] == pytest.approx(COMM_US / 1e3)
        assert row["overlap_ms_median"] == pytest.approx(OVERLAP_US / 1e3)
        assert row["exposed_comm_ms_median"] == pytest.approx((COMM_US - OVERLAP_US) / 1e3)
        assert row["gpu_busy_ms_median"] == pytest.approx(BUSY_US / 1e3)
        # GPU windows run from one step's first kernel to the next's: the step length; the last
        # one ends with its last kernel (busy only). Idle = window - busy.
        idle = [d - BUSY_US for d in steps[:-1]] + [0.0]
        assert row["gpu_idle_ms_median"] == pytest.approx(statistics.median(idle) / 1e3)
        assert row["gpu_idle_pct"] == pytest.approx(100 * sum(idle) / (sum(steps[:-1]) + BUSY_US))
    assert out["slowest_rank"] == 1 and out["fastest_rank"] == 0
    assert out["spread"] == pytest.approx(2000 / 1100)
    assert out["problems"] == []


def test_parallel_path_gives_the_sequential_table(three):
    seq = analyse_ranks([three], parallel=False)
    par = analyse_ranks([three])
    assert par["mode"].startswith("parallel"), par["mode"]
    assert seq["mode"] == "sequential (asked for)"
    assert par["ranks"] == seq["ranks"]
    assert par["timeline"] == seq["timeline"]


def test_eleven_ranks_lanes_in_numeric_order(tmp_path):
    for r in (10, 3, 0, 7, 1, 9, 2, 5, 8, 4, 6):
        write_rank(tmp_path, f"trace_{r:02d}_x.json", r, 11, [1000, 1000])
    picked = [10, 3, 0, 7, 1, 9, 2, 5]  # TIMELINE_RANKS_MAX of them, asked in no order
    out = analyse_ranks([tmp_path], parallel=False, max_events=200, timeline_ranks=picked)
    seen = []
    for lane in out["timeline"]["lanes"]:
        rank = int(lane["lane"].split(" · ")[0].removeprefix("rank "))
        assert lane["label"].startswith(f"rank {rank} · ")
        if not seen or seen[-1] != rank:
            seen.append(rank)
    assert seen == sorted(picked) == out["timeline_ranks"]
    assert out["timeline"]["shown"] <= 200
    assert not _checks(out)
    assert len(out["ranks"]) == 11  # every rank in the table; only the picked ones drawn


def test_times_aligned_on_each_ranks_first_step(three):
    out = analyse_ranks([three], parallel=False, timeline_ranks="all")
    tl = out["timeline"]
    assert "first profiler step" in tl["alignment"]
    for r in STEPS:
        starts = [e["start_us"] for e in tl["events"] if e["lane"].startswith(f"rank {r} · ")
                  and e["name"] == "ProfilerStep#1"]
        assert starts == [0.0]  # rank r's trace starts its first step at 1000 + 2000 r µs
    assert tl["t0"] == 0.0
    assert tl["t1"] == pytest.approx(max(sum(s) for s in STEPS.values()))  # the last step span ends last


def test_merged_timeline_keeps_the_overall_budget(three):
    out = analyse_ranks([three], parallel=False, max_events=20, timeline_ranks="all")
    assert out["timeline"]["shown"] == len(out["timeline"]["events"]) <= 20
    assert out["timeline"]["in_range"] == 3 * 3 * 6  # every event of every rank is in range


def test_mismatched_world_size(tmp_path):
    write_rank(tmp_path, "r0.json", 0, 2, [1000])
    write_rank(tmp_path, "r1.json", 1, 4, [1000])
    out = analyse_ranks([tmp_path], parallel=False)
    p = [p for p in out["problems"] if p["check"] == "world_size"]
    assert len(p) == 1 and "2 on rank 0" in p[0]["message"] and "4 on rank 1" in p[0]["message"]
    assert "pg_config" in _checks(out)  # their process groups hold 2 and 4 ranks


def test_duplicate_and_missing_ranks(tmp_path):
    write_rank(tmp_path, "a.json", 0, 3, [1000])
    write_rank(tmp_path, "b.json", 0, 3, [1000])
    out = analyse_ranks([tmp_path], parallel=False)
    msgs = {p["check"]: p["message"] for p in out["problems"]}
    assert msgs["duplicate_rank"] == "rank 0 appears 2 times: a.json, b.json"
    assert msgs["missing_rank"] == "world_size is 3 but ranks 1, 2 are missing"
    # the second file of rank 0 is in the table, not in the cross-rank views or on the timeline
    assert [r["name"] for r in out["ranks"]] == ["a.json", "b.json"]
    assert any("repeating a rank number" in n for n in out["notes"])
    lanes = {l["lane"].split(" · ")[0] for l in out["timeline"]["lanes"]}
    assert lanes == {"rank 0"}


def test_start_times_an_hour_apart(tmp_path):
    write_rank(tmp_path, "r0.json", 0, 2, [1000])
    write_rank(tmp_path, "r1.json", 1, 2, [1000], base_ns=BASE_NS + 3600 * 10**9)
    out = analyse_ranks([tmp_path], parallel=False)
    assert _checks(out) == ["start_time"]
    assert out["problems"][0]["message"].startswith("traces start 3,600 s apart (rank 0 first, rank 1 last")
    # within the threshold: one run
    write_rank(tmp_path, "r1.json", 1, 2, [1000], base_ns=BASE_NS + int(START_SKEW_MAX_S / 2 * 1e9))
    assert analyse_ranks([tmp_path], parallel=False)["problems"] == []


def test_different_steps_and_versions(tmp_path):
    write_rank(tmp_path, "r0.json", 0, 2, [1000, 1000])
    write_rank(tmp_path, "r1.json", 1, 2, [1000, 1000], first_step=5, schema=2, device="NVIDIA A100")
    out = analyse_ranks([tmp_path], parallel=False)
    msgs = [p["message"] for p in out["problems"]]
    assert "ranks hold different profiler steps: steps 1-2 on rank 0; steps 5-6 on rank 1" in msgs
    assert any("schemaVersion: 1 on rank 0; 2 on rank 1" in m for m in msgs)
    assert any("different devices" in m and "NVIDIA A100" in m for m in msgs)


def test_rank_from_file_name_then_order(tmp_path):
    write_rank(tmp_path, "worker_3.json", None, None, [1000])
    write_rank(tmp_path, "other.json", None, None, [1000])
    out = analyse_ranks([tmp_path / "worker_3.json", tmp_path / "other.json"], parallel=False)
    assert [(r["rank"], r["rank_source"]) for r in out["ranks"]] == [(1, "order"), (3, "file name")]
    assert out["notes"] and "file name" in out["notes"][0]


def test_unreadable_file_is_a_problem_and_missing_path_an_error(tmp_path):
    write_rank(tmp_path, "r0.json", 0, 1, [1000])
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    (tmp_path / "r0.steps.json").write_text("[]")  # a distributed run's sidecar: not a trace, left out
    out = analyse_ranks([tmp_path], parallel=False)
    assert _checks(out) == ["unreadable"] and out["problems"][0]["message"].startswith("config.json: not read")
    with pytest.raises(TraceError, match="nope.json: no such file or folder"):
        rank_paths([tmp_path / "nope.json"])
    with pytest.raises(TraceError, match="none of the rank traces could be read"):
        analyse_ranks([tmp_path / "config.json"], parallel=False)


def test_step_time_chart_in_ms_and_the_merged_timeline_figure(three):
    from diagnostics.analyses.trace.result import Ranks
    from diagnostics.render.charts.ranks import build_rank_steps_figure, build_ranks_timeline_figure, rank_table
    from diagnostics.trace.ranks import analyse
    from diagnostics.trace.records.timeline import Timeline

    out = analyse([three], parallel=False, timeline_ranks="all")  # the record the charts draw, as made
    assert isinstance(out, Ranks) and isinstance(out.timeline, Timeline) and out.timeline_ranks == (0, 1, 2)
    fig = build_rank_steps_figure(out)
    bar = fig.data[0]
    assert list(bar.x) == ["rank 0", "rank 1", "rank 2"]
    assert list(bar.y) == [statistics.median(STEPS[r]) / 1e3 for r in (0, 1, 2)]
    assert fig.layout.yaxis.title.text == "median step time (ms)"
    assert list(bar.marker.color).count("#e45756") == 1 and bar.marker.color[1] == "#e45756"  # slowest: rank 1
    tl = build_ranks_timeline_figure(out)
    lanes = list(reversed(tl.layout.yaxis.categoryarray))  # top to bottom
    assert [lane.split(" · ")[0] for lane in lanes] == ["rank 0"] * 3 + ["rank 1"] * 3 + ["rank 2"] * 3
    assert tl.layout.xaxis.title.text == "time since each rank's first profiler step (ms)"
    assert list(rank_table(out)["file"]) == ["host0.pt.trace.json", "host1.pt.trace.json", "host2.pt.trace.json"]


def test_the_trace_job_reads_a_ranks_folder_inside_the_sandboxed_worker(three, tmp_path):
    """The runner's worker is confined (diagnostics.sandbox): the "ranks" paths are granted as inputs,
    and the ranks are analysed in processes of its own."""
    from diagnostics import sandbox
    from diagnostics.confine import FS_READ_FILE
    from diagnostics.runner import Job, run_job
    from diagnostics.store import Store

    job = Job("trace", None, {"path": str(three / "host0.pt.trace.json"), "ranks": [str(three)]})
    rules = dict(sandbox.policy_for(job, tmp_path / "art", tmp_path / "tmp").rules())
    assert rules.get(three.resolve(), 0) & FS_READ_FILE
    out = run_job(job, store=Store(tmp_path / "data"))
    assert out.ok, out.error
    ranks = out.result.ranks
    assert ranks.problems == (), ranks.problems  # every rank file was readable in the worker
    assert [r.step_ms_median for r in ranks.ranks] == [1.1, 2.0, 1.5]
    assert ranks.mode.startswith("parallel"), ranks.mode


def test_a_bad_ranks_option_is_refused_by_name():
    from diagnostics.analyses.trace import TRACE
    from diagnostics.declare import OptionError

    with pytest.raises(OptionError, match="option ranks: each entry must be a trace file or folder path"):
        TRACE.validate({"path": "a.json", "ranks": ["a.json", ""]})


def test_no_worker_processes_means_sequential_and_says_why(three, monkeypatch):
    import diagnostics.trace.ranks.executors as ranks

    class Daemon:
        daemon = True

    monkeypatch.setattr(ranks.multiprocessing, "current_process", lambda: Daemon())
    out = analyse_ranks([three])
    assert out["mode"] == "sequential (this process is a daemon and may not start processes)"
    monkeypatch.undo()

    def refuse(*a, **k):
        raise OSError("fork refused")

    monkeypatch.setattr(ranks, "ProcessPoolExecutor", refuse)
    out2 = analyse_ranks([three])
    assert out2["mode"] == "sequential (worker processes could not run (OSError: fork refused))"
    assert out2["ranks"] == out["ranks"] == analyse_ranks([three], parallel=False)["ranks"]


def test_the_gloo_pair_cpu_traces_hand_values_and_gpu_not_counted():
    """tests/data/distributed/pair: the 2-rank gloo traces whose per-step split tests/distributed/
    test_analysis.py works out by hand (rank 0: compute 0.400 / 0.150 ms, comm 0.400 / 0.310, overlap
    0.100 / 0; rank 1: compute 0.700 / 0.800, comm 0.065 / 0.040, overlap 0.020 / 0)."""
    from pathlib import Path

    pair = Path(__file__).resolve().parents[1] / "data" / "distributed" / "pair"
    out = analyse_ranks([pair], parallel=False, timeline_ranks="all")
    r0, r1 = out["ranks"]
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["compute_ms_median"] == pytest.approx((0.400 + 0.150) / 2)
    assert r0["comm_ms_median"] == pytest.approx((0.400 + 0.310) / 2)
    assert r0["overlap_ms_median"] == pytest.approx(0.050)
    assert r1["compute_ms_median"] == pytest.approx(0.750)
    assert r1["comm_ms_median"] == pytest.approx((0.065 + 0.040) / 2)
    assert r1["overlap_ms_median"] == pytest.approx(0.010)
    assert r0["step_ms_median"] == r1["step_ms_median"] == pytest.approx(1.0)
    for r in (r0, r1):  # CPU-only traces: no GPU figure, not a 0
        assert r["gpu_busy_ms_median"] is None and r["gpu_idle_ms_median"] is None and r["gpu_idle_pct"] is None
    assert out["problems"] == []
    # rank 1's steps start 10 ms later in its trace; on the merged timeline both start at 0
    firsts = {lane_rank: min(e["start_us"] for e in out["timeline"]["events"]
                             if e["lane"].startswith(lane_rank) and e["name"] == "ProfilerStep#1")
              for lane_rank in ("rank 0 · ", "rank 1 · ")}
    assert firsts == {"rank 0 · ": 0.0, "rank 1 · ": 0.0}


def test_upload_names_replace_stored_names_in_table_problems_and_rank_numbers(tmp_path):
    """Uploads are stored as .../<sha>/trace.json: the names the user gave them are what is shown."""
    a = write_rank(tmp_path / "u1", "trace.json", None, None, [1000])
    b = write_rank(tmp_path / "u2", "trace.json", None, None, [1000])
    c = write_rank(tmp_path / "u3", "trace.json", None, None, [1000])
    out = analyse_ranks([a, b, c], parallel=False,
                        names={str(a): "worker_1.json", str(b): "worker_0.json", str(c): "worker_0_again.json"})
    assert [(r["rank"], r["name"], r["rank_source"]) for r in out["ranks"]] == [
        (0, "worker_0.json", "file name"), (0, "worker_0_again.json", "file name"), (1, "worker_1.json", "file name")]
    assert {p["message"] for p in out["problems"]} == {"rank 0 appears 2 times: worker_0.json, worker_0_again.json"}


def test_workers_are_bounded_by_free_memory(three, monkeypatch):
    import diagnostics.trace.ranks.executors as ranks

    files = [str(p) for p in rank_paths([three])]
    need = max(ranks.rank_memory(f) for f in files)

    class VM:
        available = int(2 * need * 2.5)  # half of it holds 2.5 ranks: 2 at once

    monkeypatch.setattr("psutil.virtual_memory", lambda: VM())
    assert ranks.memory_workers(files) == 2
    VM.available = int(need)  # not even one in half: one at a time, and said so
    assert ranks.memory_workers(files) == 1
    assert analyse_ranks([three])["mode"] == "sequential (not enough free memory for two ranks at once)"


def test_a_gzip_ranks_decoded_size_is_read_from_its_trailer(tmp_path):
    """Issue #42: a .gz rank's size was guessed at 8x its file (the public traces decode to 8-17x), so workers
    were sized from half their need. The gzip trailer says it exactly (modulo 2**32)."""
    import gzip

    from diagnostics.trace.ranks import executors as ex

    for rel in ("public/hta/ns_resolution_rank0.json.gz", "with_stack/sglang_qwen3_8b_decode.json.gz"):
        p = DATA_TRACES / rel
        assert ex.decoded_size(p) == len(gzip.decompress(p.read_bytes())), rel
    plain = tmp_path / "t.json"
    plain.write_text('{"traceEvents": []}')
    assert ex.decoded_size(plain) == plain.stat().st_size
    # a trailer that wrapped past 4 GiB: the multiple of 2**32 that makes the ratio plausible
    big = tmp_path / "big.json.gz"
    big.write_bytes(b"\x1f\x8b" + b"\0" * (3 << 20) + (1000).to_bytes(4, "little"))
    assert ex.decoded_size(big) == (1 << 32) + 1000
    assert ex.rank_events(plain) == 0
    p = DATA_TRACES / "with_stack" / "sglang_qwen3_8b_decode.json.gz"
    assert ex.rank_events(p) == len(__import__("json").loads(gzip.decompress(p.read_bytes()))["traceEvents"])
    assert ex.rank_memory(p) == (ex.WORKER_BASE_BYTES + ex.TASK_FIXED_BYTES + ex.rank_events(p) * ex.MEMORY_PER_EVENT
                                 + int(ex.decoded_size(p) * ex.MEMORY_PER_JSON_BYTE))


def test_a_rank_workers_measured_memory_is_within_what_it_is_sized_for():
    """The sizing holds on a real rank: a fresh worker process summarising HTA's ns_resolution trace (15 MB of
    JSON, 68,692 events) peaks above its start-up by less than rank_memory says (measured 137 MB:
    bench/bench_worker_memory.py), and by more than a fifth of it (a worker not sized idle)."""
    import subprocess
    import sys

    from diagnostics.trace.ranks import executors as ex

    path = DATA_TRACES / "public" / "hta" / "ns_resolution_rank0.json.gz"
    bench = Path(__file__).resolve().parents[2] / "bench" / "bench_worker_memory.py"
    out = subprocess.run([sys.executable, str(bench), "--child", str(path)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    res = __import__("json").loads(out.strip().splitlines()[-1])
    task = res["peak_rss"] - res["base_rss"]
    budget = ex.rank_memory(path) - ex.WORKER_BASE_BYTES
    assert res["events"] == 68692
    assert budget / 5 < task < budget, (task, budget)
    assert res["base_rss"] < ex.WORKER_BASE_BYTES
