"""diagnostics.trace.ranks at cluster scale (#35): the cross-rank views against hand values, the summaries
kept on disk, a failing rank left out by name, Dask (a LocalCluster) against the local process pool on
8 ranks built from a real 2-rank gloo capture with a planted straggler and late collective."""

import importlib.util
import json
import os
import statistics
from pathlib import Path

import pytest

from diagnostics.trace import TraceError
from diagnostics.trace.ranks import analyse_ranks
from diagnostics.trace.ranks.reduce import STRAGGLER_MIN_LATE_US
from tests.trace.rank_traces import COMM_US, write_rank

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "tests" / "data" / "distributed" / "gloo_ddp"
STEP_US = 10_000.0
NELEMS = 1 << 20  # fp32: 4 MiB per all-reduce
# arrivals (µs after t+400) per rank and step: rank 2 is 300 µs late everywhere, rank 1 5 ms late at step 4
ARRIVE = {0: [0, 0, 0, 0, 0, 0], 1: [0, 0, 0, 5000, 0, 0], 2: [300] * 6, 3: [0, 10, 0, 0, 20, 0]}
LAST = [max(a[i] for a in ARRIVE.values()) for i in range(6)]


@pytest.fixture
def four(tmp_path):
    d = tmp_path / "job"
    for r, arrive in ARRIVE.items():
        write_rank(d, f"rank{r}.pt.trace.json", r, 4, [STEP_US] * 6, arrive_us=arrive, last_us=LAST,
                   nelems=NELEMS, start_us=1000.0)
    return d


def test_collectives_stragglers_and_waits_against_hand_values(four):
    out = analyse_ranks([four], parallel=False)
    coll = out["collectives"]
    assert coll["matched"] == 6 and coll["partial"] == 0 and coll["matched_by"] == ["sequence number"]
    (row,) = coll["by_name"]
    skews = [max(a[i] for a in ARRIVE.values()) - min(a[i] for a in ARRIVE.values()) for i in range(6)]
    assert row["skew_us_max"] == pytest.approx(5000.0)
    assert row["skew_us_median"] == pytest.approx(statistics.median(skews))
    # the last to arrive waits for nobody: its kernel is the transfer (COMM_US) on every collective
    assert row["transfer_us_median"] == pytest.approx(COMM_US)
    # bus bandwidth of an all-reduce over 4 ranks: bytes / time x 2 (n - 1) / n
    assert row["busbw_median"] == pytest.approx(NELEMS * 4 / (COMM_US * 1e-6) * 2 * 3 / 4)
    widest = coll["widest"][0]
    assert (widest["key"], widest["last_rank"], widest["first_rank"], widest["step"]) == ("0#3", 1, 0, 4)
    # rank 2: 300 µs after the median arrival at every collective -> the straggler
    assert [s["rank"] for s in out["stragglers"]] == [2]
    # its lateness at each collective against that collective's median arrival, by hand: 300, 295, 300, 150, 290, 300
    medians = [statistics.median(a[i] for a in ARRIVE.values()) for i in range(6)]
    assert out["stragglers"][0]["late_us_median"] == pytest.approx(
        statistics.median(ARRIVE[2][i] - medians[i] for i in range(6)))  # 297.5
    assert out["thresholds"]["straggler_limit_us"] == STRAGGLER_MIN_LATE_US
    # rank 1 once, 5 ms after the median arrival (0, 5000, 300, 0 -> median 150): a late collective
    (late,) = out["late_collectives"]
    assert (late["key"], late["rank"], late["step"]) == ("0#3", 1, 4)
    assert late["late_us"] == pytest.approx(5000 - 150)
    by_rank = {r["rank"]: r for r in out["ranks"]}
    assert by_rank[2]["arrived_last"] == 5 and by_rank[1]["arrived_last"] == 1
    # rank 0 waits for rank 2 in five collectives (300 µs each) and for rank 1 in one (5000 µs)
    waits = {(w["rank"], w["waited_for"]): w for w in out["waits"]}
    assert waits[(0, 2)]["ms"] == pytest.approx(5 * 0.300) and waits[(0, 2)]["collectives"] == 5
    assert waits[(0, 1)]["ms"] == pytest.approx(5.0)
    assert by_rank[0]["waited_ms"] == pytest.approx(5 * 0.300 + 5.0)
    # the heat map: every rank's 6 steps of 10 ms; the critical path is the straggler's
    assert out["heatmap"]["ranks"] == [0, 1, 2, 3] and out["heatmap"]["steps"] == [1, 2, 3, 4, 5, 6]
    assert all(v == pytest.approx(10.0) for line in out["heatmap"]["step_ms"] for v in line)
    assert out["critical_path"]["rank"] == 2 and out["critical_path"]["available"]
    assert out["timeline_ranks"] == [0, 2]  # the straggler and the rank least late
    # the traces name no host: each rank's clock aligned on the collectives' ends (here they end together)
    assert out["clock"]["aligned"].startswith("by the collectives' ends, one offset per host (a rank whose")
    assert out["clock"]["offsets_us"] == {f"rank {r}": 0.0 for r in range(4)}


def test_host_clocks_are_aligned_on_the_collectives_ends(tmp_path):
    """Two hosts whose clocks are 7 ms apart: the offset is estimated from the collectives' ends, and
    the arrivals compared on one clock (rank 2 still the straggler, no late collective from the clocks)."""
    d = tmp_path / "job"
    for r, arrive in ARRIVE.items():
        skewed = 7_000_000 if r >= 2 else 0  # ns: host b's clock is 7 ms ahead
        write_rank(d, f"rank{r}.pt.trace.json", r, 4, [STEP_US] * 6, arrive_us=[0] * 6 if r == 1 else arrive,
                   last_us=[300] * 6, nelems=NELEMS, host="a" if r < 2 else "b",
                   base_ns=1_700_000_000_000_000_000 + skewed)
    out = analyse_ranks([d], parallel=False)
    assert out["clock"]["aligned"] == "by the collectives' ends, one offset per host"
    assert out["clock"]["offsets_us"]["a"] == 0.0
    assert out["clock"]["offsets_us"]["b"] == pytest.approx(7000.0)
    assert [s["rank"] for s in out["stragglers"]] == [2]
    assert out["late_collectives"] == []


def test_summaries_are_kept_and_a_changed_file_is_read_again(four, tmp_path):
    cache = tmp_path / "cache"
    first = analyse_ranks([four], parallel=False, cache_root=cache)
    assert first["cache"]["misses"] == 4 + 2 and first["mode"] == "sequential (asked for)"  # + 2 picked ranks
    assert len(list((cache / "rank_summaries").glob("*.json"))) == 4 + 2  # 4 summaries, 2 picked ranks' details
    again = analyse_ranks([four], parallel=False, cache_root=cache)
    assert again["mode"] == "all 4 summaries read from the cache" and again["cache"]["hits"] == 4 + 2
    for k in ("ranks", "collectives", "stragglers", "late_collectives", "waits", "heatmap", "timeline",
              "critical_path"):
        assert again[k] == first[k], k
    # rank 3 rewritten (slower steps): its summary is computed again, the others read
    write_rank(four, "rank3.pt.trace.json", 3, 4, [STEP_US * 2] * 6, nelems=NELEMS)
    third = analyse_ranks([four], parallel=False, cache_root=cache)
    assert "3 of 4 summaries from the cache" in third["mode"]
    assert [r["step_ms_median"] for r in third["ranks"]] == [10.0, 10.0, 10.0, 20.0]


def test_a_rank_that_fails_is_named_and_left_out(four):
    (four / "rank3.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur"')
    out = analyse_ranks([four], parallel=False)
    assert [r["rank"] for r in out["ranks"]] == [0, 1, 2]
    (failed,) = out["failed"]
    assert failed["name"] == "rank3.pt.trace.json" and "truncated" in failed["error"]
    assert any(p["check"] == "unreadable" and p["message"].startswith("rank3.pt.trace.json: not read")
               for p in out["problems"])
    assert any(p["check"] == "missing_rank" and "rank 3 is missing" in p["message"] for p in out["problems"])
    assert out["collectives"]["matched"] == 6  # the three readable ranks' collectives still compared


def test_without_dask_the_option_says_how_to_install_it(four, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_dask(name, *a, **k):
        if name.startswith("dask") or name.startswith("distributed"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(TraceError, match=r"--dask needs the optional packages dask and distributed: pip install"):
        analyse_ranks([four], dask="local:2")


def _make_job(folder: Path, ranks: int = 8) -> dict:
    """bench/make_rank_job.py on the committed capture: ``ranks`` ranks, a straggler and a late collective."""
    spec = importlib.util.spec_from_file_location("make_rank_job", ROOT / "bench" / "make_rank_job.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--ranks", str(ranks), "--mb", "1", "--out", str(folder), "--capture", str(CAPTURE), "--workers", "1",
              "--straggler-ms", "30", "--late-ms", "150", "--name", "job"])
    return json.loads((folder / "job.planted.json").read_text())


@pytest.mark.slow  # a LocalCluster and a process pool start (5-16 s on the shared 2-core machine)
def test_eight_ranks_on_a_dask_local_cluster_give_the_local_pools_figures(tmp_path):
    pytest.importorskip("distributed")
    plan = _make_job(tmp_path)
    job = tmp_path / "job"
    dask = analyse_ranks([job], dask="local:2", dask_memory_limit="1GiB")
    local = analyse_ranks([job])
    assert dask["mode"].startswith("dask (a Dask LocalCluster of 2 worker processes: 2 workers, 1.0 GiB")
    assert local["mode"].startswith(("parallel", "sequential"))
    for k in ("ranks", "collectives", "stragglers", "late_collectives", "waits", "thresholds", "heatmap",
              "timeline", "critical_path", "clock", "problems"):
        assert dask[k] == local[k], k
    assert [s["rank"] for s in dask["stragglers"]] == [plan["straggler"]]
    late = dask["late_collectives"][0]
    assert (late["key"], late["rank"]) == (plan["late_key"], plan["late_rank"])
    assert late["excess_us"] == pytest.approx(plan["late_ms"] * 1e3, rel=0.1)
    assert dask["collectives"]["matched"] == plan["collectives_per_rank"]
    # one rank at a time per worker: two workers, each under its limit
    assert len(dask["workers"]) == 2 and sum(w["ranks"] for w in dask["workers"]) == 8
    assert all(w["peak_rss_bytes"] < dask["memory_limit_bytes"] for w in dask["workers"])


def test_the_trace_job_returns_its_stored_analysis_on_a_reopen(four, tmp_path, monkeypatch):
    """A second open of an unchanged trace with the same options: the stored result, its files in the new run's
    folder; another option, or a touched file, runs the analyses again."""
    from diagnostics.analyses.trace.job import analyze, load_columns
    from diagnostics.results import UNSET, to_json

    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))

    class Ctx:
        def __init__(self, name):
            self.artifact_dir = tmp_path / name
            self.artifact_dir.mkdir()

        def progress(self, fraction, message=""):
            pass

    path = str(four / "rank0.pt.trace.json")
    first = analyze(Ctx("a"), {"path": path, "ranks": [str(four)]})
    assert first.trace_cache.hit is False and first.trace_cache.result is UNSET
    second = analyze(Ctx("b"), {"path": path, "ranks": [str(four)]})
    assert second.trace_cache.result is True
    assert second.columns_dir == str(tmp_path / "b")
    assert second.critical_path.trace_file == str(tmp_path / "b" / "critical_path.pt.trace.json")
    assert json.loads(Path(second.critical_path.trace_file).read_text())["traceEvents"]
    assert len(load_columns(second.columns_dir).events) == first.metrics.events
    for part in ("summary", "temporal_breakdown", "top_operators", "timeline", "metrics"):
        assert to_json(getattr(second, part)) == to_json(getattr(first, part)), part
    # the ranks' figures are the stored ones; how this open went is its own (issue #42: the first run's
    # seconds and summary-cache counts came back)
    own = ("seconds", "cache", "mode", "workers", "memory_limit_bytes")
    a, b = json.loads(to_json(first.ranks)), json.loads(to_json(second.ranks))
    assert {k: v for k, v in a.items() if k not in own} == {k: v for k, v in b.items() if k not in own}
    n = first.ranks.n_files - len(first.ranks.failed)
    assert first.ranks.cache.misses >= first.ranks.n_files and len(first.ranks.workers) >= 1
    assert (second.ranks.cache.hits, second.ranks.cache.misses) == (n, 0) and second.ranks.workers == ()
    assert second.ranks.mode.startswith("the stored analysis") and "none read again" in second.ranks.mode
    assert second.ranks.seconds == second.trace_cache.open_s != first.ranks.seconds
    other = analyze(Ctx("c"), {"path": path, "ranks": [str(four)], "top": 5})
    assert other.trace_cache.result is UNSET and other.trace_cache.hit is True  # columns reused
    st = os.stat(four / "rank2.pt.trace.json")
    os.utime(four / "rank2.pt.trace.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    touched = analyze(Ctx("d"), {"path": path, "ranks": [str(four)]})
    assert touched.trace_cache.result is UNSET


def test_a_dask_trace_job_may_open_tcp_and_is_refused_in_server_safe_mode(monkeypatch, tmp_path):
    from diagnostics import sandbox
    from diagnostics.errors import TrustError
    from diagnostics.runner import Job
    from diagnostics.settings import SAFE_MODE_ENV

    dask_job = Job("trace", None, {"path": str(tmp_path), "ranks": [str(tmp_path)], "dask": "local:2"})
    assert sandbox.needs_network(dask_job)
    assert not sandbox.needs_network(Job("trace", None, {"path": str(tmp_path), "ranks": [str(tmp_path)]}))
    assert sandbox.policy_for(dask_job, tmp_path, tmp_path).network
    monkeypatch.setenv(SAFE_MODE_ENV, "1")
    with pytest.raises(TrustError, match="a Dask cluster .* is used only outside server-safe mode"):
        sandbox.policy_for(dask_job, tmp_path, tmp_path)


def test_the_cli_flags_reach_the_job(tmp_path):
    from diagnostics.cli.main import build_parser
    from diagnostics.cli.trace import trace_job

    write_rank(tmp_path, "rank0.json", 0, 2, [1000])
    write_rank(tmp_path, "rank1.json", 1, 2, [1000])
    args = build_parser().parse_args(["trace", "analyze", str(tmp_path), "--dask", "local:3", "--dask-memory-limit",
                                      "3GB", "--timeline-ranks", "1,0"])
    name, options = trace_job(args)
    assert name == "trace"
    assert (options["dask"], options["dask_memory_limit"], options["timeline_ranks"]) == ("local:3", "3GB", "1,0")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["trace", "analyze", str(tmp_path), "--timeline-ranks", "one"])


def test_a_public_pair_of_nccl_ranks(tmp_path):
    """Two ranks of a 128-rank GPU job from Holistic Trace Analysis' test data (tests/data/distributed/
    hta_sampled): their NCCL kernels are the collectives, matched by order (no sequence numbers); the
    missing 126 ranks are a named problem; every figure is there or said to be missing."""
    out = analyse_ranks([ROOT / "tests" / "data" / "distributed" / "hta_sampled"], parallel=False)
    assert [(r["rank"], r["rank_source"], r["steps"]) for r in out["ranks"]] == [(0, "distributedInfo", 2),
                                                                                 (1, "distributedInfo", 2)]
    assert [p["check"] for p in out["problems"]] == ["missing_rank"]
    assert out["problems"][0]["message"].startswith("world_size is 128 but ranks 2, 3, 4,")
    coll = out["collectives"]
    assert coll["events"] == ["communication kernels"] and coll["matched_by"] == ["order"]
    assert coll["matched"] == 10 and coll["partial"] == 0
    (row,) = coll["by_name"]
    assert row["name"].startswith("ncclKernel_SendRecv") and row["family"] == "send_recv"
    assert row["bytes_median"] is None and row["busbw_median"] is None  # the kernels record no sizes here
    # the traces name no host: rank 1's clock offset estimated from the kernels' ends, rank 0 the reference
    assert out["clock"]["offsets_us"]["rank 0"] == 0.0 and "rank 1" in out["clock"]["offsets_us"]
    assert out["critical_path"]["available"] and out["critical_path"]["rank"] == out["slowest_rank"]


def test_the_users_comm_kernel_pattern_reaches_every_rank(tmp_path):
    """In-house collective kernels read as compute in the ranks' view too until --comm-kernels names them;
    the summaries kept for one pattern are not reused for another."""
    from tests.trace.rank_traces import rank_doc

    d = tmp_path / "job"
    d.mkdir()
    for r in (0, 1):
        doc = rank_doc(r, 2, [1000.0] * 4)
        for e in doc["traceEvents"]:
            if e.get("name", "").startswith("ncclDevKernel"):
                e["name"] = "acme_ring_xfer_kernel<bf16>"
        (d / f"rank{r}.pt.trace.json").write_text(json.dumps(doc))
    cache = tmp_path / "cache"
    plain = analyse_ranks([d], parallel=False, cache_root=cache)
    assert [r["comm_ms_median"] for r in plain["ranks"]] == [0.0, 0.0]
    named = analyse_ranks([d], parallel=False, cache_root=cache, comm_kernels=r"^acme_ring_")
    assert [r["comm_ms_median"] for r in named["ranks"]] == [pytest.approx(COMM_US / 1e3)] * 2
