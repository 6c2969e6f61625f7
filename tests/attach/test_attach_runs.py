"""Attach mode end to end: the test scripts (tests/attach/scripts) run under ``python -m diagnostics
run``, their figures checked against what each script timed itself. Each runs a real Python (and
torch import) per process, so these are slow tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.attach.harness import ROOT, SCRIPTS, env_for, run_attached, run_bare

pytestmark = pytest.mark.slow
PHASES = ("data_wait", "forward", "backward", "optimizer", "comm", "sync", "evaluation", "host")


def _sums(result: dict) -> None:
    """Every step's parts sum to its time, and the headline parts to the headline step time."""
    assert result["step_table"]
    for row in result["step_table"]:
        assert abs(sum(row[f"{k}_ms"] for k in PHASES) - row["step_ms"]) < 1e-6 * max(1.0, row["step_ms"]) + 1e-6, row
    assert abs(sum(result["breakdown_ms"].values()) - result["step_ms"]) < 1e-6 * result["step_ms"] + 1e-9
    for r in result["ranks"]:
        assert abs(sum(r["breakdown_ms"].values()) - r["step_ms"]) < 1e-6 * r["step_ms"] + 1e-9


def test_a_dataloader_bound_script_waits_for_data_as_long_as_its_dataset_sleeps(tmp_path, near):
    ran = run_attached(tmp_path, "loader_bound.py", "0", options=("--at", "6", "--steps", "4"))
    assert ran.code == 0, ran.stderr[-3000:]
    r, own = ran.result, ran.self_timing
    assert r["bottleneck"]["category"] == "data_wait" and r["bottleneck"]["share"] > 0.7
    near(r["breakdown_ms"]["data_wait"], own["batch_sleep_ms"])  # the dataset's own sleeps per batch
    assert r["steps"] == own["steps"] and r["profiled_steps"] == [6, 9] and r["step_boundary"] == "optimizer"
    _sums(r)
    finding = next(f for f in r["findings"] if f["id"] == "data_wait")
    assert finding["status"] == "fail" and "num_workers is 0" in finding["suggestion"]
    assert r["fix_first"][0]["source"] == "run: data_wait"
    assert r["fix_first"][0]["est_saving_ms"] == pytest.approx(r["breakdown_ms"]["data_wait"])
    assert r["model"]["batch_size"] == 4 and r["optimizers"][0]["type"] == "SGD"
    assert r["model"]["param_dtypes"] == {"float32": 8 * 16 + 16 + 16 * 2 + 2}
    assert r["overhead_pct"] is not None and r["trace"] == str(Path(r["run_dir"]).resolve() / "trace.json.gz")
    assert Path(r["trace"]).exists()  # a path a program can open
    assert r["gradients"]["metrics"]["layers"] == 2 and r["gradients"]["metrics"]["steps"] == 4


def test_workers_time_fetch_and_collate_per_batch_and_too_few_workers_are_named(tmp_path, near):
    ran = run_attached(tmp_path, "loader_bound.py", "2", options=("--max-warmup", "12", "--steps", "3"),
                       env={"SAMPLE_MS": "10", "STEPS": "30"})  # the automatic warm-up, one process
    assert ran.code == 0, ran.stderr[-3000:]
    r, own = ran.result, ran.self_timing
    assert r["window"]["steps_profiled"] == 3 and r["window"]["reason"]
    w = r["workers"]
    assert w["num_workers"] == 2 and {x["worker"] for x in w["per_worker"]} == {0, 1}
    near(w["fetch_collate_ms"], own["batch_sleep_ms"])  # one batch of a worker: its samples' sleeps
    # 2 workers each 40 ms a batch against a step of ~1 ms: about 40 workers would be needed
    finding = next(f for f in r["findings"] if f["id"] == "data_wait")
    assert finding["status"] == "fail" and finding["numbers"]["workers_needed"] > 2
    assert ("too few workers" in finding["suggestion"]) == (finding["numbers"]["workers_needed"] <= os.cpu_count())


@pytest.fixture(scope="module")
def host_bound(tmp_path_factory):
    """One attached run of the Python-bound script, read by two tests."""
    tmp = tmp_path_factory.mktemp("host_bound")
    return tmp, run_attached(tmp, "host_bound.py", options=("--at", "6", "--steps", "4"))


def test_a_python_bound_script_is_host_bound_by_its_own_busy_loop(host_bound, near):
    _, ran = host_bound
    assert ran.code == 0, ran.stderr[-3000:]
    r = ran.result
    assert r["bottleneck"]["category"] == "host"
    near(r["breakdown_ms"]["host"], ran.self_timing["host_ms"])
    assert next(f for f in r["findings"] if f["id"] == "host_bound")["status"] == "fail"
    _sums(r)


def test_two_optimizers_and_accumulation_count_iterations(tmp_path):
    ran = run_attached(tmp_path, "gan_accumulate.py", options=("--at", "5", "--steps", "3"))
    assert ran.code == 0, ran.stderr[-3000:]
    r, own = ran.result, ran.self_timing
    assert r["steps"] == own["iterations"] == 16  # 32 optimizer steps, 96 micro-batches: 16 iterations
    assert r["step_boundary"] == "optimizer" and "every 2 optimizer steps" in r["step_boundary_detail"]
    assert [o["type"] for o in r["optimizers"]] == ["SGD", "Adam"]
    assert r["profiled_steps"] == [5, 7] and r["window"]["steps_profiled"] == 3
    _sums(r)


def test_a_crash_passes_its_traceback_and_exit_code_through_and_keeps_the_measurements(tmp_path):
    bare = run_bare(tmp_path, "crash.py")
    ran = run_attached(tmp_path, "crash.py", options=("--at", "3", "--steps", "3"))
    assert bare.code == ran.code == 1
    assert "RuntimeError: the loss went bad at step 12" in bare.stderr
    assert ran.script_stderr == bare.stderr.strip()  # the same traceback, line for line
    assert ran.script_stdout == bare.stdout.strip() == "training"
    r = ran.result
    assert r["exit_code"] == 1 and r["status"] == "failed" and r["steps"] == 12
    assert r["profiled_steps"] == [3, 5] and (Path(r["run_dir"]) / "trace.json.gz").exists()
    assert any("ended during step 13" in n for n in r["notes"])


def test_argv_cwd_environment_stdin_stdout_and_exit_code_pass_through(tmp_path):
    work = tmp_path / "my project"
    work.mkdir()
    args = ("--lr", "0.1", "two words", "--", "-x")
    env = {"MY_SETTING": "kept", "EXIT_CODE": "7"}
    bare = run_bare(tmp_path, "passthrough.py", *args, env=env, stdin="hello\n", cwd=work)
    ran = run_attached(tmp_path, "passthrough.py", *args, env=env, stdin="hello\n", cwd=work)
    assert bare.code == ran.code == 7
    assert ran.script_stdout == bare.stdout.strip()
    assert "argv: ['--lr', '0.1', 'two words', '--', '-x']" in bare.stdout and f"cwd: {work}" in bare.stdout
    assert "env: kept" in bare.stdout and "stdin: hello" in bare.stdout
    assert ran.result["exit_code"] == 7 and ran.result["steps"] == 8
    assert ran.result["cwd"] == str(work)


def test_a_loop_without_an_optimizer_says_what_ended_its_steps(tmp_path, near):
    ran = run_attached(tmp_path, "no_optimizer.py", options=("--fallback-after", "1", "--at", "3", "--steps", "3"),
                       env={"BATCHES": "120"})
    assert ran.code == 0, ran.stderr[-3000:]
    r = ran.result
    assert r["step_boundary"] == "forward" and "Net.forward" in r["step_boundary_detail"]
    assert any("no optimizer stepped" in n for n in r["notes"])
    near(r["breakdown_ms"]["forward"], ran.self_timing["forward_ms"])
    assert r["bottleneck"]["category"] == "forward" and r["profiled_steps"] == [3, 5]
    _sums(r)


def test_two_rank_torchrun_gives_two_traces_and_the_faster_rank_waits_in_comm(tmp_path, near):
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", str(SCRIPTS / "dist_train.py")]
    # the automatic warm-up (decided by local rank 0, at most after 12 steps): both ranks profile the same steps
    ran = run_attached(tmp_path, "dist_train.py", command=cmd, options=("--max-warmup", "12", "--steps", "3"),
                       env={"STEPS": "30"})
    assert ran.code == 0, ran.stderr[-3000:]
    r = ran.result
    assert sorted(Path(t).name for t in r["trace"]) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert all(Path(t).is_absolute() and Path(t).exists() for t in r["trace"])
    ranks = {x["rank"]: x for x in r["ranks"]}
    first = r["profiled_steps"][0]
    assert set(ranks) == {0, 1} and all(x["profiled_steps"] == [first, first + 2] for x in ranks.values())
    assert 6 <= first <= 14 and not any("different steps" in n for n in r["notes"])
    slow = ran.self_timing["slow_ms"]  # rank 1's own sleep per step
    near(ranks[0]["breakdown_ms"]["comm"], slow, rel=0.3, abs_ms=5.0)  # rank 0 waits for it in all_reduce
    assert ranks[0]["bottleneck"]["category"] == "comm"
    assert ranks[1]["breakdown_ms"]["comm"] < 0.3 * slow
    assert r["waited_for_rank"] == 1 and ranks[1]["waited_for"]
    _sums(r)
    for name in r["trace"]:  # each trace says which rank it is (HTA, the Ranks view)
        import gzip

        doc = json.loads(gzip.decompress((Path(r["run_dir"]) / name).read_bytes()))
        assert doc["distributedInfo"]["rank"] == int(Path(name).name[4]) and doc["distributedInfo"]["world_size"] == 2
    assert r["ranks_view"]["ranks"] and r["ranks_view"]["n_files"] == 2
    p = subprocess.run([sys.executable, "-m", "diagnostics", "trace", "analyze",
                        *(str(Path(r["run_dir"]) / n) for n in sorted(r["trace"])), "--json", "--no-report", "-q"],
                       cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [x["rank"] for x in json.loads(p.stdout)["ranks"]["ranks"]] == [0, 1]


def test_every_exported_trace_opens_in_trace_analyze(host_bound):
    tmp_path, ran = host_bound
    trace = Path(ran.result["run_dir"]) / ran.result["trace"]
    p = subprocess.run([sys.executable, "-m", "diagnostics", "trace", "analyze", str(trace), "--json", "--no-report",
                        "-q"], cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert [s["step"] for s in out["summary"]["steps"]] == [6, 7, 8, 9]  # our step numbers, as ProfilerStep#N
    assert out["critical_path"]["available"]


def test_ctrl_c_stops_the_whole_tree_and_keeps_what_was_measured(tmp_path):
    env = env_for(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "diagnostics", "run", "--json", "--no-report", "--at", "3",
                             "--steps", "2", "--", sys.executable, str(SCRIPTS / "forever.py")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # no terminal: the Ctrl-C below reaches only the tool
    pids, deadline = set(), time.monotonic() + 120
    while len(pids) < 3 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "pid" in line:
            pids.add(int(line.split()[-1]))
    assert len(pids) == 3, pids  # the script and its two DataLoader workers
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]  # KeyboardInterrupt in the script: as bare
    assert "KeyboardInterrupt" in err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "interrupted" and result["steps"] > 3
    assert any("interrupted (Ctrl-C)" in n for n in result["notes"])
    time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def test_the_bootstrap_never_breaks_the_job_when_it_cannot_write(tmp_path):
    """Our own failure (an unwritable run folder): the script runs as it would bare, exit 0."""
    env = env_for(tmp_path, {"TORCHSCOPE_ATTACH_DIR": "/proc/no/such/folder",
                             "PYTHONPATH": str(ROOT / "diagnostics" / "attach" / "bootstrap")})
    p = subprocess.run([sys.executable, str(SCRIPTS / "host_bound.py")], cwd=tmp_path, env={**env, "STEPS": "12",
                                                                                             "HOST_MS": "1"},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stderr == "", p.stderr[-2000:]


def test_a_recompile_after_warm_up_is_found_in_its_step(tmp_path):
    ran = run_attached(tmp_path, "recompile.py", options=("--at", "4", "--steps", "3"))
    assert ran.code == 0, ran.stderr[-3000:]
    f = next(f for f in ran.result["findings"] if f["id"] == "recompiles")
    assert f["status"] == "fail" and f["numbers"]["steps"] == [10], f


def test_a_torchrun_whose_ranks_fail_at_once_says_so_and_passes_the_exit_code(tmp_path):
    (tmp_path / "bad.py").write_text("import torch\nraise SystemExit(3)\n")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    ran = run_attached(tmp_path, "bad.py", command=[torchrun, "--standalone", "--nproc-per-node", "2",
                                                    str(tmp_path / "bad.py")])
    assert ran.code == 1  # torchrun's own exit code when its ranks fail
    assert ran.result["status"] == "failed" and ran.result["steps"] == 0
    assert "no step was seen" in ran.result["notes"][0]


PLAIN = """import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
for step in range(12):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    print(f"step {step} loss {loss.item():.10f}")
print("loaded:", sorted(m for m in ("torch._dynamo", "torch._inductor", "sympy") if m in sys.modules))
"""


def test_the_window_loads_no_compiler_and_its_trace_is_gzipped_by_the_launcher_or_read_raw(tmp_path, monkeypatch):
    """A script that never imports inductor: torch.profiler's start imported it (with dynamo and sympy: seconds)
    until the window's profiler read torch without it; it loads what bare loads. The trace, exported raw inside
    the script, is gzipped by the launcher; a raw one left (the launcher stopped first) reads the same."""
    import gzip

    from diagnostics.analyses.attach.job import analyse_run
    from diagnostics.results import to_json

    (tmp_path / "plain.py").write_text(PLAIN)
    for d in ("bare", "attached"):
        (tmp_path / d).mkdir()
    p = subprocess.run([sys.executable, str(tmp_path / "plain.py")], cwd=tmp_path / "bare", env=env_for(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("loaded: []"), p.stderr[-2000:]
    ran = run_attached(tmp_path / "attached", "plain.py", command=[sys.executable, str(tmp_path / "plain.py")],
                       options=("--at", "4", "--steps", "3"))
    assert ran.code == 0, ran.stderr[-3000:]
    assert ran.script_stdout == p.stdout.strip()  # the losses to the last digit, and no compiler loaded
    r = ran.result
    assert r["profiled_steps"] == [4, 6] and r["step_boundary"] == "manual update"
    trace = Path(r["trace"])
    assert trace.name == "trace.json.gz" and not (trace.parent / "trace.json").exists()
    raw = gzip.decompress(trace.read_bytes())
    assert b"ProfilerStep#4" in raw and b"ProfilerStep#6" in raw
    # what the views read (the ops, the allocation events); input shapes only with --shapes (issue 39: a smaller
    # trace, a cheaper window), which the next test checks
    assert b'"[memory]"' in raw and b'"Input Dims"' not in raw
    # the launcher stopped before it gzipped: the analysis reads the raw trace, to the same figures
    trace.unlink()
    (trace.parent / "trace.json").write_bytes(raw)
    again = json.loads(to_json(analyse_run(trace.parent, exit_code=0)))
    assert again["trace"] == str(trace.parent / "trace.json")
    assert again["memory"] == r["memory"] and again["memory"]["alloc_peak_bytes_per_step"]
    assert again["step_table"] == r["step_table"]
    # a trace read ahead (the launcher parses it beside the script) is the one analysed, once, if unchanged
    from diagnostics.analyses.attach import job
    from diagnostics.trace import ingest

    raw_path = trace.parent / "trace.json"
    job.read_ahead(raw_path)
    assert str(raw_path) in job._READ_AHEAD
    real = ingest.load_trace
    monkeypatch.setattr(ingest, "load_trace", lambda p: (_ for _ in ()).throw(OSError("not read ahead")))
    ahead = json.loads(to_json(analyse_run(trace.parent, exit_code=0)))
    # (this path's parse used and dropped; another test's run in this process may have left its own)
    assert ahead["memory"] == r["memory"] and ahead["step_table"] == r["step_table"]
    assert str(raw_path) not in job._READ_AHEAD
    monkeypatch.setattr(ingest, "load_trace", real)
    job.read_ahead(raw_path)  # then the file changes: read again, not the stale parse
    assert str(raw_path) in job._READ_AHEAD
    raw_path.write_bytes(raw + b"\n")
    monkeypatch.setattr(ingest, "load_trace", lambda p: (_ for _ in ()).throw(OSError("not read ahead")))
    failed = json.loads(to_json(analyse_run(trace.parent, exit_code=0)))
    assert any("not read ahead" in n for n in failed["notes"]) and str(raw_path) not in job._READ_AHEAD


def test_shapes_are_recorded_in_the_trace_when_asked(tmp_path):
    """--shapes: the operators' input shapes in the trace (record_shapes), for a reader of the trace that wants
    them; the run's own figures do not read them."""
    import gzip

    (tmp_path / "plain.py").write_text(PLAIN)
    ran = run_attached(tmp_path, "plain.py", command=[sys.executable, str(tmp_path / "plain.py")],
                       options=("--at", "4", "--steps", "2", "--shapes", "--no-grads"))
    assert ran.code == 0, ran.stderr[-3000:]
    raw = gzip.decompress(Path(ran.result["trace"]).read_bytes())
    assert b'"Input Dims"' in raw and b"ProfilerStep#5" in raw
