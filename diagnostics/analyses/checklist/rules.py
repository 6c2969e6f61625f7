"""The checklist rules: one visible list, ``RULES``, each ``rule(facts) -> Finding``.

A rule reads only the checklist's typed ``Facts`` (its sections as ``diagnostics.analyses.checklist.facts``
collects them), so it can be tested on hand-written facts. Every threshold is a named constant listed in ``thresholds.THRESHOLDS``
(shown in the UI and in docs/checklist.md); the model-design rules live in ``design_rules``. The score:
see ``SCORE_FORMULA`` (the package's declaration).
"""

from __future__ import annotations

from diagnostics.analyses.checklist.design_rules import (check_dead_units, check_dropout_bn_mode, check_gradient_flow,
                                                         check_gradients_nonfinite, check_hidden_activations, check_init,
                                                         check_layer_widths, check_redundant_layers)
from diagnostics.analyses.checklist.records import LoaderSettings
from diagnostics.analyses.checklist.rule_form import Rule, got, measured, na, on_cuda, pct, profile
from diagnostics.analyses.checklist.thresholds import (
    BATCH_GAIN_MIN, COMMUNICATION_FRACTION_MAX, DATALOADER_FRACTION_MAX, GPU_UTILIZATION_MIN, INFERENCE_SPEEDUP_MIN,
    LAUNCH_BOUND_MEDIAN_US, LAUNCH_BOUND_MIN_OPS, MEMORY_GROWTH_MAX_BYTES, PEAK_MEMORY_FRACTION_MAX, PREFETCH_FACTOR_MIN,
    PYTHON_LOOP_MIN_OPS, PYTHON_LOOP_MIN_SHARE, SAVED_ACTIVATION_FRACTION_MAX, SYNC_POINTS_FAIL, SYNC_POINTS_WARN,
    TENSOR_COPY_FRACTION_MAX, TENSOR_CORE_MIN_CC, TF32_MIN_CC, WIDTH_MULTIPLE,
)
# The finding's form is shared with every part that judges a run (diagnostics.findings); the page and the
# charts read its categories and statuses from here.
from diagnostics.findings import CATEGORIES, SCORED, STATUS_COLOR, STATUS_LABEL, STATUSES, Finding  # noqa: F401
from diagnostics.results import to_plain
from diagnostics.units import human_bytes, speedup_text



# ---------------------------------------------------------------------------- TensorBoard plugin's seven
def check_dataloader_time(f):
    dl = f.dataloader
    if not dl:
        return na("no DataLoader given")
    frac = dl.loader_fraction
    if frac is None:
        return na("no dataset module given: loader time was not measured")
    nums = {"loader_s_per_batch": dl.loader_s_per_batch, "step_time_s": dl.step_time_s, "fraction": frac}
    ev = (f"loading a batch took {dl.loader_s_per_batch * 1e3:.2f} ms against a {dl.step_time_s * 1e3:.2f} ms "
          f"training step: {pct(frac)} of the step (max {pct(DATALOADER_FRACTION_MAX)})")
    if dl.note:
        ev += f"; {dl.note}"
    if frac > DATALOADER_FRACTION_MAX:
        return ("fail", ev, "Use more DataLoader workers (num_workers), pin_memory and prefetching, or move "
                "preprocessing out of __getitem__ (precompute, or do it on the GPU).", nums)
    return "pass", ev, "", nums


def check_communication(f):
    p = profile(f)
    frac = p.communication_fraction if p else None
    if not on_cuda(f):
        return na("no CUDA: communication kernels are not traced")
    if f.env.world_size <= 1 and not frac:
        return na("not distributed (world size 1)")
    frac = frac or 0.0
    families = ", ".join(p.communication_families if p else ()) or "none matched a known family"
    ev = (f"communication kernels ({families}) took {pct(frac)} of kernel time "
          f"(max {pct(COMMUNICATION_FRACTION_MAX)})")
    if frac > COMMUNICATION_FRACTION_MAX:
        return ("warn", ev, "Overlap communication with compute (DDP bucket_cap_mb, gradient accumulation with "
                "no_sync), or use a larger batch per device.", {"fraction": frac})
    return "pass", ev, "", {"fraction": frac}


def check_gpu_utilization(f):
    if not on_cuda(f):
        return na("no CUDA")
    u = p.gpu_busy_fraction if (p := profile(f)) else None
    if u is None:
        return na("no GPU kernels were traced")
    ev = f"a GPU kernel was running {pct(u)} of the training step (min {pct(GPU_UTILIZATION_MIN)})"
    if u < GPU_UTILIZATION_MIN:
        return ("warn", ev, "The GPU idles: increase the batch size, or cut CPU work per step (data loading, "
                "sync points, many tiny kernels: try CUDA graphs or torch.compile).", {"gpu_busy_fraction": u})
    return "pass", ev, "", {"gpu_busy_fraction": u}


def check_tensor_cores(f):
    if not on_cuda(f):
        return na("no CUDA")
    cc = f.env.compute_capability or 0
    if cc < TENSOR_CORE_MIN_CC:
        return na(f"compute capability {cc} has no Tensor Cores (needs >= {TENSOR_CORE_MIN_CC})")
    p = profile(f)
    eligible = p.eligible_ops if p else ()
    tc = p.tensor_core_kernels if p else ()
    if not eligible:
        return na("no matmul / convolution ops in the step")
    nums = {"eligible_ops": len(eligible), "tensor_core_kernels": len(tc), "compute_capability": cc}
    if not tc:
        return ("fail", f"{len(eligible)} Tensor-Core-eligible op kinds ran ({', '.join(eligible[:4])}) but no "
                "Tensor Core kernel was launched", "Enable automatic mixed precision (torch.autocast with "
                "bfloat16/float16) or TF32 so matmuls and convolutions use Tensor Cores.", nums)
    return "pass", f"{len(tc)} Tensor Core kernel kinds ran (e.g. {tc[0]})", "", nums


def check_peak_memory(f):
    if not on_cuda(f):
        return na("no CUDA: device memory limits apply to GPUs")
    peak, total = got(measured(f).peak_bytes), f.env.device_memory_bytes
    if peak is None or not total:
        return na("peak memory was not measured")
    frac = peak / total
    nums = {"peak_bytes": peak, "device_memory_bytes": total, "fraction": frac}
    ev = f"peak {human_bytes(peak)} of {human_bytes(total)} device memory ({pct(frac)}, max {pct(PEAK_MEMORY_FRACTION_MAX)})"
    if frac > PEAK_MEMORY_FRACTION_MAX:
        return ("fail", ev, "Close to out-of-memory: use activation checkpointing "
                "(torch.utils.checkpoint) or mixed precision, or a smaller batch.", nums)
    return "pass", ev, "", nums


def check_data_parallel(f):
    s = f.static
    if not s.data_parallel:
        return "pass", "the model is not wrapped in nn.DataParallel", "", {"devices": 0}
    n = s.data_parallel_devices
    if n > 1:
        return ("fail", f"nn.DataParallel over {n} devices", "Use DistributedDataParallel (one process per GPU): "
                "DataParallel replicates the model every step and is GIL-bound.", {"devices": n})
    where = "one device only" if n == 1 else "no GPU (it just calls the module)"
    return "warn", f"nn.DataParallel over {where}", "Drop the wrapper: it only adds overhead.", {"devices": n}


def check_ddp_backend(f):
    s = f.static
    if not s.ddp:
        return na("the model is not wrapped in DistributedDataParallel")
    backend = s.dist_backend
    if on_cuda(f) and backend != "nccl":
        return ("fail", f"DDP on CUDA with backend {backend!r}", "Use the NCCL backend for GPU training: "
                "torch.distributed.init_process_group('nccl').", {})
    return "pass", f"DDP with backend {backend!r}", "", {}


# ---------------------------------------------------------------------------- memory
def check_saved_activations(f):
    saved, total = got(measured(f).saved_activation_bytes), f.env.device_memory_bytes
    if saved is None or not total:
        return na("saved activations were not measured")
    frac = saved / total
    nums = {"saved_bytes": saved, "device_memory_bytes": total, "fraction": frac,
            "param_bytes": f.static.param_bytes}
    ev = (f"autograd saves {human_bytes(saved)} for backward at batch {f.batch_size} ({pct(frac)} of "
          f"{human_bytes(total)}; parameters: {human_bytes(f.static.param_bytes)})")
    if frac > SAVED_ACTIVATION_FRACTION_MAX:
        return ("warn", ev, "Use activation checkpointing (torch.utils.checkpoint) on the largest blocks, or mixed "
                "precision, to trade compute for memory.", nums)
    return "pass", ev, "", nums


def check_memory_growth(f):
    if not on_cuda(f):
        return na("no CUDA: allocator growth is tracked on GPUs")
    g = got(measured(f).memory_growth_bytes_per_step)
    if g is None:
        return na("not measured")
    ev = f"allocated memory grew {human_bytes(g)} per step over repeated steps (max {human_bytes(MEMORY_GROWTH_MAX_BYTES)})"
    if g > MEMORY_GROWTH_MAX_BYTES:
        return ("fail", ev, "Something keeps tensors alive between steps (e.g. accumulating a loss tensor instead of "
                "loss.item(), lists of outputs): detach or convert to Python numbers.", {"bytes_per_step": g})
    return "pass", ev, "", {"bytes_per_step": g}


def check_inplace(f):
    s = f.static
    n_not, n_in = len(s.not_inplace_activations), s.inplace_activations
    if not (n_not or n_in):
        return na("no activation modules that can run in place")
    nums = {"inplace": n_in, "not_inplace": n_not}
    if n_not and not n_in:
        return ("warn", f"none of {n_not} activations run in place", "Activations such as ReLU(inplace=True) save "
                "one activation tensor each when autograd allows it (check the gradients stay correct).", nums)
    return "pass", f"{n_in} of {n_in + n_not} activations run in place", "", nums


# ---------------------------------------------------------------------------- compute
def check_cudnn_benchmark(f):
    if not on_cuda(f):
        return na("no CUDA")
    if not f.static.n_conv:
        return na("no convolutions")
    if not f.env.cudnn_benchmark:
        return ("warn", "torch.backends.cudnn.benchmark is off", "With fixed input shapes, set "
                "torch.backends.cudnn.benchmark = True to pick the fastest convolution algorithms.", {})
    return "pass", "cudnn.benchmark is on", "", {}


def check_tf32(f):
    if not on_cuda(f):
        return na("no CUDA")
    cc = f.env.compute_capability or 0
    if cc < TF32_MIN_CC:
        return na(f"compute capability {cc} has no TF32 (needs >= {TF32_MIN_CC})")
    mm, cd = f.env.matmul_allow_tf32, f.env.cudnn_allow_tf32
    if not mm:
        return ("warn", f"TF32 matmuls are off (matmul.allow_tf32={mm}, cudnn.allow_tf32={cd})",
                "torch.set_float32_matmul_precision('high') makes fp32 matmuls use TF32 Tensor Cores.", {})
    return "pass", f"TF32 on (matmul {mm}, cudnn {cd})", "", {}


def check_sync_points(f):
    if not on_cuda(f):
        # .item() on a CPU tensor is a memory read: there is no device to wait for. Many of them in a
        # loop are a vectorisation problem, which python_loops reports.
        return na("no GPU (CUDA): host reads such as .item() cost no device synchronisation on CPU")
    p = profile(f)
    if p is None:
        return na("the step was not profiled")
    sync, n = p.sync_per_step, p.sync_points_per_step or 0
    nums = dict(sync, total=n)
    detail = ", ".join(f"{k} {v:g}" for k, v in sync.items() if v)
    ev = f"{n:g} CPU-GPU sync points per step" + (f" ({detail})" if detail else "")
    if n >= SYNC_POINTS_FAIL:
        status = "fail"
    elif n >= SYNC_POINTS_WARN:
        status = "warn"
    else:
        return "pass", ev, "", nums
    return (status, ev, "Each .item(), .cpu(), print of a tensor or bool() of a tensor waits for the GPU: "
            "accumulate on the device and read values every N steps.", nums)


def check_launch_bound(f):
    p = profile(f)
    if p is None:
        return na("the step was not profiled")
    if on_cuda(f) and p.kernels_per_step:
        n, med, what = p.kernels_per_step, p.median_kernel_us, "kernels"
    else:
        n, med, what = p.ops_per_step, p.median_op_us, "operators"
    if not n or med is None:
        return na("no ops were traced")
    nums = {"per_step": n, "median_us": med}
    ev = f"{n:g} {what} per step, median {med:.1f} µs each"
    if n >= LAUNCH_BOUND_MIN_OPS and med < LAUNCH_BOUND_MEDIAN_US:
        return ("warn", ev + f" (>= {LAUNCH_BOUND_MIN_OPS} and < {LAUNCH_BOUND_MEDIAN_US:g} µs: launch-bound)",
                "Many tiny ops spend their time in dispatch: torch.compile fuses them; CUDA graphs remove launch cost; "
                "a bigger batch amortises it.", nums)
    return "pass", ev, "", nums


def check_tensor_copies(f):
    p = profile(f)
    if p is None:
        return na("the step was not profiled")
    frac = p.layout_copy_fraction
    if frac is None:
        return na("no operator time was traced")
    n, us, kind = p.layout_copies_per_step, p.layout_copy_us_per_step, p.layout_copy_time_kind
    nums = {"copies_per_step": n, "copy_us_per_step": us, "fraction": frac}
    ev = (f"{n:g} layout copies per step in the forward (.contiguous() / .clone() / reshape of a view) took "
          f"{us / 1e3:.2f} ms, {pct(frac)} of the step's {kind} time (max {pct(TENSOR_COPY_FRACTION_MAX)})")
    if frac > TENSOR_COPY_FRACTION_MAX:
        return ("warn", ev, "Keep views instead of copies: view / reshape / transpose / permute / narrow / expand "
                "cost nothing; drop .contiguous() where the next op accepts strided input (matmul, einsum, "
                "elementwise ops do); pick one layout end to end (batch_first, channels_last) so no transpose has "
                "to be materialised every step.", nums)
    return "pass", ev, "", nums


def check_python_loops(f):
    p = profile(f)
    if p is None:
        return na("the step was not profiled")
    ops = p.element_ops_per_step
    top = p.ops_per_step
    if ops is None or not top:
        return na("no ops were traced")
    n = sum(ops.values())
    share = n / top
    b = f.batch_size
    nums = {"element_ops_per_step": n, "top_level_ops_per_step": top, "share": share, "batch_size": b}
    detail = ", ".join(f"{k} {v:g}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1]) if v)
    ev = (f"{n:g} indexing / scalar-read ops per step called from Python" + (f" ({detail})" if detail else "")
          + f", {pct(share)} of {top:g} top-level ops")
    if b:
        ev += f"; {n / b:.2g} per sample at batch {b}"
    if n >= PYTHON_LOOP_MIN_OPS and share >= PYTHON_LOOP_MIN_SHARE:
        return ("warn", ev + f" (>= {PYTHON_LOOP_MIN_OPS} and >= {pct(PYTHON_LOOP_MIN_SHARE)}: a Python loop over "
                "tensor elements?)", "Vectorise: replace the loop by whole-tensor ops (broadcasting, torch.where, "
                "gather / scatter / index_select with an index tensor, bmm / einsum, torch.vmap); read many values "
                "with one .tolist() instead of .item() per element.", nums)
    return "pass", ev, "", nums


def check_compile(f):
    s = f.static
    if s.compiled:
        return "pass", "the model is torch.compile'd", "", {}
    if s.torchscript:
        return "pass", "the model is TorchScript (already graph-compiled)", "", {}
    if not on_cuda(f) and not f.env.cxx_compiler:
        return na("torch.compile on CPU needs a C++ compiler, none found")
    return ("warn", "the model is not compiled", "Try torch.compile(model) (the Optimize page measures it): it fuses "
            "elementwise ops and cuts Python overhead; the first call pays compile time.", {})


def check_channels_last(f):
    s = f.static
    if not s.n_conv2d:
        return na("no 2-D convolutions")
    x_cl = f.forward.conv_input_channels_last if f.forward else None
    nums = {"conv2d": s.n_conv2d, "weights_channels_last": s.channels_last, "input_channels_last": x_cl}
    if s.channels_last and x_cl:
        return "pass", "weights and input are channels_last", "", nums
    return ("warn", f"{s.n_conv2d} Conv2d layers run in NCHW (channels_first) memory format",
            "model.to(memory_format=torch.channels_last) and the same for inputs: cuDNN (Tensor Cores) and oneDNN "
            "convolutions prefer NHWC.", nums)


def _surely_above(ci, threshold: float, noise=None) -> bool:
    """Above ``threshold`` beyond the noise: the interval's low end is above it, and above it scaled by
    the A/A control's high end (``noise``: the control's spread folded in). No interval: never."""
    if not ci or ci[0] is None:
        return False
    return ci[0] > threshold * max(1.0, (noise or [None, None])[1] or 1.0)


def check_graph_breaks(f):
    c = got(measured(f).compile)
    if c is None:
        return na("graph breaks were not checked (torch._dynamo.explain did not run on this model)")
    n = c.graph_break_count
    nums = {"graph_count": c.graph_count, "graph_break_count": n, "breaks": to_plain(c.breaks)}
    if n == 0:
        return "pass", f"Dynamo captures the forward as {c.graph_count} graph(s) with no break", "", nums
    where = "; ".join(f"{b.location}: {b.reason}" for b in c.breaks[:3])
    return ("warn", f"{n} graph break(s) split the forward into {c.graph_count} graphs ({where})",
            "Each break hands control back to Python and gives back part of torch.compile's speed-up. The Compile "
            "page (python -m diagnostics compile) lists every break with its source line and the rewrite that "
            "removes it.", nums)


def check_batch_size(f):
    bp = got(measured(f).batch_probe)
    b = f.batch_size
    if bp is None:
        return na("the batch-size probe did not run")
    gain, ci = bp.throughput_gain_2x, bp.throughput_gain_ci
    nums = {"batch_size": b, "throughput_gain_2x": gain, "throughput_gain_ci": to_plain(ci),
            "points": to_plain(bp.points)}
    p1, p2 = bp.points
    change = "more" if p2.samples_per_s > p1.samples_per_s else "fewer"
    ev = (f"at batch {p1.batch_size}: {p1.samples_per_s:.0f} samples/s; at {p2.batch_size}: "
          f"{p2.samples_per_s:.0f} samples/s ({change} samples/s: throughput {speedup_text(gain, ci)}, "
          f"{bp.rounds} interleaved rounds)")
    if _surely_above(ci, BATCH_GAIN_MIN, bp.control_ci):
        return ("warn", ev + f", more than x{BATCH_GAIN_MIN}", "A larger batch (if memory and the optimisation "
                "allow) raises throughput: the device is not saturated at this batch size.", nums)
    if gain > BATCH_GAIN_MIN:
        ev += f"; not above x{BATCH_GAIN_MIN} beyond the noise"
    if b and b % WIDTH_MULTIPLE and on_cuda(f):  # tiles matter to Tensor Cores, not to a CPU
        return ("warn", ev + f"; batch size {b} is not a multiple of {WIDTH_MULTIPLE}",
                f"Use a batch size that is a multiple of {WIDTH_MULTIPLE}.", nums)
    return "pass", ev, "", nums


def check_mixed_precision(f):
    dt = f.static.param_dtypes
    if not dt:
        return na("no parameters")
    low = sum(v for k, v in dt.items() if k in ("float16", "bfloat16"))
    total = sum(dt.values())
    if not on_cuda(f):
        return na("no CUDA: mixed precision pays off on GPUs (on CPU, bf16 needs AMX/AVX512-BF16; try the AMP fix)")
    nums = {"low_precision_params": low, "params": total}
    if low == 0:
        return ("warn", "all parameters are float32 and AMP is not part of the model",
                "Train with torch.autocast('cuda', dtype=torch.bfloat16) (+ GradScaler for float16).", nums)
    return "pass", f"{low / total:.0%} of parameters are in 16-bit", "", nums


# ---------------------------------------------------------------------------- deployment
def check_conv_bn_fusion(f):
    pairs = f.forward.conv_bn_pairs if f.forward else None
    if pairs is None:
        return na("the forward pass could not be traced")
    if not f.static.n_batchnorm:
        return na("no BatchNorm layers")
    if pairs:
        return ("warn", f"{len(pairs)} Conv -> BatchNorm pairs can be fused for inference "
                f"(e.g. {pairs[0][0]} -> {pairs[0][1]})", "Fold BatchNorm into the preceding convolution for "
                "inference (torch.fx fuse or torch.nn.utils.fusion.fuse_conv_bn_eval): one op fewer per pair.",
                {"pairs": len(pairs)})
    return "pass", "no BatchNorm directly follows a convolution", "", {"pairs": 0}


def check_inference_mode(f):
    inf = got(measured(f).inference)
    if inf is None:
        return na("not measured")
    sp, ci = inf.speedup or 0, inf.speedup_ci
    nums = to_plain(inf)
    # "speed-up" only where the time went down: the two times are the ones the ratio is made of
    word = "speed-up" if sp > 1 else "slow-down" if sp < 1 else "no change"
    ev = (f"forward in train mode with grad: {inf.train_grad_forward_s * 1e3:.2f} ms; eval() + inference_mode: "
          f"{inf.eval_inference_forward_s * 1e3:.2f} ms ({word} {speedup_text(sp, ci, inf.verdict)}, "
          f"{inf.rounds} interleaved rounds)")
    if _surely_above(ci, INFERENCE_SPEEDUP_MIN, inf.control_ci):
        return ("warn", ev, "For inference call model.eval() and run under torch.inference_mode(): no autograd "
                "graph, no saved tensors, no version counters.", nums)
    if sp >= INFERENCE_SPEEDUP_MIN:
        return "pass", ev + f" (not above x{INFERENCE_SPEEDUP_MIN} beyond the noise)", "", nums
    return "pass", ev + f" (below x{INFERENCE_SPEEDUP_MIN})", "", nums


# ---------------------------------------------------------------------------- data pipeline
def _dl(f) -> LoaderSettings | None:
    return f.dataloader.described if f.dataloader else None


def check_num_workers(f):
    d = _dl(f)
    if d is None:
        return na("no DataLoader given")
    w = d.num_workers
    if w is None:
        return na("num_workers not given")
    cpus = f.env.cpu_count or 1
    if int(w) == 0:
        return ("warn", "num_workers=0: batches are loaded in the training process, between steps",
                f"Use num_workers > 0 (up to the {cpus} CPU cores) so loading overlaps compute.", {"num_workers": 0})
    if int(w) > cpus:
        return ("warn", f"num_workers={w} exceeds the {cpus} CPU cores", "Use at most one worker per core.",
                {"num_workers": w, "cpus": cpus})
    return "pass", f"num_workers={w} ({cpus} cores)", "", {"num_workers": w, "cpus": cpus}


def check_pin_memory(f):
    d = _dl(f)
    if d is None:
        return na("no DataLoader given")
    if not on_cuda(f):
        return na("no CUDA: pinned memory speeds host-to-GPU copies")
    if not d.pin_memory:
        return ("warn", "pin_memory=False", "pin_memory=True with .to(device, non_blocking=True) makes copies "
                "asynchronous.", {})
    return "pass", "pin_memory=True", "", {}


def check_prefetch(f):
    d = _dl(f)
    if d is None:
        return na("no DataLoader given")
    w = int(d.num_workers or 0)
    if w == 0:
        return na("prefetch_factor and persistent_workers need num_workers > 0")
    pf, pw = d.prefetch_factor, d.persistent_workers
    problems = []
    if pf is not None and int(pf) < PREFETCH_FACTOR_MIN:
        problems.append(f"prefetch_factor={pf} (< {PREFETCH_FACTOR_MIN})")
    if not pw:
        problems.append("persistent_workers=False (workers restart every epoch)")
    if problems:
        return ("warn", "; ".join(problems), f"Set prefetch_factor >= {PREFETCH_FACTOR_MIN} and "
                "persistent_workers=True.", {"prefetch_factor": pf, "persistent_workers": pw})
    return "pass", f"prefetch_factor={pf}, persistent_workers={pw}", "", {"prefetch_factor": pf}


RULES: list[Rule] = [
    # The TensorBoard profiler plugin's seven
    Rule("dataloader_time", "DataLoader time under 5% of the step", "data pipeline", check_dataloader_time),
    Rule("communication", "Communication under 10% of kernel time", "compute", check_communication),
    Rule("gpu_utilization", "GPU busy at least 50% of the step", "compute", check_gpu_utilization),
    Rule("tensor_cores", "Tensor Cores used where eligible (AMP)", "compute", check_tensor_cores, fix="purpose:amp"),
    Rule("peak_memory", "Peak memory under 90% of the device", "memory", check_peak_memory,
         fix="train:activation_checkpointing"),
    Rule("data_parallel", "DistributedDataParallel instead of DataParallel", "compute", check_data_parallel),
    Rule("ddp_backend", "DDP uses NCCL on GPUs", "compute", check_ddp_backend),
    # Model design
    Rule("hidden_activations", "No Sigmoid/Tanh in hidden layers", "model design", check_hidden_activations),
    Rule("layer_widths", "Layer widths are multiples of 8", "model design", check_layer_widths),
    Rule("weight_init", "Weights initialised at a sane scale", "model design", check_init),
    Rule("dropout_bn_mode", "Dropout/BatchNorm in the right mode", "model design", check_dropout_bn_mode),
    Rule("gradients_finite", "Gradients are finite", "model design", check_gradients_nonfinite),
    Rule("gradient_flow", "No vanishing or exploding gradients", "model design", check_gradient_flow),
    Rule("dead_units", "Few dead ReLU units", "model design", check_dead_units),
    Rule("redundant_layers", "No layers that add nothing", "model design", check_redundant_layers),
    # Memory
    Rule("saved_activations", "Saved activations fit (checkpointing)", "memory", check_saved_activations,
         fix="train:activation_checkpointing"),
    Rule("memory_growth", "No memory growth across steps", "memory", check_memory_growth),
    Rule("inplace_activations", "In-place activations", "memory", check_inplace),
    # Compute
    Rule("sync_points", "No CPU-GPU sync points in the step", "compute", check_sync_points),
    Rule("launch_bound", "Not launch-bound (many tiny ops)", "compute", check_launch_bound, fix="purpose:torch_compile"),
    Rule("tensor_copies", "Views instead of layout copies", "compute", check_tensor_copies),
    Rule("python_loops", "Vectorised (no Python loop over tensor elements)", "compute", check_python_loops),
    Rule("torch_compile", "torch.compile used", "compute", check_compile, fix="purpose:torch_compile"),
    Rule("graph_breaks", "No torch.compile graph breaks", "compute", check_graph_breaks),
    Rule("channels_last", "Conv nets in channels_last", "compute", check_channels_last, fix="purpose:channels_last"),
    Rule("cudnn_benchmark", "cudnn.benchmark on", "compute", check_cudnn_benchmark),
    Rule("tf32", "TF32 on for fp32 matmuls", "compute", check_tf32),
    Rule("mixed_precision", "Mixed precision", "compute", check_mixed_precision, fix="purpose:amp"),
    Rule("batch_size", "Batch size saturates the device", "compute", check_batch_size),
    # Deployment
    Rule("conv_bn_fusion", "Conv -> BatchNorm pairs fused", "deployment", check_conv_bn_fusion, fix="conv_bn_fusion"),
    Rule("inference_mode", "eval() + inference_mode for inference", "deployment", check_inference_mode,
         fix="inference_mode"),
    # Data pipeline
    Rule("num_workers", "DataLoader uses worker processes", "data pipeline", check_num_workers),
    Rule("pin_memory", "DataLoader pins memory", "data pipeline", check_pin_memory),
    Rule("prefetch", "DataLoader prefetches and keeps workers", "data pipeline", check_prefetch),
]


def evaluate(facts) -> list[Finding]:
    """Every rule's finding on ``facts`` (a Facts), in RULES order."""
    return [rule(facts) for rule in RULES]


def score(findings: list[Finding]) -> float | None:
    """100 * (pass + 0.5 * warn) / (pass + warn + fail + error); None when no rule applies.

    A rule that crashed ("error") counts as failed: dropping it from the denominator would raise the
    score (one broken rule moved a 97.0 to 100.0)."""
    n = {s: sum(f.status == s for f in findings) for s in SCORED}
    applicable = sum(n.values())
    return None if applicable == 0 else 100.0 * (n["pass"] + 0.5 * n["warn"]) / applicable
