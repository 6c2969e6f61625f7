"""Collect the checklist's ``Facts`` (the typed record the rules read), in one job.

Three kinds of facts, each a section of the record (plain data):

* ``static``: read from the module tree and one traced forward (module types, Conv -> BN pairs
  found by tensor identity, activations and where they sit, layer widths, modes, dtypes, memory
  format, compile / DataParallel wrappers, weight-init scale).
* ``env``: the device and the backend flags (CUDA, compute capability, cudnn.benchmark, TF32).
* ``measured``: a short training-step profile (ops per step, sync points, kernels, Tensor Core
  kernels), step time, peak memory, saved-activation bytes, gradient health, inference-mode
  speed, a two-point batch-size probe, and the DataLoader when one is described.

Measurements run on the model itself inside ``restored_state``, which puts back its weights,
buffers, gradients and each module's mode afterwards (a deep copy on the same GPU would double the
weights in the peak-memory figure). Every collector that fails records why under
``Facts.errors`` instead of failing the job. Each section is a typed record made here or by the measure
layer (records.py, diagnostics.measure.records); no tensors, no modules.
"""

from __future__ import annotations

import statistics
from typing import Callable

import msgspec
import numpy as np
import torch
from torch import nn

from diagnostics.analyses.checklist import ANALYSIS, Facts
from diagnostics.analyses.checklist.records import (
    BatchPoint, BatchProbe, CompileFacts, DataLoaderFacts, FlaggedLayer, GradientFacts, GraphBreak, InferenceProbe,
    LoaderSettings, MeasuredFacts, ProfileFacts, Timed, TopOp, got,
)
from diagnostics.inputs import call as call_model
from diagnostics.measure.compare import CONTROL, MIN_ROUNDS, interleaved
from diagnostics.measure.dynamo import explain
from diagnostics.measure.environment import environment_facts
from diagnostics.measure.gradflow import gradient_flow
from diagnostics.measure.memory import peak_in_use_bytes
from diagnostics.measure.state import restored_state
from diagnostics.measure.structure import forward_facts, static_facts
from diagnostics.measure.timer import sync, time_calls
from diagnostics.measure.training import Step, Trainee
from diagnostics.trace.classify import uses_tensor_cores

#: ops that can run on Tensor Cores (matmuls, convolutions, attention), as named in the profiler.
ELIGIBLE_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                "aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv1d",
                "aten::conv2d", "aten::conv3d", "aten::_scaled_dot_product_flash_attention",
                "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention")
#: CPU-GPU synchronisation points, counted per step.
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
            "cudaEventSynchronize")
#: ops that copy a tensor into a new layout when a view would often do (clone is what contiguous
#: and reshape-of-a-non-viewable-tensor call).
LAYOUT_COPY_OPS = ("aten::contiguous", "aten::clone")
#: per-element indexing and scalar reads: hundreds of them per step mean a Python loop over a tensor.
ELEMENT_OPS = ("aten::select", "aten::slice", "aten::narrow", "aten::index", "aten::index_put_", "aten::item")
#: Warm-up calls before the inference and batch-size probes time anything: the first calls at a new
#: shape or mode pay one-off costs (oneDNN primitive creation, allocator growth).
WARMUP = 3
#: At least this many interleaved rounds for a two-way timing comparison (inference mode, batch size):
#: fewer give no 95% interval (measure.compare.MIN_ROUNDS).
COMPARE_ROUNDS = MIN_ROUNDS


# ----------------------------------------------------------------------------- measured facts
def _timed(fn: Callable[[], object], device, iters: int, warmup: int) -> Timed:
    """Seconds per call of ``fn`` (``measure.timer``): median, p90, mean, min over ``iters`` calls."""
    ms = np.asarray(time_calls(fn, device, max(1, iters), max(0, warmup)))
    return Timed(median_s=float(np.median(ms)) / 1e3, p90_s=float(np.percentile(ms, 90)) / 1e3,
                 mean_s=float(ms.mean()) / 1e3, min_s=float(ms.min()) / 1e3, iters=int(ms.size))


def compile_facts(model: nn.Module, inputs: tuple) -> CompileFacts:
    """Dynamo's graphs and graph breaks of one eval forward (measure.dynamo.explain; no code generation)."""
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("a TorchScript model is not compiled with torch.compile")
    model.eval()
    with torch.no_grad():
        ex = explain(model, inputs)
    return CompileFacts(graph_count=ex["graph_count"], graph_break_count=ex["graph_break_count"],
                        breaks=tuple(GraphBreak(location=b["location"], reason=b["reason"].splitlines()[0],
                                                count=b["count"]) for b in ex["graph_breaks"]))


def _train_step(loaded, model: nn.Module) -> Step:
    """The one training step (measure.training.Step) without an optimizer: zero_grad, forward, loss,
    backward. It keeps no copy of the loss, so the ops a profiled step counts are the model's, its loss's
    and backward's only (Step's own ``aten::detach`` would be one more per step)."""
    return Step(Trainee(model, loaded.loss_fn, loaded.inputs, loaded.loss_name), True, optimizer=None,
                keep_loss=False)


def profile_facts(step: Callable[[], None], device: torch.device, steps: int = 2) -> ProfileFacts:
    """Profile ``steps`` training steps (``measure.profiling.profile_steps``) and read, per step,
    ops, kernels, sync points and Tensor Cores from the trace (``step_profile_facts``)."""
    from diagnostics.measure.profiling import profile_steps

    # _sync between the steps, outside them: the harness's wait, not the model's.
    return step_profile_facts(profile_steps(step, steps, device, between=lambda: sync(device)), device)


def step_profile_facts(trace, device: torch.device) -> ProfileFacts:
    """The profile facts of a Trace whose steps are marked (classify.STEP_RE).

    Events are counted as torch's EventList counts calls (a call recorded twice, an only child
    named like its parent, once: views.repeated_calls) and, except kernels, only when they start
    inside a step. Top-level operators are the aten ops the step calls directly.
    """
    import numpy as np

    from diagnostics.trace import intervals as iv
    from diagnostics.trace.classify import comm_mask, communication, host_mask, kernel_mask
    from diagnostics.trace.breakdowns import repeated_calls, step_spans

    st = step_spans(trace)
    steps = len(st)
    if not steps:
        raise ValueError("the profile holds no marked step")
    ev = trace.events
    ts, dur = ev["ts"].to_numpy(), ev["dur"].to_numpy()
    names = trace.strings("name")
    parent = trace.nesting()["parent"]
    is_step = np.zeros(len(ev), dtype=bool)
    is_step[st["row"].to_numpy()] = True
    lo = st["start_us"].to_numpy()
    i = np.clip(np.searchsorted(lo, ts, side="right") - 1, 0, None)
    within = (ts >= lo[i]) & (ts <= lo[i] + st["dur_us"].to_numpy()[i])
    in_step = host_mask(trace) & within & ~is_step
    calls = in_step & ~repeated_calls(trace)
    counts: dict[str, int] = {}
    for name in names[calls].tolist():
        counts[name] = counts.get(name, 0) + 1
    # Called by the step itself (or by nothing): what the user's code asked for, not what ops call.
    direct = calls & ((parent < 0) | is_step[np.maximum(parent, 0)])
    top = direct & np.array([n.startswith("aten::") for n in trace.labels("name")])[trace.codes("name")]
    wall_us = statistics.median(st["dur_us"].tolist())
    kernels = kernel_mask(trace)
    kernel_names = sorted(set(names[kernels].tolist()))
    tc = [n for n in kernel_names if uses_tensor_cores(n)]
    busy_us = iv.length(iv.union(ts[kernels], ts[kernels] + dur[kernels]))
    comm_us = float(dur[kernels & comm_mask(trace)].sum())
    kernel_us = float(dur[kernels].sum())
    sync = {name: counts.get(name, 0) / steps for name in SYNC_OPS}
    copies = layout_copy_facts(trace, in_step, calls, device, kernel_us, steps)
    # Indexing and scalar reads called straight from Python (not inside another op: LSTM, attention
    # and backward kernels index internally); ``for row in x`` is one unbind with a select per row.
    element: dict[str, float] = {}
    for r in np.flatnonzero(direct).tolist():
        if names[r] in ELEMENT_OPS:
            element[names[r]] = element.get(names[r], 0) + 1 / steps
        elif names[r] == "aten::unbind":
            rows = int((calls & (parent == r) & (names == "aten::select")).sum())
            element["aten::select (unbind)"] = element.get("aten::select (unbind)", 0) + rows / steps
    return ProfileFacts(
        **copies,
        element_ops_per_step=element,
        element_ops_total_per_step=sum(element.values()),
        steps=steps,
        step_wall_us=wall_us,
        ops_per_step=int(top.sum()) / steps,
        median_op_us=statistics.median(dur[top].tolist()) if top.any() else None,
        kernels_per_step=int(kernels.sum()) / steps,
        median_kernel_us=statistics.median(dur[kernels].tolist()) if kernels.any() else None,
        sync_per_step=sync,
        sync_points_per_step=sum(v for k, v in sync.items() if k != "aten::_local_scalar_dense"),
        eligible_ops=tuple(sorted({n for n in counts if n in ELIGIBLE_OPS})),
        tensor_core_kernels=tuple(tc[:20]),
        kernel_names_sample=tuple(kernel_names[:20]),
        gpu_busy_fraction=(busy_us / steps / wall_us) if (kernels.any() and wall_us) else None,
        communication_fraction=(comm_us / kernel_us) if kernel_us else None,
        communication_families=tuple(f.family for f in communication(trace).families if f.where == "GPU"),
        top_ops=tuple(sorted((TopOp(name=k, count_per_step=v / steps) for k, v in counts.items()
                              if k.startswith("aten::")), key=lambda r: -r.count_per_step)[:15]),
    )


def layout_copy_facts(trace, in_step, calls, device: torch.device, kernel_us: float, steps: int) -> dict:
    """Layout copies the forward asks for (``.contiguous()``, ``.clone()``, a ``reshape`` of a view
    that cannot be viewed) against the step's operator time: on CPU the ops' CPU time, on CUDA their
    kernels' time (the GPU work launched inside the copy). A copy inside another copy counts once;
    copies inside backward kernels (made by PyTorch for its own kernels) are left out. ``in_step``:
    the host events that start in a step; ``calls``: those of them torch counts as calls."""
    import numpy as np

    from diagnostics.trace.classify import BACKWARD_NODE_PREFIX, RUNTIME_CATS, gpu_work_mask

    names = trace.strings("name")
    parent = trace.nesting()["parent"]

    def ancestors(r: int):
        p = parent[r]
        while p >= 0:
            yield p
            p = parent[p]

    def forward_copy(r: int) -> bool:
        return not any(names[p] in LAYOUT_COPY_OPS or names[p].startswith(BACKWARD_NODE_PREFIX)
                       for p in ancestors(r))

    copies = [r for r in np.flatnonzero(calls & np.isin(names, LAYOUT_COPY_OPS)).tolist() if forward_copy(r)]
    dur = trace.events["dur"].to_numpy()
    if device.type == "cuda":
        # GPU work whose launch call (same correlation id) runs inside one of the copies.
        ev = trace.events
        launch = trace.complete_mask() & trace.cat_mask(RUNTIME_CATS) & (ev["corr"].to_numpy() >= 0)
        by_corr = dict(zip(ev["corr"].to_numpy()[launch].tolist(), np.flatnonzero(launch).tolist()))
        work = np.flatnonzero(gpu_work_mask(trace))
        mine = set(copies)
        copy_us = sum(float(dur[w]) for w, c in zip(work.tolist(), ev["corr"].to_numpy()[work].tolist())
                      if c in by_corr and any(a in mine for a in ancestors(by_corr[c])))
        total_us = kernel_us
    else:
        copy_us = float(dur[copies].sum())
        total_us = float(np.nansum(trace.nesting()["self_us"][in_step]))
    return {"layout_copies_per_step": len(copies) / steps, "layout_copy_us_per_step": copy_us / steps,
            "op_time_us_per_step": total_us / steps,
            "layout_copy_fraction": (copy_us / total_us) if total_us else None,
            "layout_copy_time_kind": "GPU kernel" if device.type == "cuda" else "CPU operator"}


#: Training steps the checklist watches the gradients over: several steps of the real loss, as the
#: Gradient-flow page's rule is meant to judge (one step was a single draw).
GRADIENT_STEPS = 3


def gradient_facts(loaded, steps: int = GRADIENT_STEPS) -> GradientFacts:
    """Gradient health as the Gradient-flow page measures it (``measure.gradflow``; weights restored)."""
    r = gradient_flow(loaded, steps, "sgd", 0.01)
    m = r["metrics"]
    return GradientFacts(verdict=r["verdict"], phase=r["phase"], steps=steps,
                         layers=m["layers"], vanishing=m["layers_vanishing"],
                         exploding=m["layers_exploding"], dead=m["layers_dead"], nonfinite=m["layers_nonfinite"],
                         global_norm_first=m["global_norm_first"], global_norm_max=m["global_norm_max"],
                         min_ratio=m["grad_norm_min_ratio"], loss_stand_in=r["loss_stand_in"], loss=r["loss"],
                         flagged=tuple(FlaggedLayer(layer=l["layer"], status=l["status"], reason=l["reason"])
                                       for l in r["layers"] if l["status"] != "healthy"))


def _guard(errors: dict):
    """``guarded(key, fn)``: fn() or, when it fails (out of memory excepted), None with why under ``errors[key]``."""
    def guarded(key: str, fn):
        try:
            return fn()
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # one failing probe must not sink the checklist
            errors[key] = f"{type(e).__name__}: {str(e)[:300]}"
            return None
    return guarded


def _memory_growth(step, device: torch.device) -> float:
    """Allocated memory's growth per step over repeated steps (CUDA), after a first step."""
    allocs = []
    for _ in range(4):
        step()
        sync(device)
        allocs.append(torch.cuda.memory_allocated(device))
    return (allocs[-1] - allocs[1]) / 2


def _training_facts(loaded, model: nn.Module, step, device: torch.device, iters: int, profile_steps: int,
                    guarded, progress, out: dict) -> None:
    """The training step timed and profiled, its peak memory, saved activations, gradients and (CUDA)
    memory growth, into ``out``; the gradients cleared afterwards."""
    from dataclasses import replace

    progress(0.2, "timing the training step")
    out["train_step"] = guarded("train_step", lambda: _timed(step, device, iters, 2))
    progress(0.35, "profiling the training step")
    out["profile"] = guarded("profile", lambda: profile_facts(step, device, profile_steps))
    progress(0.5, "peak memory and saved activations")
    out["peak_bytes"] = guarded("peak_bytes", lambda: peak_in_use_bytes(step, device))

    def saved():
        from diagnostics.measure.memory import measure_saved

        model.zero_grad(set_to_none=True)
        return measure_saved(replace(loaded, model=model), loaded.inputs).saved_total

    out["saved_activation_bytes"] = guarded("saved_activations", saved)
    progress(0.6, "gradients")
    out["gradients"] = guarded("gradients", lambda: gradient_facts(replace(loaded, model=model)))
    if device.type == "cuda":
        out["memory_growth_bytes_per_step"] = guarded("memory_growth", lambda: _memory_growth(step, device))
    model.zero_grad(set_to_none=True)


def _inference_vs_training(model: nn.Module, inputs, device: torch.device, rounds: int) -> InferenceProbe:
    """eval() + inference_mode against a training-mode forward with autograd, interleaved (with the A/A control)."""
    def train_forward():
        model.train()
        with torch.enable_grad():
            call_model(model, inputs)

    def inference_forward():
        model.eval()
        with torch.inference_mode():
            call_model(model, inputs)

    c = interleaved({"train": train_forward, "inference": inference_forward}, device, rounds, WARMUP,
                    control=True)
    inf = c["inference"]
    # times: the geometric means of the rounds, whose ratio is the speed-up (they always agree)
    return InferenceProbe(train_grad_forward_s=c["train"]["time_ms"] / 1e3,
                          eval_inference_forward_s=inf["time_ms"] / 1e3,
                          speedup=inf["speedup"], speedup_ci=_pair(inf["speedup_ci"]), verdict=inf["verdict"],
                          control_ci=_pair(c[CONTROL]["speedup_ci"]), control_verdict=c[CONTROL]["verdict"],
                          rounds=inf["rounds"])


def _pair(ci) -> tuple[float, float] | None:
    """An interval (measure.compare writes a list, or None) as the records hold it."""
    return None if ci is None else (float(ci[0]), float(ci[1]))


def _batch_probe(model: nn.Module, make_inputs, batch_size: int, device: torch.device, rounds: int) -> BatchProbe:
    """Inference throughput at the batch and at twice it, interleaved (with the A/A control)."""
    model.eval()
    sizes = (batch_size, batch_size * 2)
    xs = [make_inputs(b) for b in sizes]

    def forward(x):
        def call():
            with torch.inference_mode():
                call_model(model, x)
        return call

    c = interleaved({"single": forward(xs[0]), "double": forward(xs[1])}, device, rounds, WARMUP,
                    control=True)
    # per batch: the geometric mean of the rounds' times, so the gain below is exactly the ratio of
    # the two throughputs shown
    points = tuple(BatchPoint(batch_size=b, median_s=c[k]["time_ms"] / 1e3, samples_per_s=b / (c[k]["time_ms"] / 1e3))
                   for b, k in zip(sizes, ("single", "double")))
    # throughput gain per round = (2b / t2) / (b / t1) = 2 x (t1 / t2): twice the speed-up ratio
    d = c["double"]
    ci = None if d["speedup_ci"] is None else (2 * d["speedup_ci"][0], 2 * d["speedup_ci"][1])
    return BatchProbe(points=points, throughput_gain_2x=2 * d["speedup"], throughput_gain_ci=ci,
                      control_ci=_pair(c[CONTROL]["speedup_ci"]), control_verdict=c[CONTROL]["verdict"],
                      rounds=d["rounds"])


def measured_facts(loaded, model: nn.Module, *,
                   iters: int = 5, profile_steps: int = 2, make_inputs: Callable[[int], tuple] | None = None,
                   batch_size: int | None = None, progress: Callable[[float, str], None] | None = None,
                   errors: dict | None = None) -> MeasuredFacts:
    """Everything timed or traced. ``model`` is ``loaded.model``: this function trains it, switches
    its mode and zeroes its gradients, so the caller restores it (``collect_facts`` does)."""
    inputs = loaded.inputs
    progress = progress or (lambda f, m: None)
    errors = errors if errors is not None else {}
    out: dict = {}
    device = torch.device(loaded.device)
    guarded = _guard(errors)
    model.train()
    step = _train_step(loaded, model)
    if any(p.requires_grad for p in model.parameters()):
        _training_facts(loaded, model, step, device, iters, profile_steps, guarded, progress, out)
    else:
        errors["train_step"] = "the model has no trainable parameters: training-step facts were skipped"
    progress(0.7, "inference mode vs training mode forward")
    rounds = max(iters, COMPARE_ROUNDS)
    out["inference"] = guarded("inference", lambda: _inference_vs_training(model, inputs, device, rounds))
    progress(0.75, "torch.compile graph breaks (Dynamo only)")
    out["compile"] = guarded("compile", lambda: compile_facts(model, inputs))
    if make_inputs is not None and batch_size:
        progress(0.8, "batch-size probe")
        out["batch_probe"] = guarded("batch_probe",
                                     lambda: _batch_probe(model, make_inputs, batch_size, device, rounds))
    return MeasuredFacts(**out)


# ----------------------------------------------------------------------------- data loader
from diagnostics.analyses.checklist import LOADER_KEYS  # noqa: E402


def dataloader_facts(desc: dict | None, dataset_path: str | None = None, step_time_s: float | None = None,
                     batches: int = 5) -> DataLoaderFacts | None:
    """The DataLoader as described, and (with a dataset module) the measured time per batch."""
    if not desc and not dataset_path:
        return None
    desc = {k: (desc or {}).get(k) for k in LOADER_KEYS}
    per_batch = note = fraction = None
    if dataset_path:
        from diagnostics.analyses.checklist.dataset import load_dataset, time_loader

        dataset = load_dataset(dataset_path)
        per_batch, note = time_loader(dataset, desc, batches)
        if step_time_s and per_batch is not None:
            fraction = per_batch / (per_batch + step_time_s)
    return DataLoaderFacts(described=LoaderSettings(**desc), loader_s_per_batch=per_batch, step_time_s=step_time_s,
                           loader_fraction=fraction, note=note)


# ----------------------------------------------------------------------------- all together
def collect_facts(loaded, options: dict | None = None, progress: Callable[[float, str], None] | None = None) -> Facts:
    """All facts for ``loaded`` (a LoadedModel). Options: purpose ("training" | "inference"),
    iters, profile_steps, dataloader (dict of LOADER_KEYS), dataset_path, skip_measured."""

    options = ANALYSIS.validate(options)
    progress = progress or (lambda f, m: None)
    errors: dict[str, str] = {}
    model = loaded.model
    progress(0.05, "reading the module tree")
    static, env = static_facts(model), environment_facts(loaded.device)
    # The probes run on the model itself, not on a deep copy: on a GPU a copy sat next to the
    # original on the same device, so the peak memory measured on it counted the weights twice (a
    # model at 50% of the GPU read as 100%, or ran out of memory), and a model holding something
    # copy.deepcopy cannot copy (a lock, a file) failed the whole checklist. restored_state puts
    # back what the probes change, from a copy in host memory that no device measurement sees.
    with restored_state(model):
        try:
            forward = forward_facts(model, loaded.inputs)
        except Exception as e:
            errors["forward"] = f"{type(e).__name__}: {str(e)[:300]}"
            forward = None
        if forward is not None and static.n_conv2d:
            x = next((t for t in loaded.inputs if t.dim() == 4), None)
            channels_last = None if x is None else bool(
                x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
            forward = msgspec.structs.replace(forward, conv_input_channels_last=channels_last)
        measured = None if options["skip_measured"] else measured_facts(
            loaded, model, iters=options["iters"],
            profile_steps=options["profile_steps"], make_inputs=loaded.make_inputs,
            batch_size=loaded.batch_size, progress=progress, errors=errors)
    timed = got(measured.train_step) if measured is not None else None
    step_s = timed.median_s if timed is not None else None
    progress(0.9, "data loader")
    try:
        dataloader = dataloader_facts(options["dataloader"], options["dataset_path"], step_s)
    except Exception as e:
        from diagnostics.errors import TorchScopeError

        if isinstance(e, TorchScopeError):
            raise
        errors["dataloader"] = f"{type(e).__name__}: {str(e)[:300]}"
        dataloader = None
    return Facts(purpose=options["purpose"], errors=errors, static=static, env=env, batch_size=loaded.batch_size,
                 task=getattr(loaded, "task", "unknown"), forward=forward, measured=measured, dataloader=dataloader)
