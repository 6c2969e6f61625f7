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

#: Keys ``--plan`` takes, and those the issue names that are not planned for an attached run yet.
SPEC_KEYS = ("batch", "dtype", "device", "probe")
NOT_YET = ("seq", "shard", "ranks")


def parse_spec(text: str | None) -> dict:
    """'batch=2x,4x;dtype=bf16;device=H100-80GB' -> {'batch': [('x', 2), ('x', 4)], 'dtype': ['bf16'],
    'device': 'H100-80GB', 'probe': False}. A batch is a multiple of the script's own (``2x``) or a number
    (``64``). ``probe=yes``: kernel scratch measured by running those ops once on real tensors (scratch.py;
    the one thing the plan then allocates, bounded by its probe limit). '' or None: the script's own
    configuration alone. OptionError naming the part that is wrong."""
    out: dict = {"batch": [], "dtype": [], "device": "", "probe": False}
    for part in (text or "").replace(" ", "").split(";"):
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq or not value:
            raise OptionError(f"--plan: {part!r} is not KEY=VALUE (e.g. batch=2x,4x;dtype=bf16;device=H100-80GB)")
        if key in NOT_YET:
            raise OptionError(f"--plan: {key}= is not planned for an attached run yet (only {', '.join(SPEC_KEYS)}); "
                              "plan the model with `plan --model FILE` for sequence lengths and sharding")
        if key not in SPEC_KEYS:
            raise OptionError(f"--plan: unknown key {key!r}; the keys: {', '.join(SPEC_KEYS)}")
        if key == "batch":
            for b in value.split(","):
                mult = b.lower().endswith("x")
                num = b[:-1] if mult else b
                try:
                    n = float(num) if mult else int(num)
                except ValueError:
                    n = 0
                if not n or n <= 0:
                    raise OptionError(f"--plan: batch {b!r} is neither a multiple of the script's batch (2x, 0.5x) "
                                      "nor a whole number of samples")
                out["batch"].append(("x", n) if mult else ("n", n))
        elif key == "probe":
            if value not in ("yes", "no"):
                raise OptionError(f"--plan: probe={value!r}: yes (measure kernel scratch on real tensors) or no")
            out["probe"] = value == "yes"
        elif key == "dtype":
            for d in value.split(","):
                if d not in DTYPES:
                    raise OptionError(f"--plan: dtype {d!r} is not one of {', '.join(DTYPES)}")
                out["dtype"].append(d)
        else:
            from diagnostics.analyses.plan.targets import check_name

            check_name(value)
            out["device"] = value
    return out


# ----------------------------------------------------------------------------- inside the script's process
def _loss(out):
    """A scalar from the model's output: the mean of its first floating tensor. The script's own loss
    (a cross-entropy's log-softmax, say) is not replayed: it is computed outside the model."""
    import torch

    seen = [out]
    while seen:
        x = seen.pop(0)
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.float().mean()
        if isinstance(x, dict):
            seen.extend(x.values())
        elif isinstance(x, (list, tuple)):
            seen.extend(x)
    raise OptionError("the model's output holds no floating-point tensor to make a loss from")


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


def _loaded(model, inputs: list):
    """What the planner reads of a model (an uploaded one's LoadedModel), for the script's module and the
    shapes of its last training forward: (loaded, specs, batch)."""
    import torch

    from diagnostics.inputs import DTYPES as INPUT_DTYPES
    from diagnostics.spec import InputSpec

    specs = []
    for shape, dtype in inputs:
        if dtype not in INPUT_DTYPES:
            raise OptionError(f"the model's input of dtype {dtype} cannot be planned (inputs of "
                              f"{', '.join(INPUT_DTYPES)} can)")
        specs.append(InputSpec(tuple(shape), dtype))
    if not specs or not specs[0].shape:
        raise OptionError("the model's training forward took no batched tensor as a positional argument: "
                          "its batch is not known")

    class Loaded:  # what trace() reads of an uploaded model
        pass

    loaded = Loaded()
    loaded.model, loaded.input_specs, loaded.loss_fn, loaded.batch_size = model, tuple(specs), _loss, specs[0].shape[0]
    loaded.meta, loaded.num_classes, loaded.task, loaded.spec = "", None, None, None
    return loaded, specs, specs[0].shape[0]


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


def fit_in_process(model, opt, inputs: list, autocast, device_type: str) -> dict:
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
    loaded, specs, batch = _loaded(model, inputs)
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
            "optimizer": name, "inputs": [f"{list(s.shape)} {s.dtype}" for s in specs],
            "fit": msgspec.to_builtins(fit), "notes": notes + ["kernel scratch (oneDNN reorders, batch norm's and "
                                                              "cuDNN's buffers) is not counted"],
            "seconds": time.perf_counter() - t0}


def plan_in_process(model, opt, inputs: list, spec_text: str, autocast=None) -> dict:
    """The plan's rows for the script's own job. ``inputs``: [(shape, dtype name)] of the main module's
    positional tensors in its last training forward; ``autocast``: the autocast dtype it ran under (None:
    none). Returns plain data (see the module doc); a row that cannot be planned says why in ``error``."""
    import time

    import torch

    from diagnostics.analyses.plan.configs import Config, Setting
    from diagnostics.analyses.plan.planner import fake_mode
    from diagnostics.analyses.plan.trace import TraceFailure, trace_with_optimizer
    from diagnostics.inputs import DTYPES as INPUT_DTYPES

    t0 = time.perf_counter()
    spec = parse_spec(spec_text)
    loaded, specs, batch = _loaded(model, inputs)
    input_bytes = sum(int(torch.Size(s.shape).numel()) * INPUT_DTYPES[s.dtype].itemsize for s in specs)
    target = _target(spec, model)
    own = _script_dtype(model, autocast)
    sizes = [("1x", batch)] + [(f"{n:g}x" if kind == "x" else str(n), max(1, round(batch * n)) if kind == "x" else n)
                               for kind, n in spec["batch"]]
    dtypes = [own] + [d for d in spec["dtype"] if d != own]
    fake = fake_mode()
    make_opt = _optimizer_factory(opt)
    scratch = None
    if spec["probe"]:
        from diagnostics.analyses.plan.scratch import Scratch
        from diagnostics.analyses.plan.trace import trace_device

        device = trace_device(target)
        # as the planner does: kernels' scratch is probed on this machine's device only when it is the one planned
        if device == ("cuda" if target.kind == "cuda" else "cpu"):
            scratch = Scratch(device)
    rows = []
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        for dtype in dtypes:
            for label, b in sizes:
                config = Config(batch=b, seq=None, setting=Setting(dtype=dtype))
                row = {"scale": label, "batch": b, "dtype": dtype, "as_run": label == "1x" and dtype == own}
                try:
                    st = trace_with_optimizer(loaded, config, target, fake, make_opt, scratch=scratch)
                    extra = int(target.workspace_bytes) if target.kind == "cuda" and not st.on_device else 0
                    peak = int(st.peak_bytes) + extra
                    row.update(peak_bytes=peak, parts={k: int(v) for k, v in st.parts.items()}, phase=st.phase,
                               module=st.module, fits=peak <= target.budget_bytes)
                except (TraceFailure, OptionError, RuntimeError, TypeError, ValueError) as e:
                    row.update(error=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
                rows.append(row)
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return {"spec": spec_text or "", "device": target.name, "device_kind": target.kind,
            "budget_bytes": int(target.budget_bytes), "optimizer": type(opt).__name__, "dtype": own,
            "inputs": [f"{list(s.shape)} {s.dtype}" for s in specs], "batch": batch,
            "held_bytes": held_bytes(model, opt, input_bytes), "rows": rows,
            "notes": ["kernel scratch (oneDNN reorders, batch norm's and cuDNN's buffers) measured by running those "
                      "ops once on real tensors of the traced shapes (probe=yes)"] if scratch is not None else
                     ["kernel scratch is not counted (nothing is allocated): convolutions, batch norm and LSTMs "
                      "allocate buffers of their own; probe=yes measures them"],
            "seconds": time.perf_counter() - t0}
