"""Real torchrun runs: 2 CPU processes over gloo on loopback, the mlp sample, a few steps.

An injected straggler (rank 1 sleeps 150 ms in every step) is found (a clean run flagging nobody
is checked through the page, tests/distributed/test_page.py); a rank that dies is named within the timeout; a hung run is stopped by the launcher's timeout.
"""

import json
import time
from pathlib import Path

import psutil
import pytest
import torch

from diagnostics.analyses.distributed.job import analyze
from diagnostics.analyses.distributed.dist_job import DistJob, DistributedError, choose_backend, steps_path, trace_path
from diagnostics.analyses.distributed.launch import closed_pids, exit_codes, failed_rank, launch, torchrun_command
from diagnostics.runner import AnalysisContext, Job, run_job
from diagnostics.spec import ModelSpec

MLP = ModelSpec(source="sample", name="mlp")
SLEEP_MS = 150.0


def _ctx(tmp_path, options):
    return AnalysisContext(Job("distributed", MLP, options), tmp_path)


def _rank_processes_left(tmp_path):
    """This test's ranks still running (their --job file is under tmp_path: not another test's ranks)."""
    me = psutil.Process()
    left = [p for p in psutil.process_iter(["cmdline"])
            if "diagnostics.analyses.distributed.rank_main" in (cmd := " ".join(p.info["cmdline"] or []))
            and str(tmp_path) in cmd and p.pid != me.pid]
    return [p.pid for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_injected_straggler_is_found_through_the_runner(tmp_path):
    outcome = run_job(Job("distributed", MLP, {"nproc": 2, "steps": 4, "warmup": 1, "straggler_rank": 1,
                                               "straggler_sleep_ms": SLEEP_MS}), artifact_dir=tmp_path)
    assert outcome.ok, (outcome.error, outcome.log_tail)
    res = outcome.result
    assert res.stragglers == (1,)
    r0, r1 = res.ranks
    assert r1.straggler and not r0.straggler
    # Rank 1's own work holds the sleep; rank 0 spends that time waiting inside the all-reduce.
    assert r1.busy_ms >= SLEEP_MS
    assert r0.exposed_comm_ms >= 0.5 * SLEEP_MS
    assert r0.busy_ms < res.thresholds.threshold_ms < r1.busy_ms
    # Both ranks' steps are as long as the slow one (DDP synchronises them).
    assert min(r0.step_ms, r1.step_ms) >= SLEEP_MS
    # The trace's step time agrees with perf_counter around each step, measured independently.
    for r in (r0, r1):
        assert r.wall_step_ms == pytest.approx(r.step_ms, rel=0.1)
    out = Path(outcome.artifact_dir) / "distributed"
    for rank in (0, 1):
        doc = json.loads(trace_path(out, rank).read_text())
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo")
        assert len(json.loads(steps_path(out, rank).read_text())["step_ms"]) == 4
    allreduce = next(c for c in res.collectives if c.name == "gloo:all_reduce")
    n_params = sum(p.numel() for p in __import__("sample_models").SAMPLES["mlp"].build().parameters())
    assert allreduce.mean_bytes == n_params * 4  # one float32 bucket holding every gradient
    assert allreduce.calls == 2 * 4 and allreduce.ranks == 2
    assert res.metrics.steps_per_rank == 4
    assert "--nproc_per_node 2" in res.launch.command


@pytest.mark.slow
def test_a_dying_rank_is_named_without_hanging(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"rank 1 died with exit code 3 at step 1"):
        analyze(_ctx(tmp_path, {}), {"nproc": 2, "steps": 3, "warmup": 1, "die_rank": 1, "die_step": 1,
                                     "pg_timeout_s": 30, "run_timeout_s": 90})
    assert time.monotonic() - t0 < 60
    assert not _rank_processes_left(tmp_path)


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_named_not_the_peer_that_lost_it(tmp_path):
    # Rank 1 SIGKILLs itself (as the OOM killer would: no status, no Python error); rank 0 then
    # fails with "Connection reset by peer" and is stopped by torchrun. Rank 1 is the cause.
    with pytest.raises(DistributedError) as err:
        analyze(_ctx(tmp_path, {}), {"nproc": 2, "steps": 3, "warmup": 1, "die_rank": 1, "die_step": 1,
                                     "die_how": "kill", "pg_timeout_s": 30, "run_timeout_s": 90})
    msg = str(err.value)
    assert ("failed: rank 1 was killed (SIGKILL, exit -9: the OOM killer, out of RAM?) without reporting a Python "
            "error") in msg
    assert "rank 0 failed: " not in msg
    assert not _rank_processes_left(tmp_path)


@pytest.mark.slow
def test_a_hung_run_is_stopped_by_the_timeout(tmp_path):
    job = DistJob(spec=MLP.to_dict(), out_dir=str(tmp_path), steps=2, warmup=0, straggler_rank=1,
                  straggler_sleep_ms=60_000)
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"timed out after 4 s.*not finished: \[0, 1\]"):
        launch(job, 2, timeout_s=4)
    assert time.monotonic() - t0 < 20
    time.sleep(0.5)
    assert not _rank_processes_left(tmp_path)


def test_bad_options_are_named(tmp_path):
    with pytest.raises(DistributedError, match="straggler_rank 5 is not a rank of a 2-process run"):
        analyze(_ctx(tmp_path, {}), {"nproc": 2, "straggler_rank": 5})
    from diagnostics.declare import OptionError

    with pytest.raises(OptionError, match=r"option nproc: must be an integer from 1 to 64, got 0"):
        analyze(_ctx(tmp_path, {}), {"nproc": 0})
    with pytest.raises(OptionError, match=r"option backend: must be one of auto, gloo, nccl, got 'mpi'"):
        analyze(_ctx(tmp_path, {}), {"nproc": 2, "backend": "mpi"})
    if not torch.cuda.is_available():
        with pytest.raises(DistributedError, match="nccl needs CUDA"):
            analyze(_ctx(tmp_path, {}), {"nproc": 2, "backend": "nccl"})


@pytest.mark.parametrize("requested,nproc,gpus,backend,why", [
    ("auto", 2, 0, "gloo", "auto: no CUDA GPU here, gloo on CPU"),
    ("auto", 2, 1, "gloo", "auto: 2 processes but only 1 CUDA GPU (nccl needs one GPU per process): gloo on CPU; "
                           "use --nproc 1 for nccl"),
    ("auto", 2, 2, "nccl", "auto: 2 processes, 2 CUDA GPUs: nccl, one GPU per process"),
    ("auto", 1, 8, "nccl", "auto: 1 process, 8 CUDA GPUs: nccl, one GPU per process"),
    ("gloo", 2, 8, "gloo", "requested"),
    ("nccl", 2, 2, "nccl", "requested"),
])
def test_backend_choice_by_gpu_count(requested, nproc, gpus, backend, why):
    assert choose_backend(requested, nproc, gpus) == (backend, why)


def test_backend_choice_refuses_nccl_the_gpus_cannot_serve():
    with pytest.raises(DistributedError, match=r"2 NCCL processes need 2 GPUs; this machine has 1"):
        choose_backend("nccl", 2, 1)
    with pytest.raises(DistributedError, match="backend nccl needs CUDA GPUs; none is available"):
        choose_backend("nccl", 1, 0)
    with pytest.raises(DistributedError, match="unknown backend 'mpi'"):
        choose_backend("mpi", 1, 0)


def test_auto_backend_on_a_one_gpu_machine_launches_gloo_and_says_why(tmp_path, monkeypatch):
    # A 1-GPU box asked for 2 processes: gloo (was nccl, which then failed on the shared GPU).
    import diagnostics.analyses.distributed.launch as launch_mod

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    seen, progress = {}, []

    def fake_launch(job, nproc, **kw):
        seen.update(job=job, nproc=nproc)
        raise DistributedError("stop here")

    monkeypatch.setattr(launch_mod, "launch", fake_launch)
    ctx = AnalysisContext(Job("distributed", MLP, {}), tmp_path, lambda f, m: progress.append(m))
    with pytest.raises(DistributedError, match="stop here"):
        analyze(ctx, {"nproc": 2, "backend": "auto"})
    assert seen["job"].backend == "gloo" and seen["nproc"] == 2
    assert any("backend gloo: auto: 2 processes but only 1 CUDA GPU" in m for m in progress)


def test_torchrun_command_single_and_multi_node():
    cmd = torchrun_command("/x/job.json", 2, python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"] and "--standalone" in cmd
    assert cmd[-4:] == ["-m", "diagnostics.analyses.distributed.rank_main", "--job", "/x/job.json"]
    multi = torchrun_command("job.json", 8, nnodes=2, rdzv_endpoint="host:29400", python="py")
    assert "--standalone" not in multi
    assert multi[multi.index("--rdzv_endpoint") + 1] == "host:29400" and multi[multi.index("--nnodes") + 1] == "2"


SUMMARY = """Failures:
[1]:
  time      : 2026-11-22_01:37:55
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 11226)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_01:37:55
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 11227)
"""


def test_failed_rank_rules():
    codes = exit_codes(SUMMARY)
    assert codes == {0: -15, 1: 3}
    # A rank that crashed beats one that torchrun stopped (SIGTERM) afterwards.
    running = {0: {"state": "running", "time": 1.0}, 1: {"state": "running", "time": 2.0}}
    assert failed_rank(running, codes)[0] == 1
    # Python errors: the first one is the cause.
    errs = {0: {"state": "error", "time": 5.0, "error": "RuntimeError: peer closed"},
            1: {"state": "error", "time": 4.0, "error": "ValueError: bad batch"}}
    rank, why = failed_rank(errs, {0: 1, 1: 1})
    assert rank == 1 and "ValueError: bad batch" in why
    # Nothing reported: torchrun's root cause.
    assert failed_rank({0: {"state": "not started"}, 1: {"state": "not started"}}, {}, SUMMARY)[0] == 1


# What torchrun 2.13 logs when rank 1 is SIGKILLed from outside and rank 0 then fails on the
# lost connection: torchrun sends rank 0 SIGTERM (its exit -15), the root cause is rank 1 (-9).
KILLED_LOG = """[rank0]: RuntimeError: Read error [127.0.0.1]:3981: Connection reset by peer.
W1123 08:01:29.297000 17607 api.py:1028] Sending process 17618 closing signal SIGTERM
E1123 08:01:29.316000 17607 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 17619) of binary: python
Failures:
[1]:
  time      : 2026-11-23_08:01:29
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 17618)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_08:01:29
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 17619)  (SIGKILL)
  error_file: <N/A>
"""


def test_a_sigkilled_rank_is_blamed_not_the_rank_that_lost_its_peer():
    statuses = {0: {"rank": 0, "state": "error", "time": 9.0,
                    "error": "RuntimeError: Read error [127.0.0.1]:3981: Connection reset by peer"},
                1: {"rank": 1, "state": "running", "time": 1.0, "pid": 17619}}
    assert exit_codes(KILLED_LOG) == {0: -15, 1: -9} and closed_pids(KILLED_LOG) == {17618}
    rank, why = failed_rank(statuses, exit_codes(KILLED_LOG), KILLED_LOG)
    assert rank == 1
    assert why.startswith("rank 1 was killed (SIGKILL, exit -9: the OOM killer, out of RAM?) without reporting a "
                          "Python error")
    assert "out of memory" not in why  # the runner would take those words for its worker running out of memory
    assert why.endswith("then rank 0 failed (RuntimeError) and was stopped by torchrun")
    # Without the log's root cause and pids the exit codes alone still tell: -9 is not torchrun's SIGTERM.
    assert failed_rank(statuses, {0: -15, 1: -9})[0] == 1


def test_a_rank_torchrun_sigkilled_itself_is_not_blamed():
    # Rank 0 crashed (exit 3); torchrun sent rank 1 SIGTERM, rank 1 lingered and got SIGKILL from torchrun.
    log = ("Sending process 501 closing signal SIGTERM\n"
           "Unable to shutdown process 501 via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL\n"
           "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 501)  (SIGKILL)\n"
           "  rank      : 0 (local_rank: 0)\n  exitcode  : 3 (pid: 500)\n")
    statuses = {0: {"state": "running", "time": 2.0, "pid": 500}, 1: {"state": "running", "time": 1.0, "pid": 501}}
    rank, why = failed_rank(statuses, exit_codes(log), log)
    assert rank == 0
    assert why == "rank 0 died with exit code 3 without reporting a Python error; then rank 1 was stopped by torchrun"
    # Other signals are named too.
    assert failed_rank({0: {"state": "running"}}, {0: -11})[1].startswith(
        "rank 0 was killed (SIGSEGV, exit -11: a segmentation fault)")


@pytest.mark.slow
def test_the_runner_timeout_leaves_no_rank_running(tmp_path):
    # The worker is killed (SIGKILL) by the runner; torchrun gets SIGTERM (PDEATHSIG) and stops its ranks.
    outcome = run_job(Job("distributed", MLP, {"nproc": 2, "steps": 2, "warmup": 0, "straggler_rank": 0,
                                               "straggler_sleep_ms": 60_000}), artifact_dir=tmp_path, timeout_s=12)
    assert outcome.status == "timeout"
    deadline = time.monotonic() + 15
    while _rank_processes_left(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _rank_processes_left(tmp_path)
