"""Memory: peak of one inference pass and of one training step, what holds it, per layer, over time.

Peaks come from ``torch.cuda.max_memory_allocated`` on CUDA and from the profiler's memory events
on the CPU (see ``diagnostics.measure.memory``); each figure carries a ``source``. The breakdown at the peak
comes from the profiler's memory timeline (categories at the instant of the peak), next to an
accounting of resident sizes (parameters, gradients, optimizer state, saved activations, inputs;
temporaries = peak minus the rest). The estimate before running adds parameters, gradients,
optimizer state, inputs and saved activations measured at two small batches and scaled linearly
to the batch, and is compared with the measured peak. On CUDA a memory snapshot for
pytorch.org/memory_viz is written to the run's artifacts.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import psutil
import torch

from diagnostics.analyses.memory import (ANALYSIS, BreakdownAtPeak, Estimate, EstimateRow, MemoryLayer, MemoryMetrics,
                                        MemoryResult, MemoryTimeline, Parts, Peak, Rss, Snapshot)
from diagnostics.measure.checkpoint import checkpointing, select_blocks
from diagnostics.measure.memory import (CATEGORIES, ROOT, category_timeline, is_cuda, measure_peak,
                                                 measure_saved, phase_ranges)
from diagnostics.measure.optimizers import STATE_PER_PARAM
from diagnostics.measure.state import restored_state
from diagnostics.tensors import (buffer_bytes, grad_bytes, optimizer_state_bytes, param_bytes, tensor_bytes,
                                         trainable_bytes)
from diagnostics.measure.training import BACKWARD, FORWARD, OPTIMIZER, Step
from diagnostics.errors import ModelRunError, TorchScopeError

#: Batches the estimate measures saved activations at (then a straight line through them).
ESTIMATE_BATCHES = (2, 4)
SNAPSHOT_FILE = "memory_snapshot.pickle"
SNAPSHOT_MAX_ENTRIES = 100_000
#: The step's phase ranges the memory timeline is split by (measure.training.Step's names).
PHASES = (FORWARD, BACKWARD, OPTIMIZER)



def _rss() -> int:
    return psutil.Process().memory_info().rss


def estimate(loaded, opt_name: str, batch: int) -> dict:
    """Parameters + gradients + optimizer state + inputs + saved activations scaled from small batches."""
    model = loaded.model
    points = []
    try:
        for b in ESTIMATE_BATCHES:
            inputs = loaded.make_inputs(b)
            points.append((b, measure_saved(loaded, inputs).saved_total, tensor_bytes(inputs)))
    except ModelRunError:
        # The model takes no other batch size (a .pt2 exported for fixed shapes, say): measure the
        # saved activations once, at the batch it has.
        points = []
    if points:
        (b1, s1, i1), (b2, s2, i2) = points
        slope = (s2 - s1) / (b2 - b1)
        saved = max(0, round(s1 + slope * (batch - b1)))
        inputs_b = max(0, round(i1 + (i2 - i1) / (b2 - b1) * (batch - b1)))
        how = f"measured at batch {b1} and {b2} and extended linearly to batch {batch}"
    else:
        b1 = b2 = batch
        s1 = s2 = saved = measure_saved(loaded, loaded.inputs).saved_total
        i1 = inputs_b = tensor_bytes(loaded.inputs)
        slope = saved / max(1, batch)
        how = f"measured at batch {batch} itself (the model accepts no smaller batch)"
    p, t = param_bytes(model) + buffer_bytes(model), trainable_bytes(model)
    parts = {"parameters": p, "gradients": t, "optimizer state": STATE_PER_PARAM[opt_name] * t,
             "activations": saved, "inputs": inputs_b}
    return {"parts": parts, "total_bytes": sum(parts.values()),
            "static_bytes": p + t + STATE_PER_PARAM[opt_name] * t,
            "saved_per_sample_bytes": slope, "batches_measured": tuple(sorted({b1, b2})),
            "saved_at_measured_batches": (s1, s2) if b1 != b2 else (s1,),
            "method": (f"parameters and buffers + gradients (trainable parameters) + {opt_name} state "
                       f"({STATE_PER_PARAM[opt_name]} × trainable) + inputs + activations saved for backward "
                       f"{how}")}


def _breakdown_at_peak(timeline: dict, measured_peak: int) -> dict:
    """Categories at the instant the profiler's timeline total is highest, plus what it missed."""
    series = timeline["series"]
    n = len(timeline["times_us"])
    totals = [sum(series[c][i] for c in CATEGORIES) for i in range(n)]
    i = max(range(n), key=totals.__getitem__)
    parts = {c: series[c][i] for c in CATEGORIES}
    parts["unattributed"] += max(0, measured_peak - totals[i])
    return {"parts": parts, "at_us": timeline["times_us"][i] - timeline["times_us"][0],
            "timeline_peak_bytes": totals[i],
            "source": "torch.profiler memory timeline: tensors by category at the instant of its peak; "
                      "'unattributed' also holds what the measured peak has beyond the timeline's"}


def _snapshot(loaded, step: Step, artifact_dir) -> dict:
    """Record the CUDA allocator's history over one training step; dump it for memory_viz."""
    path = artifact_dir / SNAPSHOT_FILE
    torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES)
    try:
        step.zero_grad()
        step(label=True)
        torch.cuda.synchronize(loaded.device)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    return {"path": str(path), "file": SNAPSHOT_FILE, "bytes": path.stat().st_size,
            "note": "open it at https://pytorch.org/memory_viz (drag the file onto the page)"}


def _counted_only(loaded, o: dict) -> MemoryResult:
    """A model on the meta device (too big to build here): the memory a training step needs for
    weights, gradients and optimizer state, counted from the parameters; the peaks, activations and
    inputs were not measured and are None, not 0."""
    model = loaded.model
    p_bytes, b_bytes, t_bytes = param_bytes(model), buffer_bytes(model), trainable_bytes(model)
    s_bytes = STATE_PER_PARAM[o["optimizer"]] * t_bytes
    static = p_bytes + b_bytes + t_bytes + s_bytes
    parts = {"parameters": p_bytes + b_bytes, "gradients": t_bytes, "optimizer state": s_bytes}
    not_measured = dict.fromkeys(("peak_train_bytes", "peak_inference_bytes", "reserved_train_bytes",
                                  "saved_activation_bytes", "input_bytes", "estimate_bytes", "estimate_error_pct",
                                  "workspace_bytes", "rss_bytes"))
    metrics = MemoryMetrics(param_bytes=p_bytes, buffer_bytes=b_bytes, grad_bytes=t_bytes, optimizer_state_bytes=s_bytes,
                            static_train_bytes=static, batch_size=loaded.batch_size, **not_measured)
    return MemoryResult(
        model=loaded.spec.label, device=str(loaded.device), options=dict(o), batch_size=loaded.batch_size, meta=True,
        metrics=metrics,
        accounting=Parts(parts=parts,
                         source=f"counted from the parameters of a model on the meta device: weights and buffers as "
                                f"stored, gradients = trainable parameters, {o['optimizer']} state = "
                                f"{STATE_PER_PARAM[o['optimizer']]} x trainable"),
        notes=(f"this model was {loaded.meta}: weights, gradients and {o['optimizer']} state are counted "
               f"({static:,} bytes in all); activations, inputs, temporaries and peaks were not measured "
               "(shown as n/a), so the real training peak is higher",),
    )


def _checkpointed(model, o: dict, notes: list[str]) -> list[str]:
    """The modules the options ask to checkpoint in the training step (a note says so)."""
    checkpointed = select_blocks(model, o["checkpoint_modules"]) if o["checkpoint_modules"].strip() else []
    if checkpointed:
        notes.append("training step measured with activation checkpointing of " + ", ".join(checkpointed)
                     + " (their forward recomputed in backward); inference and the per-layer activations without")
    return checkpointed


def _inference_peak(loaded, resident: int):
    """The peak of one inference pass: eval mode, no autograd, after a warm-up pass."""
    loaded.model.eval()
    with torch.no_grad():
        loaded.forward()  # warm-up: lazy initialisation, allocator caches
        inference = measure_peak(lambda: loaded.forward(), loaded.device, resident)
    loaded.model.train()
    return inference


def _train_peak(loaded, step: Step, checkpointed: list[str], resident: int, o: dict):
    """One warm-up step (optimizer state exists afterwards), then the measured step's peak.
    Returns (the measurement, gradient bytes, optimizer state bytes, the baseline it was measured from)."""
    model = loaded.model
    with checkpointing(model, checkpointed):  # the modules asked for recompute their forward in backward
        step.zero_grad()
        step(label=True)
        g_bytes, s_bytes = grad_bytes(model), optimizer_state_bytes(step.optimizer)
        step.zero_grad()  # the measured step starts as a training loop's does: no grads
        baseline = resident + s_bytes
        train = measure_peak(lambda: step(label=True), loaded.device, baseline,
                             profile=o["timeline"], timeline=o["timeline"])
    return train, g_bytes, s_bytes, baseline


def _profiled_timeline(train, device) -> tuple[dict | None, dict, str | None]:
    """The profiler's memory timeline of the measured step in ms, the step's phases on it, and why it
    failed (None when it did not); (None, {}, None) when the step was not profiled."""
    timeline, phases = None, {}
    if train.prof is None:
        return None, phases, None
    try:
        timeline = category_timeline(train.prof, str(device))
        t0 = timeline["times_us"][0] if timeline["times_us"] else 0
        timeline["times_ms"] = tuple((t - t0) / 1e3 for t in timeline.pop("times_us"))
        timeline["source"] = ("torch.profiler memory timeline (profile_memory, record_shapes, with_stack): "
                              "every tensor's lifetime, categorised by the profiler")
        for name, (a, b) in phase_ranges(train.prof, PHASES).items():
            phases[name] = [(a / 1e3 - t0) / 1e3, (b / 1e3 - t0) / 1e3]
    except Exception as e:  # a private profiler API: keep the rest of the page (and what it gave)
        return timeline, phases, f"the profiler's memory timeline failed ({type(e).__name__}: {e}); phase samples shown"
    return timeline, phases, None


def _snapshot_or_note(ctx, loaded, step: Step, notes: list[str]) -> dict | None:
    """The CUDA allocator's snapshot of one step (None on the CPU or when it failed, a note saying so)."""
    if not is_cuda(loaded.device):
        notes.append("CUDA memory snapshot: skipped (CPU device); run on a CUDA device to get a file for "
                     "pytorch.org/memory_viz")
        return None
    ctx.progress(0.85, "CUDA memory snapshot")
    try:
        return _snapshot(loaded, step, ctx.artifact_dir)
    except Exception as e:
        notes.append(f"CUDA memory snapshot failed: {type(e).__name__}: {e}")
        return None


def _phase_samples(static: int, g_bytes: int, s_bytes: int, saved: int, in_bytes: int) -> dict:
    """Phase samples from accounting (no profiler timeline): what is alive at each boundary."""
    return {
        "phases_only": True,
        "labels": ("start", "after forward", "after backward", "after optimizer step"),
        "series": {
            "parameters": [static] * 4,
            "gradients": [g_bytes, 0, g_bytes, g_bytes],
            "optimizer state": [s_bytes] * 4,
            "activations": [0, saved, 0, 0],
            "inputs": [in_bytes] * 4,
        },
        "source": "accounting at phase boundaries (sizes of live tensors), not a measurement over time",
    }


def _layer_rows(model, tracker) -> list[MemoryLayer]:
    """Per layer, in call order: output bytes (leaves) and bytes saved for backward."""
    layers = []
    order = {n: i for i, n in enumerate(tracker.calls)}
    types = {(n or ROOT): type(m).__name__ for n, m in model.named_modules()}
    leaves = {(n or ROOT) for n, m in model.named_modules() if not list(m.children())}
    for name in sorted(set(tracker.saved) | (set(tracker.outputs) & leaves), key=lambda n: order.get(n, 1e9)):
        layers.append(MemoryLayer(layer=name, type=types.get(name, "?"), is_leaf=name in leaves,
                                  output_bytes=tracker.outputs.get(name, 0) if name in leaves else 0,
                                  saved_bytes=tracker.saved.get(name, 0)))
    return layers


def _estimate_rows(est: dict, peak: int, workspace: int) -> tuple[list[EstimateRow], int]:
    """The estimate's steps against the measured peak, and its total (with the measured CUDA workspaces)."""
    def estimate_row(name: str, nbytes: int) -> EstimateRow:
        return EstimateRow(name=name, bytes=nbytes, error_pct=100.0 * (nbytes - peak) / peak if peak else None)

    est_total = est["total_bytes"]
    estimates = [estimate_row("params + grads + optimizer (no activations)", est["static_bytes"]),
                 estimate_row("+ inputs + saved activations (scaled)", est_total)]
    if workspace:
        est_total += workspace
        estimates.append(estimate_row("+ CUDA workspaces (measured before the step)", est_total))
    return estimates, est_total


@dataclass
class _Measured:
    """What one memory run measured, before it is assembled into its result."""

    p_bytes: int
    b_bytes: int
    in_bytes: int
    rss_start: int
    inference: object = None
    est: dict = field(default_factory=dict)
    tracker: object = None
    train: object = None
    g_bytes: int = 0
    s_bytes: int = 0
    baseline: int = 0
    rss_end: int = 0
    timeline: dict | None = None
    phases: dict = field(default_factory=dict)
    timeline_error: str | None = None
    snapshot: dict | None = None


def _measure(ctx, loaded, o: dict, checkpointed: list[str], notes: list[str]) -> _Measured:
    """Inference peak, the estimate, saved activations per layer, the training step's peak, its timeline
    and (CUDA) snapshot, all on the user's model put back as it was afterwards."""
    model = loaded.model
    rss_start = _rss()
    m = _Measured(param_bytes(model), buffer_bytes(model), tensor_bytes(loaded.inputs), rss_start)
    resident = m.p_bytes + m.b_bytes + m.in_bytes
    with restored_state(model):
        ctx.progress(0.05, "inference pass")
        m.inference = _inference_peak(loaded, resident)
        # -- estimate before running the step at full batch
        ctx.progress(0.2, "estimate from small batches")
        m.est = estimate(loaded, o["optimizer"], loaded.batch_size)
        ctx.progress(0.35, "activations saved for backward, per layer")
        m.tracker = measure_saved(loaded, loaded.inputs)
        ctx.progress(0.5, "training step")
        # Forward, backward, optimizer step in the step's named ranges; the gradients are set to None
        # outside the measured step (zero_grad=False): the CPU profiler cannot size frees of blocks
        # allocated before it started.
        step = Step(loaded, True, o["optimizer"], o["lr"], loaded.inputs, zero_grad=False)
        m.train, m.g_bytes, m.s_bytes, m.baseline = _train_peak(loaded, step, checkpointed, resident, o)
        m.rss_end = _rss()
        ctx.progress(0.75, "memory timeline")
        m.timeline, m.phases, m.timeline_error = _profiled_timeline(m.train, loaded.device)
        m.train.prof = None
        m.snapshot = _snapshot_or_note(ctx, loaded, step, notes)
        del step
    return m


def _accounting(m: _Measured, device, notes: list[str]) -> tuple[dict, int]:
    """Resident sizes at the peak (temporaries: the peak minus the rest), and the CUDA workspaces."""
    peak = m.train.peak_bytes
    accounting = {"parameters": m.p_bytes + m.b_bytes, "gradients": m.g_bytes, "optimizer state": m.s_bytes,
                  "activations": m.tracker.saved_total, "inputs": m.in_bytes}
    # On CUDA, what was allocated when the measured step began beyond parameters, buffers, inputs and
    # optimizer state: mostly cuBLAS / cuDNN workspaces, which torch's caching allocator holds for the
    # life of each handle (one per thread: the forward's and autograd's backward thread). Measured,
    # not guessed; on a small model on an H100 they were most of the peak (108 MiB with 21 MiB of tensors).
    workspace = max(0, int(m.train.baseline_bytes) - m.baseline) if is_cuda(device) else 0
    if workspace:
        accounting["workspaces"] = workspace
    rest = sum(accounting.values())
    accounting["temporaries"] = max(0, peak - rest)
    if rest > peak:
        notes.append(f"the resident sizes add up to {rest - peak:,} bytes more than the measured peak: "
                     "saved activations are freed during backward while gradients are allocated, so they are "
                     "never all alive at once")
    return accounting, workspace


def _timeline_and_peak(m: _Measured, notes: list[str]) -> tuple[dict, BreakdownAtPeak | None]:
    """The timeline to show (the profiler's, else phase samples) and the breakdown at its peak (None without)."""
    timeline = m.timeline
    if timeline is not None and timeline["times_ms"]:
        at_peak = _breakdown_at_peak({"times_us": [t * 1e3 for t in timeline["times_ms"]],
                                      "series": timeline["series"]}, m.train.peak_bytes)
        at_peak["at_ms"] = at_peak.pop("at_us") / 1e3
        return timeline, BreakdownAtPeak(**at_peak)
    if m.timeline_error:
        notes.append(m.timeline_error)
    return _phase_samples(m.p_bytes + m.b_bytes, m.g_bytes, m.s_bytes, m.tracker.saved_total, m.in_bytes), None


def analyze(ctx, options: dict) -> MemoryResult:
    o = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    loaded = ctx.loaded
    model, device, batch = loaded.model, loaded.device, loaded.batch_size
    notes: list[str] = []
    if not any(p.requires_grad for p in model.parameters()):
        raise TorchScopeError("the model has no trainable parameters: a training step has nothing to train")
    if loaded.meta:
        return _counted_only(loaded, o)
    checkpointed = _checkpointed(model, o, notes)
    m = _measure(ctx, loaded, o, checkpointed, notes)
    peak = m.train.peak_bytes
    accounting, workspace = _accounting(m, device, notes)
    timeline, at_peak = _timeline_and_peak(m, notes)
    estimates, est_total = _estimate_rows(m.est, peak, workspace)
    metrics = MemoryMetrics(
        peak_train_bytes=int(peak),
        peak_inference_bytes=int(m.inference.peak_bytes),
        reserved_train_bytes=m.train.reserved_bytes,
        param_bytes=m.p_bytes,
        buffer_bytes=m.b_bytes,
        grad_bytes=m.g_bytes,
        optimizer_state_bytes=m.s_bytes,
        saved_activation_bytes=m.tracker.saved_total,
        input_bytes=m.in_bytes,
        estimate_bytes=est_total,
        estimate_error_pct=estimates[-1].error_pct,
        workspace_bytes=workspace,
        rss_bytes=m.rss_end,
        batch_size=batch,
    )
    ctx.progress(1.0, "done")
    return MemoryResult(
        model=loaded.spec.label, device=str(device), options=dict(o), batch_size=batch, metrics=metrics,
        inference=Peak(**m.inference.to_dict()), train=Peak(**m.train.to_dict()),
        rss=Rss(start_bytes=m.rss_start, end_bytes=m.rss_end,
                source="psutil: this worker process's resident set size (context: includes the Python "
                       "runtime, libraries and allocator caches, not only tensors)"),
        breakdown_at_peak=at_peak,
        accounting=Parts(parts=accounting,
                         source="sizes of the live tensors (each storage once); activations = bytes saved for "
                                "backward (saved_tensors_hooks); workspaces (CUDA) = allocated before the step beyond "
                                "parameters, buffers, inputs and optimizer state (cuBLAS / cuDNN workspaces); "
                                "temporaries = measured peak minus the rest"),
        layers=tuple(_layer_rows(model, m.tracker)),
        timeline=MemoryTimeline(**timeline),
        phases_ms={k: tuple(v) for k, v in m.phases.items()},
        estimate=Estimate(**m.est, estimates=tuple(estimates), measured_peak_bytes=int(peak)),
        snapshot=None if m.snapshot is None else Snapshot(**m.snapshot),
        notes=tuple(notes),
        **({"checkpointed": tuple(checkpointed)} if checkpointed else {}),
    )
