"""Profile the model with torch.profiler: latency, operators, steps, modules, kernels, timeline, trace.

``analyze(ctx, options)`` first times the step *outside* the profiler (warmup, then N timed
iterations: CUDA events + synchronize on CUDA, perf_counter on CPU), then runs it under
``torch.profiler.profile`` with a wait/warmup/active schedule. Each step is labelled with
record_function ranges ("zero_grad", "forward", "backward", "optimizer") and, with
``with_modules``, each module's forward with a ``module::<qualified name>`` range (forward hooks,
removed afterwards), so the step and module views work on CPU and CUDA alike. The exported Chrome
trace is written to the run's artifact folder as trace.json / trace.json.gz (with
``distributedInfo`` rank 0 so HTA loads it) and as a TensorBoard-style folder zipped.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
import time
import zipfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from diagnostics.trace import load_trace, profiler_tables as pt
from diagnostics.trace.classify import MODULE_PREFIX, ROOT_MODULE, is_python_frame_name
from diagnostics.trace.model import Trace
from diagnostics.errors import TorchScopeError, explain
from diagnostics.measure.roofline import (ABOVE_ROOF_TOLERANCE, best_roofs, count_ops, counted_times, measure_roofs,
                                           merge_nesting, mfu, module_mfu, not_counted_rows, op_nesting,
                                           roofline_rows)
from diagnostics.measure.compare import METHOD, Rounds, too_few_rounds
from diagnostics.measure.profiling import with_rank_info
from diagnostics.measure.timer import latency_stats, method as timer_method, sync, time_calls, time_once
from diagnostics.measure.training import Step


def _is_python_frame(event) -> bool:
    """A with_stack frame among prof.events(): by its flag, or by name where torch has no flag (2.11)."""
    flag = getattr(event, "is_python_function", None)
    return bool(flag) if flag is not None else is_python_frame_name(event.name)


from diagnostics.analyses.profile import ANALYSIS, MAX_LATENCY_ITERS, MAX_PROFILED_STEPS, ProfileResult
from diagnostics.declare import OptionError
from diagnostics.results import build

TB_WORKER = "torchscope_rank0"

TRACE_JSON = "trace.json"
TRACE_GZ = "trace.json.gz"
TB_ZIP = "tb_trace.zip"


def resolve_options(options: dict, device: str = "cpu") -> dict:
    """The declared options (already valid one by one) checked together, and the activities resolved
    for ``device``; raises OptionError naming the problem."""
    o = dict(options)
    steps = (o["wait"] + o["warmup"] + o["active"]) * o["repeat"]
    if steps > MAX_PROFILED_STEPS:
        raise OptionError(f"the schedule runs {steps} steps ((wait + warmup + active) x repeat); "
                          f"keep it at most {MAX_PROFILED_STEPS}")
    if o["latency_iters"] + o["latency_warmup"] > MAX_LATENCY_ITERS:
        raise OptionError(f"latency warmup + iterations must be at most {MAX_LATENCY_ITERS}")
    acts = o["activities"]
    if not acts:
        acts = ["cpu", "cuda"] if device.startswith("cuda") else ["cpu"]
    if "cuda" in acts and not torch.cuda.is_available():
        raise OptionError("the CUDA activity was asked for but CUDA is not available here")
    o["activities"] = sorted(set(acts), key=("cpu", "cuda").index)
    return o


@contextmanager
def _mode(model, opts: dict):
    """eval + inference_mode for inference, train() + grad for training; model.training restored."""
    was_training = model.training
    try:
        if opts["mode"] == "train":
            model.train()
            with torch.enable_grad():
                yield
        else:
            model.eval()
            with torch.inference_mode():
                yield
    finally:
        model.train(was_training)


@contextmanager
def module_ranges(model):
    """Open a record_function range "module::<qualified name>" around every module's forward.

    Hooks are removed (and any range left open by a forward that raised is closed) on exit.
    TorchScript modules take no Python hooks and are skipped.
    """
    handles = []
    open_ranges: dict[int, list] = {}

    def pre(mod, _inputs, name):
        rf = record_function(MODULE_PREFIX + name)
        rf.__enter__()
        open_ranges.setdefault(id(mod), []).append(rf)

    def post(mod, _inputs, _output):
        stack = open_ranges.get(id(mod))
        if stack:
            stack.pop().__exit__(None, None, None)

    try:
        for name, mod in model.named_modules():
            if isinstance(mod, torch.jit.ScriptModule):
                continue
            handles.append(mod.register_forward_pre_hook(lambda m, i, n=name or ROOT_MODULE: pre(m, i, n)))
            handles.append(mod.register_forward_hook(post))
        yield
    finally:
        for h in handles:
            h.remove()
        for stack in open_ranges.values():
            while stack:
                try:
                    stack.pop().__exit__(None, None, None)
                except Exception:  # a range whose profiler already stopped: nothing to close
                    pass


def modules_missing(model, with_modules: bool, module_rows: list) -> str | None:
    """Why the profile has no per-module times, or None when it has them."""
    if not with_modules:
        return "per-module times need with_modules (module ranges); it was off"
    if module_rows:
        return None
    if isinstance(model, torch.jit.ScriptModule):
        return ("no per-module times: a TorchScript model is a compiled graph that takes no Python forward "
                "hooks, so its modules cannot be timed one by one (with_modules was on); operators and steps "
                "are measured. Profile the Python model or a torch.export archive for module times")
    return "no per-module times: with_modules was on but no module ran a forward inside the profiled steps"


def operator_rows(key_averages, by_shape: bool = False, skip: frozenset[str] = frozenset()) -> list[dict]:
    """key_averages as records (times in ms, memory in bytes); user ranges, [memory], the names in
    ``skip`` (Python frames recorded by with_stack) and device-side rows left out: on CUDA
    key_averages also lists every kernel, memcpy and memset as a row of its own, whose time is already
    the self device time of the operator that launched it (summed, the column counted kernels twice:
    4.2 ms of 'self device' over 2.1 ms of kernels in an H100 run). Kernels have their own table."""
    rows = []
    for e in key_averages:
        if e.is_user_annotation or e.key == "[memory]" or e.key.startswith(MODULE_PREFIX) or e.key in skip:
            continue
        if getattr(getattr(e, "device_type", None), "name", "CPU") != "CPU":
            continue
        row = {
            "name": e.key, "calls": int(e.count),
            "self_cpu_ms": e.self_cpu_time_total / 1e3, "cpu_total_ms": e.cpu_time_total / 1e3,
            "self_device_ms": e.self_device_time_total / 1e3, "device_total_ms": e.device_time_total / 1e3,
            "self_cpu_memory_bytes": int(e.self_cpu_memory_usage), "cpu_memory_bytes": int(e.cpu_memory_usage),
            "self_device_memory_bytes": int(e.self_device_memory_usage),
            "device_memory_bytes": int(e.device_memory_usage),
        }
        if by_shape:
            row["input_shapes"] = str(e.input_shapes)
        rows.append(row)
    return rows


def merge_operator_rows(tables: list[list[dict]]) -> list[dict]:
    """Sum the tables of several profiler cycles row by row (same name, same shapes)."""
    merged: dict[tuple, dict] = {}
    for table in tables:
        for r in table:
            key = (r["name"], r.get("input_shapes"))
            if key not in merged:
                merged[key] = dict(r)
            else:
                m = merged[key]
                for k, v in r.items():
                    if k not in ("name", "input_shapes"):
                        m[k] += v
    rows = list(merged.values())
    total_self = sum(r["self_cpu_ms"] for r in rows) or 1.0
    total_dev = sum(r["self_device_ms"] for r in rows) or 1.0
    for r in rows:
        r["self_cpu_pct"] = 100.0 * r["self_cpu_ms"] / total_self
        r["self_device_pct"] = 100.0 * r["self_device_ms"] / total_dev
        r["mean_cpu_ms"] = r["cpu_total_ms"] / r["calls"] if r["calls"] else 0.0
    rows.sort(key=lambda r: -(r["self_device_ms"] + r["self_cpu_ms"]))
    return rows


# ----------------------------------------------------------------------------- artifacts
def write_artifacts(traces: list[bytes], artifact_dir: Path) -> dict:
    """trace.json (last cycle), trace.json.gz, and tb_trace.zip with every cycle as the TB plugin names them."""
    artifact_dir = Path(artifact_dir)
    last = traces[-1]
    (artifact_dir / TRACE_JSON).write_bytes(last)
    with gzip.open(artifact_dir / TRACE_GZ, "wb", compresslevel=5) as f:
        f.write(last)
    stamp = time.time_ns() // 1_000_000
    with zipfile.ZipFile(artifact_dir / TB_ZIP, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=5) as z:
        for i, data in enumerate(traces):
            z.writestr(f"tb_trace/{TB_WORKER}.{stamp + i}.pt.trace.json", data)
    return {"trace_json": str(artifact_dir / TRACE_JSON), "trace_json_gz": str(artifact_dir / TRACE_GZ),
            "tb_zip": str(artifact_dir / TB_ZIP)}


# ----------------------------------------------------------------------------- roofline
def _roofline(model, step, opts: dict, device, nesting: dict, steps: int, latency_ms: float,
              cuda_ran: bool, module_rows: list[dict]) -> dict:
    """Roofs measured here, each op's FLOPs and bytes counted over one step, and its time per profiled
    step inclusive of the ops it runs (the counters see the op the model calls, its children do the work);
    MFU of the step and of each module row (set on ``module_rows``)."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    roofs = measure_roofs(device, dtype)
    with _mode(model, opts):
        ops, count = count_ops(step, type(model).__name__)
    times = counted_times(nesting, frozenset(ops) | frozenset(count.not_counted), steps, device=cuda_ran)
    missing = not_counted_rows(count, times)

    def place(roofs: dict) -> tuple[list[dict], list[str]]:
        rows = roofline_rows(ops, times, roofs)
        if module_rows:  # MFU per module: its FLOPs over its forward + backward time per step
            module_mfu(module_rows, count.by_module, steps, roofs["peak_flops"], ROOT_MODULE,
                       count.not_counted_by_module)
        above = [f"{r['op']} ({r['pct_of_roof']:.0f} % of its roof)" for r in rows if r["above_roof"]]
        above += [f"module {r['name']} (MFU {r['mfu']:.2f})" for r in module_rows
                  if (r.get("mfu") or 0) > ABOVE_ROOF_TOLERANCE]
        model_mfu = mfu(count.total, latency_ms, roofs["peak_flops"])
        if (model_mfu or 0) > 1:
            above.append(f"the model (MFU {model_mfu:.2f})")
        return rows, above

    rows, above = place(roofs)
    if above:  # faster than the machine's ceiling: the ceiling was measured in a busy moment; once more
        roofs = best_roofs(roofs, measure_roofs(device, dtype))
        rows, above = place(roofs)
    for r in rows:  # an op whose FLOPs were not counted is placed by its bytes only: say so on its row
        r["flops_not_counted"] = r["op"] in count.not_counted
    # A model whose every op with arithmetic went uncounted has no FLOP figure, not 0.
    model_flops = None if not count.total and missing else count.total
    return {"roofs": roofs, "rows": rows, "model_flops": model_flops, "module_flops": count.by_module,
            "not_counted": missing, "module_not_counted": count.not_counted_by_module,
            "mfu": mfu(model_flops, latency_ms, roofs["peak_flops"]), "above": above}


def _not_counted_note(rows: list[dict]) -> str | None:
    """The ops the FLOP count left out, with their share of the measured op time."""
    if not rows:
        return None
    parts = []
    for r in rows:
        share = "time not measured" if r["pct_of_time"] is None else f"{r['pct_of_time']:.1f}% of measured op time"
        where = ", ".join(m or ROOT_MODULE for m in r["modules"][:4]) + (" ..." if len(r["modules"]) > 4 else "")
        parts.append(f"{r['op']} ({r['calls']} calls per step, {share}; in {where})")
    return ("FLOPs not counted for " + "; ".join(parts) + ": torch's FlopCounterMode has no formula for them, so "
            "model FLOPs and MFU leave them out (lower bounds)")


# ----------------------------------------------------------------------------- the profiler's own cost
def profiler_overhead(model, step, opts: dict, device, activities: list, rounds: int) -> dict | None:
    """What the profiler costs a step: an unprofiled step and a profiled one (the same activities,
    shapes, memory, stacks and module ranges), timed in the same interleaved rounds (measure.compare:
    a fresh random order per round, so neither always runs first), each profiled step in a profiler
    session of its own whose start-up (one untimed step) and trace processing are outside the timing.
    Returns the overhead in percent (the geometric mean of the rounds' ratios, minus 1) with its 95%
    interval, or None with no rounds."""
    if rounds < 1:
        return None

    def unprofiled() -> float:
        return time_once(step, device)

    def profiled() -> float:
        hooks = module_ranges(model) if opts["with_modules"] else nullcontext()
        with hooks, profile(activities=activities, record_shapes=opts["record_shapes"],
                            profile_memory=opts["profile_memory"], with_stack=opts["with_stack"],
                            with_modules=opts["with_modules"]):
            step(label=True)  # the session's first step carries its start-up: untimed
            sync(device)
            return time_once(lambda: step(label=True), device)

    with _mode(model, opts):
        r = Rounds({"unprofiled": unprofiled, "profiled": profiled})
        for _ in range(rounds):
            r.run()
    summary = r.summary()
    s = summary["profiled"]
    ci = s["speedup_ci"]  # unprofiled / profiled per round: the overhead is its inverse, minus 1
    pct = lambda ratio: 100.0 * (1.0 / ratio - 1.0)  # noqa: E731
    return {"pct": pct(s["speedup"]), "ci": None if ci is None else [pct(ci[1]), pct(ci[0])], "rounds": s["rounds"],
            "note": too_few_rounds(s["rounds"]), "profiled_round_ms": s["round_ms"],
            "unprofiled_round_ms": summary["unprofiled"]["round_ms"]}


# ----------------------------------------------------------------------------- the job
def analyze(ctx, options: dict) -> ProfileResult:
    options = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    loaded = ctx.loaded
    spec, device, model, batch = loaded.spec, loaded.device, loaded.model, loaded.batch_size
    opts = resolve_options(options, spec.device)
    step = Step(loaded, opts["mode"] == "train", opts["optimizer"], opts["lr"])
    notes: list[str] = []

    latency = _latency(ctx, model, step, device, opts, batch)  # 1) outside the profiler, no labels or hooks
    run = _profile_cycles(ctx, model, step, device, opts)  # 2) the profiled steps
    # 3) views from the traces, each cycle's loaded once through the trace layer
    ctx.progress(0.82, "building views")
    traces, cycle_traces = _load_cycles(run)
    module_types = {(n or ROOT_MODULE): type(m).__name__ for n, m in model.named_modules()}
    steps, split, module_rows = [], [], []
    for c, trace in enumerate(traces):
        steps += [{"cycle": c, **r} for r in pt.step_breakdown(trace)]
        split += [{"cycle": c, **r} for r in pt.device_split(trace)]
    if opts["with_modules"]:
        module_rows = pt.module_times(traces, module_types)
    kernels_ev = pt.kernel_table(traces)
    operators = merge_operator_rows(run.ops)
    by_shape = merge_operator_rows(run.ops_by_shape) if opts["record_shapes"] else None

    ctx.progress(0.88, "writing trace files")
    artifacts = write_artifacts(cycle_traces, ctx.artifact_dir)
    timeline = pt.timeline(traces[-1], opts["timeline_max_events"],
                           artifacts["trace_json"] if opts["record_shapes"] else None)

    roof, roof_unavailable = _optional_roofline(ctx, model, step, opts, device, run, len(steps), latency,
                                                module_rows, notes)
    ctx.progress(0.95, f"the profiler's own cost: {opts['overhead_rounds']} interleaved rounds")
    overhead = profiler_overhead(model, step, opts, device, run.activities, opts["overhead_rounds"])
    modules_note = modules_missing(model, opts["with_modules"], module_rows)
    notes += _notes(opts, overhead, modules_note)
    metrics = _metrics(latency, steps, overhead, operators, kernels_ev, run, roof, batch)
    ctx.progress(1.0, "done")
    return build(ProfileResult, {
        "model": spec.label, "device": spec.device, "batch_size": batch, "mode": opts["mode"],
        "config": opts, "cuda_ran": "cuda" in opts["activities"],
        "inputs": [{"shape": list(s.shape), "dtype": s.dtype, **({"name": s.name} if s.name else {})}
                   for s in loaded.input_specs],
        "loss": loaded.loss_name if opts["mode"] == "train" else None,
        "metrics": metrics, "latency": latency, "timing_cv": latency["cv"], "steps": steps, "device_split": split,
        "profiler_overhead": overhead,
        "operators": operators, "operators_by_shape": by_shape, "modules": module_rows, "modules_note": modules_note,
        "kernels": kernels_ev, "timeline": timeline,
        "roofline": roof["rows"] if roof else [], "roofs": roof["roofs"] if roof else None, "artifacts": artifacts, "notes": notes,
        "flops_not_counted": roof["not_counted"] if roof else [],
        **({"roofline_unavailable": roof_unavailable} if roof_unavailable else {}),
        "torch_version": str(torch.__version__),
    })


def _latency(ctx, model, step, device, opts: dict, batch: int) -> dict:
    """The step timed outside the profiler, without any labels or hooks: its statistics and samples."""
    ctx.progress(0.02, "latency: warmup")
    with _mode(model, opts):
        samples = time_calls(step, device, opts["latency_iters"], opts["latency_warmup"],
                             lambda f, m: ctx.progress(0.02 + 0.3 * f, "latency: " + m))
    latency = latency_stats(samples, batch)
    latency["samples_ms"] = samples
    latency["method"] = timer_method(device)
    latency["warmup"] = opts["latency_warmup"]
    return latency


@dataclass
class _Cycles:
    """What the profiled steps left: each cycle's exported trace file (in ``folder``, until loaded), its
    operator rows (by name, and by input shape with record_shapes), its op nesting (for the roofline)."""

    folder: Path
    activities: list
    files: list[Path] = field(default_factory=list)
    ops: list[list[dict]] = field(default_factory=list)
    ops_by_shape: list[list[dict]] = field(default_factory=list)
    nesting: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    peak_bytes: int | None = None

    def on_ready(self, prof, opts: dict) -> None:
        """A cycle ended: its trace exported and its operator tables read (outside the profiled steps)."""
        path = self.folder / f"cycle{len(self.files)}.json"
        prof.export_chrome_trace(str(path))
        self.files.append(path)
        if opts["roofline"]:  # which op ran inside which: the roofline times each counted op inclusively
            self.nesting.append(op_nesting(prof.events()))
        # with_stack records Python frames as events too; they are call stacks, not operators.
        frames = frozenset(e.name for e in prof.events() if _is_python_frame(e)) if opts["with_stack"] else frozenset()
        if opts["record_shapes"]:
            # One grouping pass: the per-name table is the per-shape one summed by name
            # (merge_operator_rows), the same numbers key_averages() gives, without a second pass.
            shaped = operator_rows(prof.key_averages(group_by_input_shape=True), by_shape=True, skip=frames)
            self.ops_by_shape.append(shaped)
            self.ops.append([{k: v for k, v in r.items() if k != "input_shapes"} for r in shaped])
        else:
            self.ops.append(operator_rows(prof.key_averages(), skip=frames))


def _profile_cycles(ctx, model, step, device, opts: dict) -> _Cycles:
    """The step under torch.profiler on its wait/warmup/active schedule, labelled (and each module's
    forward a range with with_modules); the device's peak memory over them."""
    activities = [ProfilerActivity.CPU] if "cpu" in opts["activities"] else []
    if "cuda" in opts["activities"]:
        activities.append(ProfilerActivity.CUDA)
    run = _Cycles(Path(tempfile.mkdtemp(prefix="profile-", dir=ctx.artifact_dir)), activities)
    cycle_len = opts["wait"] + opts["warmup"] + opts["active"]
    n_steps = cycle_len * opts["repeat"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sched = schedule(wait=opts["wait"], warmup=opts["warmup"], active=opts["active"], repeat=opts["repeat"])
    modules_ctx = module_ranges(model) if opts["with_modules"] else nullcontext()
    t_prof = time.perf_counter()
    with _mode(model, opts), modules_ctx:
        with profile(activities=activities, schedule=sched, on_trace_ready=lambda p: run.on_ready(p, opts),
                     record_shapes=opts["record_shapes"], profile_memory=opts["profile_memory"],
                     with_stack=opts["with_stack"], with_modules=opts["with_modules"]) as prof:
            for i in range(n_steps):
                phase_i = i % cycle_len
                phase = ("wait" if phase_i < opts["wait"] else
                         "warmup" if phase_i < opts["wait"] + opts["warmup"] else "active")
                ctx.progress(0.35 + 0.45 * i / n_steps, f"profiling step {i + 1}/{n_steps} ({phase})")
                step(label=True)
                prof.step()
        sync(device)
    run.wall_s = time.perf_counter() - t_prof
    run.peak_bytes = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    if not run.files:
        shutil.rmtree(run.folder, ignore_errors=True)
        raise TorchScopeError("the profiler produced no trace (no active step completed)")
    return run


def _load_cycles(run: _Cycles) -> tuple[list[Trace], list[bytes]]:
    """Each cycle's trace loaded through the trace layer, and its bytes with a rank (for the files
    written); the exported files removed."""
    traces: list[Trace] = []
    cycle_traces: list[bytes] = []
    try:
        for path in run.files:
            traces.append(load_trace(path))
            data, traces[-1].meta["distributedInfo"] = with_rank_info(path.read_bytes(),
                                                                      traces[-1].meta.get("distributedInfo"))
            cycle_traces.append(data)
    finally:
        shutil.rmtree(run.folder, ignore_errors=True)
    return traces, cycle_traces


def _optional_roofline(ctx, model, step, opts: dict, device, run: _Cycles, n_steps: int, latency: dict,
                       module_rows: list, notes: list[str]):
    """(the roofline or None, why it is not available or None), its notes added to ``notes``: an optional
    part, whose failure is reported while the profile stands."""
    roof = roof_unavailable = None
    if opts["roofline"]:
        ctx.progress(0.9, "roofline: this machine's roofs, FLOPs and bytes per operator")
        try:
            roof = _roofline(model, step, opts, device, merge_nesting(run.nesting), max(1, n_steps),
                             latency["median_ms"], cuda_ran="cuda" in opts["activities"], module_rows=module_rows)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:
            roof_unavailable = explain(e.__cause__ or e)  # the model ran: the cause is the counting
            notes.append(f"roofline not available: {roof_unavailable}")
    if roof:
        notes.append("roofline: " + roof["roofs"]["method"] + "; FLOPs from torch's FlopCounterMode (matmuls, "
                     "convolutions, attention; elementwise ops count 0 FLOPs and are placed by their bytes), bytes "
                     "from every op's tensor inputs and outputs; time is each counted op's time per profiled step "
                     "including the ops it runs (aten::convolution's work is in aten::mkldnn_convolution), over its "
                     "outermost calls")
    if roof and roof["above"]:
        notes.append("measured faster than this machine's roofs, even after measuring the roofs again: "
                     + "; ".join(roof["above"][:5]) + ("; ..." if len(roof["above"]) > 5 else "")
                     + ". The roofs are the fastest calls seen while measuring them; on a busy machine every one "
                     "of them can be slowed (see the disturbance report), and the percentages of the roof and the "
                     "MFU are then too high")
    if roof and roof["not_counted"]:
        notes.append(_not_counted_note(roof["not_counted"]))
    return roof, roof_unavailable


def _notes(opts: dict, overhead: dict | None, modules_note: str | None) -> list[str]:
    """What the reader should know about how the profile was taken: the profiler's overhead, its cycles
    and warm-up, modules without a range, the training steps."""
    notes = []
    if overhead is None:
        notes.append("the profiler's overhead was not measured (overhead_rounds 0)")
    else:
        notes.append(f"profiler overhead: a profiled step against an unprofiled one, {overhead['rounds']} {METHOD}; "
                     "each profiled step in its own session, the session's start-up step and its trace processing "
                     "untimed")
        if overhead["note"]:
            notes.append("profiler overhead: " + overhead["note"])
    if opts["repeat"] > 1:
        notes.append(f"{opts['repeat']} profiler cycles: tables sum all cycles; trace.json holds the last one, "
                     "tb_trace.zip every cycle")
    if opts["warmup"] == 0:
        notes.append("no profiler warmup: the first recorded step includes the profiler's start-up cost")
    if modules_note:
        notes.append(modules_note)
    if opts["mode"] == "train":
        notes.append(f"training steps ran {opts['optimizer'].upper()} (lr {opts['lr']:g}) on the loaded copy "
                     "of the model; the weights changed in the worker only")
    return notes


def _metrics(latency: dict, steps: list[dict], overhead: dict | None, operators: list[dict], kernels: list[dict],
             run: _Cycles, roof: dict | None, batch: int) -> dict:
    """The profile's headline figures."""
    step_ms = [s["step_ms"] for s in steps]
    return {
        "latency_median_ms": latency["median_ms"], "latency_p90_ms": latency["p90_ms"],
        "latency_p99_ms": latency["p99_ms"], "latency_std_ms": latency["std_ms"],
        "throughput_samples_per_s": latency["samples_per_s"],
        "profiled_steps": len(steps),
        "step_time_mean_ms": float(np.mean(step_ms)) if step_ms else None,
        # the profiler's own cost, measured interleaved (profiler_overhead) with its interval
        "profiler_overhead_pct": overhead["pct"] if overhead else None,
        "profiler_overhead_ci_low": (overhead["ci"] or [None, None])[0] if overhead else None,
        "profiler_overhead_ci_high": (overhead["ci"] or [None, None])[1] if overhead else None,
        "self_cpu_total_ms": sum(r["self_cpu_ms"] for r in operators),
        "self_device_total_ms": sum(r["self_device_ms"] for r in operators),
        "kernel_time_ms": sum(k["total_us"] for k in kernels) / 1e3,
        "tensor_core_kernel_pct": pt.tensor_core_pct(kernels),
        "peak_device_memory_bytes": run.peak_bytes,
        "mfu": roof["mfu"] if roof else None,
        "model_flops_per_step": roof["model_flops"] if roof else None,
        "peak_flops": roof["roofs"]["peak_flops"] if roof else None,
        "bandwidth_bytes_per_s": roof["roofs"]["bandwidth_bytes_per_s"] if roof else None,
        "roofline_headroom_ms": sum(r["headroom_ms"] for r in roof["rows"]) if roof else None,
        "profile_wall_s": run.wall_s,
        "batch_size": batch,
    }
