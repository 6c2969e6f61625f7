"""The memory plan of an attached script's own job (``run --plan``), made inside the script's process.

The script's model cannot be rebuilt outside its process (its classes are the script's), so the attach
agent loads this module (by import, only when ``--plan`` was given) at the first optimizer step's end and
calls :func:`plan_in_process` with the script's main module, its optimizer and what the agent recorded of
the main module's training forward (each positional tensor's shape and dtype, autocast). The plan runs on
a fake copy (trace.skeleton + FakeTensorMode): nothing of the model's size is allocated, nothing of the
script's objects is changed, torch's random state is restored after it. It returns plain data (rows of
predicted peaks, and the bytes the script's tensors held at that boundary), which the agent writes to the
run folder as JSON; the attach job reads it back (bounded, never unpickled) into ``AttachResult.plan``.

When the script dies of out-of-memory, the agent calls :func:`fit_in_process` from its excepthook (the same
way, by import for the time of it): the budget answer (fit.fit_budget) for the script's step against the
device's capacity (CUDA: total_memory; CPU: :func:`process_memory_limit`), on fake tensors, recompute times
not measured (the model is not run again in a process that just ran out of memory: ranked by FLOPs).

:func:`parse_spec` (no torch) checks ``--plan``'s text in the CLI before the script starts.
"""

from __future__ import annotations

from diagnostics.analyses.plan.configs import DTYPES
from diagnostics.declare import OptionError

#: Keys ``--plan`` takes.
SPEC_KEYS = ("batch", "seq", "dtype", "device", "shard", "ranks", "probe")
#: The shardings a row may plan (plan's configs.SHARDING); ``fsdp`` is FSDP's full sharding: zero3.
SHARDS = ("zero1", "zero2", "zero3")
SHARD_ALIASES = {"fsdp": "zero3"}
EXAMPLE = "batch=2x,4x;seq=2x;dtype=bf16;device=H100-80GB;shard=zero3,ranks=8"


def _sizes(key: str, value: str, what: str) -> list[tuple[str, float | int]]:
    """'2x,0.5x,64' -> [('x', 2.0), ('x', 0.5), ('n', 64)]; OptionError naming the bad part."""
    out: list[tuple[str, float | int]] = []
    for b in value.split(","):
        mult = b.lower().endswith("x")
        num = b[:-1] if mult else b
        try:
            n = float(num) if mult else int(num)
        except ValueError:
            n = 0
        if not n or n <= 0:
            raise OptionError(f"--plan: {key} {b!r} is neither a multiple of the script's {what} (2x, 0.5x) "
                              f"nor a whole number{' of samples' if key == 'batch' else ' (a length)'}")
        out.append(("x", n) if mult else ("n", n))
    return out


def parse_spec(text: str | None) -> dict:
    """'batch=2x,4x;seq=2x;dtype=bf16;device=H100-80GB;shard=zero3,ranks=8' -> {'batch': [('x', 2), ('x', 4)],
    'seq': [('x', 2.0)], 'seq_input': '', 'dtype': ['bf16'], 'device': 'H100-80GB', 'shard': ['zero3'],
    'ranks': 8, 'probe': False}. A batch is a multiple of the script's own (``2x``) or a number (``64``); a
    length (``seq=``) likewise, applied to every token input (an integer tensor with a second dimension),
    each keeping its own length, or to the one input ``seq=NAME=...`` names (a keyword input's name, or
    ``input1`` for the first positional one). ``shard=zero1,zero3,ranks=8`` (``fsdp`` = zero3; ``ranks=``
    also as its own part): sharded rows, the script's batch per rank. ``probe=yes``: kernel scratch measured
    by running those ops once on real tensors (scratch.py; the one thing the plan then allocates, bounded
    by its probe limit). '' or None: the script's own configuration alone. OptionError naming the part
    that is wrong."""
    out: dict = {"batch": [], "seq": [], "seq_input": "", "dtype": [], "device": "", "shard": [], "ranks": None,
                 "probe": False}
    for part in (text or "").replace(" ", "").split(";"):
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq or not value:
            raise OptionError(f"--plan: {part!r} is not KEY=VALUE (e.g. {EXAMPLE})")
        if key not in SPEC_KEYS:
            raise OptionError(f"--plan: unknown key {key!r}; the keys: {', '.join(SPEC_KEYS)}")
        if key == "batch":
            out["batch"] += _sizes("batch", value, "batch")
        elif key == "seq":
            name, named, sizes = value.partition("=")
            if named:
                if not name.isidentifier():
                    raise OptionError(f"--plan: seq={value!r}: {name!r} is not an input's name (give seq=2x for "
                                      "every token input, or seq=NAME=2x for one input)")
                if not sizes:
                    raise OptionError(f"--plan: seq={value!r}: no lengths after {name}= (e.g. seq={name}=2x,1024)")
                out["seq_input"] = name
            out["seq"] += _sizes("seq", sizes if named else value, "sequence length")
        elif key == "probe":
            if value not in ("yes", "no"):
                raise OptionError(f"--plan: probe={value!r}: yes (measure kernel scratch on real tensors) or no")
            out["probe"] = value == "yes"
        elif key == "dtype":
            for d in value.split(","):
                if d not in DTYPES:
                    raise OptionError(f"--plan: dtype {d!r} is not one of {', '.join(DTYPES)}")
                out["dtype"].append(d)
        elif key in ("shard", "ranks"):
            for item in value.split(",") if key == "shard" else [f"ranks={value}"]:
                k, is_ranks, n = item.partition("=")
                if is_ranks:
                    if k != "ranks":
                        raise OptionError(f"--plan: shard={value!r}: {item!r} is neither a sharding "
                                          f"({', '.join(SHARDS)}, fsdp) nor ranks=N")
                    if not n.isdigit() or int(n) < 2:
                        raise OptionError(f"--plan: ranks={n!r}: give the number of ranks, 2 or more (e.g. "
                                          "shard=zero3,ranks=8)")
                    out["ranks"] = int(n)
                    continue
                s = SHARD_ALIASES.get(item, item)
                if s not in SHARDS:
                    raise OptionError(f"--plan: shard {item!r} is not one of {', '.join(SHARDS)}, fsdp (e.g. "
                                      "shard=zero3,ranks=8)")
                if s not in out["shard"]:
                    out["shard"].append(s)
        else:
            from diagnostics.analyses.plan.targets import check_name

            check_name(value)
            out["device"] = value
    if out["shard"] and out["ranks"] is None:
        raise OptionError(f"--plan: shard={','.join(out['shard'])} needs the number of ranks: add ranks=N (e.g. "
                          f"shard={out['shard'][0]},ranks=8)")
    if out["ranks"] is not None and not out["shard"]:
        raise OptionError(f"--plan: ranks={out['ranks']} without shard=: name the sharding (e.g. "
                          f"shard=zero3,ranks={out['ranks']})")
    return out


# ----------------------------------------------------------------------------- inside the script's process
def _first_float(out):
    import torch

    seen = [out]
    while seen:
        x = seen.pop(0)
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x
        if isinstance(x, dict):
            seen.extend(x.values())
        elif isinstance(x, (list, tuple)):
            seen.extend(x)
    raise OptionError("the model's output holds no floating-point tensor to make a loss from")


#: The script's loss, recognised by the autograd nodes between the model's output and the tensor its
#: backward started from (the agent records their names): (node that names it, loss, what the plan replays).
LOSSES = (
    ("NllLossBackward0", "cross_entropy", "cross-entropy over the output's last dimension (log-softmax + NLL)"),
    ("MseLossBackward0", "mse_loss", "mean squared error against a target shaped as the output"),
    ("L1LossBackward0", "l1_loss", "L1 against a target shaped as the output"),
    ("SmoothL1LossBackward0", "smooth_l1_loss", "smooth L1 against a target shaped as the output"),
    ("HuberLossBackward0", "huber_loss", "Huber against a target shaped as the output"),
    ("BinaryCrossEntropyWithLogitsBackward0", "binary_cross_entropy_with_logits",
     "binary cross-entropy with logits against a target shaped as the output"),
)


def loss_of(loss_ops) -> tuple:
    """(loss function of the model's output, what it is) for the plan's backward, from ``loss_ops``: the
    names of the autograd nodes the script's loss made after the model's output (None: not seen; []: the
    backward started from the model's output itself: the model's own loss, a transformers model given
    ``labels``). A loss it does not recognise: the mean of the output (a stand-in, said so)."""
    import torch
    import torch.nn.functional as F

    def mean(out):
        return _first_float(out).float().mean()

    if loss_ops is None:
        return mean, ("the mean of the model's first floating output (a stand-in: no backward of the script was "
                      "seen before the plan, so its loss is not known)")
    if not loss_ops:
        return mean, "the model's own loss (the backward started from its output's first floating tensor)"
    for node, name, what in LOSSES:
        if node not in loss_ops:
            continue
        if name == "cross_entropy":
            nll = "LogSoftmaxBackward0" not in loss_ops  # the model's output is log-probabilities already
            fn = F.nll_loss if nll else F.cross_entropy

            def ce(out, fn=fn):
                x = _first_float(out)
                x = x.reshape(-1, x.shape[-1])
                return fn(x, torch.zeros(x.shape[0], dtype=torch.long, device=x.device))
            return ce, f"the script's {'nll_loss' if nll else name} (recognised from its autograd nodes: " \
                       f"{', '.join(loss_ops)}), replayed: {'NLL' if nll else what}"

        def elementwise(out, fn=getattr(F, name)):
            x = _first_float(out)
            return fn(x, torch.zeros_like(x))
        return elementwise, f"the script's {name} (recognised from its autograd nodes: {', '.join(loss_ops)}), " \
                            f"replayed: {what}"
    return mean, (f"the mean of the model's first floating output (a stand-in: the script's loss, autograd nodes "
                  f"{', '.join(loss_ops)} after the model, is not one the plan replays)")


def _storage_bytes(tensors) -> int:
    seen, n = set(), 0
    for t in tensors:
        try:
            st = t.untyped_storage()
            key = (st.data_ptr(), t.device)
            if key in seen:
                continue
            seen.add(key)
            n += int(st.nbytes())
        except Exception:  # a tensor without storage (a sparse one): not counted
            continue
    return n


def held_bytes(model, opt, input_bytes: int) -> dict:
    """What the script's tensors hold at this boundary, read from the real objects (their storages, each
    once): parameters and buffers, gradients, the optimizer's state, and the last batch (its shapes)."""
    import torch

    params = list(model.parameters()) + list(model.buffers())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {"parameters": _storage_bytes(params), "gradients": _storage_bytes(grads),
            "optimizer state": _storage_bytes(state), "inputs": int(input_bytes)}


def _script_dtype(model, autocast) -> str:
    import torch

    floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
    pdt = floats[0] if floats else torch.float32
    if autocast and pdt == torch.float32:
        return {"torch.bfloat16": "amp_bf16", "torch.float16": "amp_fp16"}.get(str(autocast), "fp32")
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(pdt, "fp32")


def _target(spec: dict, model):
    import torch

    from diagnostics.analyses.plan.targets import resolve

    if spec.get("device"):
        return resolve(spec["device"])
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return resolve("local", gpus=[{"name": props.name, "memory_total_bytes": int(props.total_memory)}])
    try:
        import os

        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = 0
    return resolve("cpu", cpu={"ram_available_bytes": int(avail)})


def _optimizer_factory(opt):
    """The script's optimizer class with its own defaults, over the fake copy's parameters."""
    cls, defaults = type(opt), dict(opt.defaults)

    def make(model):
        return cls([p for p in model.parameters() if p.requires_grad], **defaults)
    return make


#: The script's optimizer, by class, as the planner names it (measure/optimizers.ALL_OPTIMIZERS).
def optimizer_name(opt) -> str:
    """The planner's name for the script's optimizer (its state per parameter is what the plan counts);
    OptionError naming it when the planner does not model it."""
    name, d = type(opt).__name__, dict(getattr(opt, "defaults", {}) or {})
    if name == "SGD":
        return "sgd" if d.get("momentum") else "sgd_nomomentum"
    if name in ("Adam", "AdamW") and not d.get("amsgrad"):
        return "adamw_fused" if name == "AdamW" and d.get("fused") else name.lower()
    if name == "Adafactor":
        return "adafactor"
    raise OptionError(f"the planner models SGD, Adam, AdamW (without amsgrad) and Adafactor; the script's {name}"
                      + (" with amsgrad" if d.get("amsgrad") else "") + " is not one of them")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def process_memory_limit() -> tuple[int, str]:
    """(bytes, which) the memory this process may use: the least of the machine's MemTotal, its cgroup's
    memory limit (v2 memory.max, v1 memory.limit_in_bytes) and its RLIMIT_AS (an address-space limit:
    torch's libraries count in it too). OptionError when none can be read."""
    import resource

    found: list[tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    found.append((int(line.split()[1]) * 1024, "MemTotal (/proc/meminfo): the machine's memory"))
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and controllers == "":
            for where in (f"/sys/fs/cgroup{path.rstrip('/')}/memory.max", "/sys/fs/cgroup/memory.max"):
                n = _read_int(where)
                if n is not None:
                    found.append((n, f"the cgroup's memory limit ({where})"))
                    break
        elif "memory" in controllers.split(","):
            where = f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.limit_in_bytes"
            n = _read_int(where)
            if n is not None and n < 1 << 60:  # v1 writes a huge number for "no limit"
                found.append((n, f"the cgroup's memory limit ({where})"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft > 0:
        found.append((int(soft), "RLIMIT_AS: the process' address-space limit (torch's libraries count in it)"))
    if not found:
        raise OptionError("the memory this process may use could not be read (no /proc/meminfo, cgroup limit or "
                          "RLIMIT_AS)")
    return min(found)


def _loaded(model, inputs: list, loss_ops=None):
    """What the planner reads of a model (an uploaded one's LoadedModel), for the script's module and the
    tensors of its last training forward ([(shape, dtype name)] positional, then [(shape, dtype name, keyword)]):
    (loaded, specs, batch, what the loss is)."""
    from diagnostics.inputs import DTYPES as INPUT_DTYPES
    from diagnostics.spec import InputSpec

    specs = []
    for shape, dtype, *name in inputs:
        if dtype not in INPUT_DTYPES:
            raise OptionError(f"the model's input {name[0] + ' ' if name and name[0] else ''}of dtype {dtype} "
                              f"cannot be planned (inputs of {', '.join(INPUT_DTYPES)} can)")
        specs.append(InputSpec(tuple(shape), dtype, name=name[0] if name else None))
    if not specs or not specs[0].shape:
        raise OptionError("the model's training forward took no batched tensor (positional or keyword): its "
                          "batch is not known")

    class Loaded:  # what trace() reads of an uploaded model
        pass

    loss_fn, loss = loss_of(loss_ops)
    loaded = Loaded()
    loaded.model, loaded.input_specs, loaded.loss_fn = model, tuple(specs), loss_fn
    loaded.batch_size = specs[0].shape[0]
    loaded.meta, loaded.num_classes, loaded.task, loaded.spec = "", None, None, None
    return loaded, specs, specs[0].shape[0], loss


def _label(spec, k: int) -> str:
    """An input's name in the plan: its keyword, or input1, input2 ... for positional ones."""
    return spec.name or f"input{k + 1}"


def described(specs) -> list[str]:
    return [f"{s.name + ' ' if s.name else ''}{list(s.shape)} {s.dtype}" for s in specs]


def with_seq(specs, size: tuple, seq_input: str = "") -> tuple:
    """``specs`` with ``size`` (('x', 2.0): each varied input's own length times 2; ('n', 1024): that length) as
    the length (dimension 1) of the input ``seq_input`` names, or of every token input (an integer tensor with a
    second dimension: token ids, their attention mask) when none is named; each other input keeps its own.
    OptionError naming the inputs when none has such a length."""
    from dataclasses import replace

    kind, n = size
    names = [_label(s, k) for k, s in enumerate(specs)]
    if seq_input:
        varied = [name == seq_input and len(s.shape) >= 2 for s, name in zip(specs, names)]
        if not any(varied):
            raise OptionError(f"seq={seq_input}=: {seq_input} is not an input with a length (a second dimension); "
                              f"the model's inputs: " + ", ".join(f"{name} {list(s.shape)} {s.dtype}"
                                                                  for s, name in zip(specs, names)))
    else:
        varied = [s.dtype in ("int64", "int32") and len(s.shape) >= 2 for s in specs]
        if not any(varied):
            raise OptionError("seq=: the model takes no token input (an integer tensor with a second dimension); its "
                              "inputs: " + ", ".join(f"{name} {list(s.shape)} {s.dtype}" for s, name in
                                                     zip(specs, names)) + "; name one: seq=NAME=2x")
    return tuple(replace(s, shape=(s.shape[0], max(1, round(s.shape[1] * n)) if kind == "x" else int(n))
                         + s.shape[2:]) if v else s for s, v in zip(specs, varied))


def _cuda_capacity(model):
    """(Target, what it is) of the GPU the model is on: its total_memory less the CUDA context, or, where the
    process capped its allocator (torch.cuda.set_per_process_memory_fraction), that share of it (the context
    sits outside the cap)."""
    import msgspec
    import torch

    from diagnostics.analyses.plan.targets import resolve

    dev = next((p.device for p in model.parameters() if p.device.type == "cuda"),
               torch.device("cuda", torch.cuda.current_device()))
    props = torch.cuda.get_device_properties(dev)
    target = resolve("local", gpus=[{"name": props.name, "memory_total_bytes": int(props.total_memory)}])
    source = f"{props.name}: total_memory {int(props.total_memory)} bytes (torch.cuda.get_device_properties)"
    try:
        fraction = float(torch.cuda.get_per_process_memory_fraction(dev))
    except (AttributeError, RuntimeError, TypeError):
        fraction = 1.0
    if fraction < 1.0:
        target = msgspec.structs.replace(target, capacity_bytes=int(props.total_memory * fraction), context_bytes=0)
        return target, source + f" x the process' memory fraction {fraction:g} (set_per_process_memory_fraction)"
    return target, source + (f" less the CUDA context ({int(target.context_bytes)} bytes)" if target.context_bytes
                              else "")


def fit_in_process(model, opt, inputs: list, autocast, device_type: str, loss_ops=None) -> dict:
    """The budget answer for the script's step (``model`` trained by ``opt`` on ``inputs``: [(shape, dtype
    name)], under ``autocast``) against the capacity of the device it ran out of (``device_type``: "cuda" or
    "cpu"): plain data, the Fit's fields and where the budget comes from. OptionError / TorchScopeError say
    why it cannot be made."""
    import time

    import msgspec
    import torch

    from diagnostics.analyses.plan.configs import Config, Setting
    from diagnostics.analyses.plan.fit import fit_budget
    from diagnostics.analyses.plan.planner import Planner
    from diagnostics.analyses.plan.targets import Target

    t0 = time.perf_counter()
    name = optimizer_name(opt)
    loaded, specs, batch, loss = _loaded(model, inputs, loss_ops)
    if device_type == "cuda":
        target, source = _cuda_capacity(model)
    else:
        cap, source = process_memory_limit()
        target = Target("cpu", "cpu", cap, 1, source)
    planner = Planner(loaded, target)
    planner.scratch = None  # nothing real is allocated in a process that just ran out of memory
    own = _script_dtype(model, autocast)
    config = Config(batch=batch, seq=None, setting=Setting(dtype=own, optimizer=name))
    notes: list[str] = []
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        fit = fit_budget(planner, config, int(target.budget_bytes), notes,
                         not_timed="the process had just run out of memory: its model is not run again")
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return {"device": target.name, "device_kind": target.kind, "budget_source": source,
            "optimizer": name, "inputs": described(specs), "loss": loss,
            "fit": msgspec.to_builtins(fit), "notes": notes + ["kernel scratch (oneDNN reorders, batch norm's and "
                                                              "cuDNN's buffers) is not counted"],
            "seconds": time.perf_counter() - t0}


def _scale(label_kind, n) -> str:
    return f"{n:g}x" if label_kind == "x" else str(n)


def plan_in_process(model, opt, inputs: list, spec_text: str, autocast=None, loss_ops=None) -> dict:
    """The plan's rows for the script's own job. ``inputs``: [(shape, dtype name)] of the main module's
    positional tensors in its last training forward, then [(shape, dtype name, keyword)] of its keyword ones;
    ``autocast``: the autocast dtype it ran under (None: none); ``loss_ops``: the autograd nodes the script's
    loss made after the model's output (loss_of). Returns plain data (see the module doc); a row that cannot
    be planned says why in ``error``."""
    import dataclasses
    import time

    import torch

    from diagnostics.analyses.plan.configs import Config, Setting
    from diagnostics.analyses.plan.planner import Planner
    from diagnostics.analyses.plan.shard import trace_sharded
    from diagnostics.analyses.plan.trace import TraceFailure, trace_with_optimizer
    from diagnostics.errors import TorchScopeError
    from diagnostics.inputs import DTYPES as INPUT_DTYPES

    t0 = time.perf_counter()
    spec = parse_spec(spec_text)
    loaded, specs, batch, loss = _loaded(model, inputs, loss_ops)
    input_bytes = sum(int(torch.Size(s.shape).numel()) * INPUT_DTYPES[s.dtype].itemsize for s in specs)
    target = _target(spec, model)
    own = _script_dtype(model, autocast)
    sizes = [("1x", batch)] + [(_scale(kind, n), max(1, round(batch * n)) if kind == "x" else n)
                               for kind, n in spec["batch"]]
    seqs = [("", None)] + [(_scale(kind, n), (kind, n)) for kind, n in spec["seq"]]
    dtypes = [own] + [d for d in spec["dtype"] if d != own]
    planner = Planner(loaded, target)  # its fake mode, and what the sharded trace reads
    planner.scratch = None
    make_opt = _optimizer_factory(opt)
    if spec["probe"]:
        from diagnostics.analyses.plan.scratch import Scratch
        from diagnostics.analyses.plan.trace import trace_device

        device = trace_device(target)
        # as the planner does: kernels' scratch is probed on this machine's device only when it is the one planned
        if device == ("cuda" if target.kind == "cuda" else "cpu"):
            planner.scratch = Scratch(device)
    configs = [(d, q, z, "") for d in dtypes for q in seqs for z in sizes]
    if spec["shard"]:
        try:  # the setting's label (the step runs the script's own class and settings)
            name = optimizer_name(opt)
        except OptionError:
            name = type(opt).__name__
        configs += [(own, ("", None), z, s) for s in spec["shard"] for z in sizes]
    rows = []
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        for dtype, (seq_label, seq), (label, b), shard in configs:
            row = {"scale": label, "batch": b, "dtype": dtype, "seq": seq_label,
                   "as_run": label == "1x" and dtype == own and not seq_label and not shard}
            if shard:
                row.update(shard=shard, ranks=spec["ranks"])
            try:
                loaded.input_specs = tuple(specs) if seq is None else with_seq(specs, seq, spec["seq_input"])
                if seq is not None:
                    row["inputs"] = described(loaded.input_specs)
                if shard:
                    config = Config(batch=b, seq=None, setting=Setting(dtype=dtype, optimizer=name, shard=shard,
                                                                       ranks=spec["ranks"]))
                    st = trace_sharded(planner, config, optimizer=(type(opt), dict(opt.defaults)))
                    row["per_rank"] = {str(r): int(v) for r, v in st.per_rank.items()}
                else:
                    config = Config(batch=b, seq=None, setting=Setting(dtype=dtype))
                    st = trace_with_optimizer(loaded, config, target, planner.fake, make_opt, scratch=planner.scratch)
                peak, parts = planner.device_peak(st)
                row.update(peak_bytes=peak, parts=parts, phase=st.phase, module=st.module,
                           fits=peak <= target.budget_bytes, parameter_bytes=int(st.param_bytes),
                           gradient_bytes=int(st.grad_bytes), state_bytes=int(st.state_bytes))
            except (TraceFailure, TorchScopeError, OptionError, RuntimeError, TypeError, ValueError) as e:
                row.update(error=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
            rows.append(row)
    finally:
        loaded.input_specs = tuple(specs)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    notes = ["kernel scratch (oneDNN reorders, batch norm's and cuDNN's buffers) measured by running those ops once "
             "on real tensors of the traced shapes (probe=yes)"] if planner.scratch is not None else \
        ["kernel scratch is not counted (nothing is allocated): convolutions, batch norm and LSTMs allocate buffers "
         "of their own; probe=yes measures them"]
    if spec["shard"]:
        notes.append(f"sharded rows: the script's batch per rank, {spec['ranks']} ranks traced in a fake process "
                     "group in this process (no communication), the script's optimizer class; the larger of the first "
                     "and the last rank's peaks")
    return {"spec": spec_text or "", "device": target.name, "device_kind": target.kind,
            "budget_bytes": int(target.budget_bytes), "optimizer": type(opt).__name__, "dtype": own,
            "inputs": described(specs), "batch": batch, "loss": loss,
            "held_bytes": held_bytes(model, opt, input_bytes), "rows": rows, "notes": notes,
            "seconds": time.perf_counter() - t0}
