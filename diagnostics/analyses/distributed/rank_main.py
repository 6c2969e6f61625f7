"""One torchrun rank: DDP training of the job's model under torch.profiler, trace written per rank.

Run by torchrun (``python -m torch.distributed.run ... -m diagnostics.analyses.distributed.rank_main
--job JOB``). Reads RANK / WORLD_SIZE / LOCAL_RANK from the environment, joins the process group
with a timeout (a lost peer fails a collective instead of hanging), trains ``warmup + steps``
steps and writes, in the job's out_dir:

* rank{R}.pt.trace.json   the Chrome trace; torch.profiler adds ``distributedInfo`` (rank,
                          world_size, backend) itself when a process group is initialised, and
                          this module makes sure it is there (measure.profiling.with_rank_info);
* rank{R}.steps.json      the wall time of every profiled step (CUDA events on GPU, perf_counter
                          on CPU);
* rank{R}.status.json     "running", then "done" or "error" with the message, so the launcher
                          can name the rank that failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
import traceback

from diagnostics.measure.profiling import with_rank_info, written_rank_info
from diagnostics.measure.timer import method as timer_method, time_once
from diagnostics.measure.training import Step, Trainee
from diagnostics.analyses.distributed.dist_job import DistJob, choose_backend, status_path, steps_path, trace_path

#: Exit code of a rank killed on purpose by the die_rank injection.
INJECTED_EXIT_CODE = 3


def _write_json(path, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _status(job: DistJob, rank: int, state: str, **extra) -> None:
    _write_json(status_path(job.out_dir, rank), {"rank": rank, "state": state, "time": time.time(), **extra})


def _ensure_distributed_info(path, rank: int, world_size: int, backend: str) -> None:
    """torch.profiler writes distributedInfo when a process group exists; fill it in if it did not."""
    with open(path, "rb") as f:
        data = f.read()
    new, _ = with_rank_info(data, written_rank_info(data), rank, world_size, backend)
    if new is not data:
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(new)
        os.replace(tmp, path)


def run(job: DistJob) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from diagnostics.intake import load_model
    from diagnostics.spec import ModelSpec

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    os.makedirs(job.out_dir, exist_ok=True)
    _status(job, rank, "running", pid=os.getpid())
    # auto: nccl when every process of this node gets its own GPU (the launcher usually resolved it).
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, _ = choose_backend(job.backend, local_world, gpus)
    on_gpu = backend == "nccl"
    device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, int(job.threads)))
    timeout = datetime.timedelta(seconds=float(job.pg_timeout_s))
    kwargs = {"device_id": device} if on_gpu else {}
    dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    try:
        spec = ModelSpec.from_dict({**job.spec, "device": str(device)})
        loaded = load_model(spec)
        model = loaded.model
        model.train()
        ddp = DDP(model, device_ids=[local_rank] if on_gpu else None)
        inputs = loaded.make_inputs(seed=spec.seed + rank)  # each rank its own shard of data
        # DDP all-reduces gradient buckets during the step's backward; SGD with momentum, as everywhere.
        train_step = Step(Trainee(ddp, loaded.loss_fn, inputs, loaded.loss_name), True, "sgd", job.lr)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        sleep_s = job.straggler_sleep_ms / 1000.0 if job.straggler_rank == rank else 0.0
        total = job.warmup + job.steps
        wall_ms: list[float] = []

        def step(i: int) -> None:
            if job.die_rank == rank and i == job.die_step:
                if job.die_how == "kill":  # like the OOM killer: no status, no cleanup, no word
                    os.kill(os.getpid(), signal.SIGKILL)
                _status(job, rank, "dying", step=i)
                sys.stdout.flush()
                os._exit(INJECTED_EXIT_CODE)  # a crash: no cleanup, no exception to catch
            if sleep_s:
                with record_function("injected_straggler_sleep"):
                    time.sleep(sleep_s)
            train_step(label=True)  # zero_grad, forward, backward, optimizer: each in its range

        trace_file = trace_path(job.out_dir, rank)
        sched = schedule(wait=0, warmup=min(job.warmup, 1), active=job.steps, repeat=1,
                         skip_first=max(0, job.warmup - 1))
        # record_shapes: the collectives' tensor sizes (message bytes) are in their args.
        with profile(activities=activities, schedule=sched, record_shapes=True,
                     on_trace_ready=lambda p: p.export_chrome_trace(str(trace_file))) as prof:
            for i in range(total):
                ms = time_once(lambda: step(i), device)
                if i >= job.warmup:
                    wall_ms.append(ms)
                prof.step()
        _ensure_distributed_info(trace_file, rank, world, backend)
        _write_json(steps_path(job.out_dir, rank), {
            "rank": rank, "world_size": world, "backend": backend, "device": str(device),
            "step_ms": wall_ms, "straggler_sleep_ms": sleep_s * 1000.0,
            "timing": timer_method(device),
        })
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diagnostics.analyses.distributed.rank_main",
                                     description="One profiled DDP rank (run it through torchrun)")
    parser.add_argument("--job", required=True, help="the DistJob as inline JSON or a JSON file path")
    args = parser.parse_args(argv)
    job = DistJob.from_arg(args.job)
    rank = int(os.environ.get("RANK", "-1"))
    if rank < 0 or "WORLD_SIZE" not in os.environ:
        print("rank_main must be started by torchrun (RANK and WORLD_SIZE are not set)", file=sys.stderr)
        return 2
    try:
        run(job)
    except BaseException as e:
        _status(job, rank, "error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=6))
        raise
    _status(job, rank, "done")
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
