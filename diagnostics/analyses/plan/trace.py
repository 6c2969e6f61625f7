"""One configuration of a model run on fake tensors, its memory accounted by a Ledger: nothing allocated.

``trace(loaded, config, target, fake)`` builds a throw-away copy of the model whose parameters are
fake tensors (FakeTensorMode: shapes, dtypes and devices, no data) in the configuration's dtype, with
its activation checkpointing, and runs what the configuration asks for under a Ledger:

* training: the optimizer's state is created first (one step on zero gradients, outside the
  ledger: the step measured is a steady-state one, as the Memory analysis measures its second
  step), gradients start as None, then forward + loss, backward, optimizer step;
* inference: eval mode, no autograd; a decoder with a KV cache runs the prompt (prefill) then one
  generated token, the cache in it.

The copy is made on the meta device (``skeleton``), so neither the user's model nor its weights are
touched. Where fake tracing fails inside a module (data-dependent ops, ops without a fake kernel),
``TraceFailure`` names the module; analytic.py stands in for it on the next attempt.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from diagnostics.analyses.plan.configs import DTYPES, PARAM_BYTES, Config
from diagnostics.analyses.plan.ledger import LOSS, ROOT, Ledger
from diagnostics.analyses.plan.targets import Target
from diagnostics.errors import TorchScopeError
from diagnostics.inputs import DTYPES as INPUT_DTYPES
from diagnostics.inputs import Inputs, with_batch, with_names
from diagnostics.measure.checkpoint import blocks_of, select_blocks  # noqa: F401 (the plan's names for them)
from diagnostics.measure.checkpoint import checkpointing as _checkpointing
from diagnostics.measure.training import make_optimizer

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LR = 1e-3
TRACE_DEVICE_ENV = "TORCHSCOPE_PLAN_TRACE_DEVICE"


class TraceFailure(TorchScopeError):
    """Fake tracing failed; ``module`` is where (the innermost module running), ``cause`` the exception."""

    def __init__(self, module: str, phase: str, cause: BaseException):
        self.module, self.phase, self.cause = module, phase, cause
        super().__init__(f"tracing on fake tensors failed in {module} during {phase}: "
                         f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")


@dataclass
class StepTrace:
    """What one traced configuration needs (plain data)."""

    peak_bytes: int
    parts: dict
    phase: str
    module: str
    phase_peaks: dict
    saved_bytes: int
    saved_by_module: dict
    param_bytes: int
    grad_bytes: int
    state_bytes: int
    input_bytes: int
    ops: int
    seconds: float
    timeline: dict | None = None
    host_bytes: int = 0
    notes: list = field(default_factory=list)
    per_rank: dict = field(default_factory=dict)  # rank -> peak bytes (sharded configurations)
    #: the peak is the CUDA caching allocator's (replayed: blocks, workspaces, kernels' scratch), not the
    #: sum of the tensors; planner.device_peak then adds nothing
    on_device: bool = False

    def saved_in(self, module: str) -> int:
        """Bytes saved for backward while ``module`` or one of its submodules was running (each storage once)."""
        return sum(v for k, v in self.saved_by_module.items() if k == module or k.startswith(module + "."))

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- the model's copy
def names_of(model: nn.Module) -> dict:
    """module -> qualified name (the root: '(model)')."""
    return {m: (n or ROOT) for n, m in model.named_modules(remove_duplicate=False)}


def skeleton(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every parameter and buffer on the meta device (no memory): the user's
    model is left as it is, tied weights stay tied (one object in the copy too)."""
    if isinstance(model, torch.jit.ScriptModule):
        raise TorchScopeError("the memory plan runs a model's Python modules on fake tensors, which a TorchScript "
                              "archive does not have: upload the model as a torch.export archive (.pt2) or a Python "
                              "file with build_model() to plan it")
    memo = {}
    for m in model.modules():
        for held in (m._parameters, m._buffers):
            for t in held.values():
                if isinstance(t, torch.Tensor) and id(t) not in memo:
                    meta = torch.empty_like(t, device="meta")
                    memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) \
                        else meta
    return copy.deepcopy(model, memo)


def fakeify(model: nn.Module, fake, device: str, param_dtype: torch.dtype | None, buffers_too: bool) -> None:
    """Replace every parameter (and buffer) of ``model`` (a skeleton) by a fake tensor on ``device``,
    floating ones in ``param_dtype`` (buffers too when ``buffers_too``: a model cast with .to(dtype))."""
    done: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for kind, held in (("param", m._parameters), ("buffer", m._buffers)):
            for k, t in list(held.items()):
                if not isinstance(t, torch.Tensor):
                    continue
                if id(t) not in done:
                    dt = t.dtype
                    if param_dtype is not None and t.is_floating_point() and (kind == "param" or buffers_too):
                        dt = param_dtype
                    with fake:
                        f = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=dt, device=device)
                    done[id(t)] = nn.Parameter(f, requires_grad=t.requires_grad) if kind == "param" else f
                held[k] = done[id(t)]


def checkpointed_names(model: nn.Module, setting, patterns: str = "") -> list[str]:
    if setting.checkpointing == "none":
        return []
    if setting.checkpointing == "blocks":
        found = blocks_of(model)
        if not found:
            raise TorchScopeError("checkpointing 'blocks': the model has no repeated blocks (children of a "
                                  "ModuleList or Sequential sharing a class); name modules with 'selected'")
        return found
    return select_blocks(model, patterns)


@contextmanager
def checkpointing(model: nn.Module, names: list[str], ledger: Ledger | None = None):
    """measure.checkpoint.checkpointing, the ledger told what each checkpointed call keeps (its inputs)."""
    with _checkpointing(model, names, ledger.keep_for_recompute if ledger is not None else None):
        yield


# ----------------------------------------------------------------------------- inputs
def is_token_input(spec) -> bool:
    return spec.dtype in ("int64", "int32") and spec.high is not None and len(spec.shape) >= 2


def takes_tokens(specs) -> bool:
    return any(is_token_input(s) for s in specs)


def specs_at(specs, batch: int, seq: int | None, seq_input: str = ""):
    """The input specs at ``batch``, with ``seq`` (None: every input as declared) as the length (dimension 1)
    of the input named ``seq_input``, or of every token input when none is named: each other input keeps
    its own length (a speech model's audio samples are not its decoder's tokens)."""
    from dataclasses import replace

    out = with_batch(specs, batch)
    if seq is None:
        return out

    def varied(s) -> bool:
        return s.name == seq_input and len(s.shape) >= 2 if seq_input else is_token_input(s)

    return tuple(replace(s, shape=(s.shape[0], int(seq)) + s.shape[2:]) if varied(s) else s for s in out)


def fake_inputs(specs, fake, device: str, float_dtype: torch.dtype | None) -> Inputs:
    """Fake tensors shaped as ``specs``; float inputs in ``float_dtype`` (a model cast to bf16 takes bf16)."""
    out = []
    with fake:
        for s in specs:
            dt = INPUT_DTYPES[s.dtype]
            if dt.is_floating_point and float_dtype is not None:
                dt = float_dtype
            out.append(torch.empty(s.shape, dtype=dt, device=device))
    return with_names(out, specs)


def inputs_for(loaded, config: Config, fake, device: str) -> Inputs:
    """The configuration's fake inputs: float ones in the parameters' dtype for a model cast to bf16 / fp16."""
    d = DTYPES[config.setting.dtype]
    pdt = TORCH_DTYPES[d.param]
    float_in = pdt if d.autocast is None and pdt != torch.float32 else None
    return fake_inputs(specs_at(loaded.input_specs, config.batch, config.seq, config.setting.seq_input), fake,
                       device, float_in)


# ----------------------------------------------------------------------------- running it
def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0]


def _autocast(config: Config, device: str):
    d = DTYPES[config.setting.dtype]
    if d.autocast in ("bfloat16", "float16"):
        return torch.autocast(device_type=device, dtype=TORCH_DTYPES[d.autocast])
    return nullcontext()


def _optimizer(model: nn.Module, config: Config, target: Target):
    # On CUDA torch's optimizers default to their foreach implementation (a list of whole-model
    # temporaries per step), on the CPU to a loop over parameters: plan as the target device would run.
    foreach = True if target.kind == "cuda" and config.setting.optimizer != "adamw_fused" else None
    return make_optimizer(model.parameters(), config.setting.optimizer, LR, foreach=foreach)


def _init_state(model: nn.Module, opt, fake) -> None:
    """Create the optimizer's lazily made state: one step on zero gradients, then gradients set to None."""
    from diagnostics.analyses.plan.ledger import ScalarsAnswered

    with fake:
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        with ScalarsAnswered():
            opt.step()
        opt.zero_grad(set_to_none=True)


def _state_tensors(opt):
    return [v for s in getattr(opt, "optim", opt).state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def _bytes(ts) -> int:
    seen, n = set(), 0
    for t in ts:
        for st in _storage_list(t):
            if id(st) not in seen:
                seen.add(id(st))
                n += int(st.nbytes())
    return n


def _storage_list(t):
    from diagnostics.analyses.plan.ledger import _storages

    return _storages(t)


def trace_device(target: Target) -> str:
    """The device the fake tensors claim. Fake CUDA tensors need a torch built with CUDA and a GPU (on a
    CPU-only build an op on one aborts the process), so elsewhere a CUDA target is traced on fake CPU
    tensors with CUDA's rounding and optimizer defaults. $TORCHSCOPE_PLAN_TRACE_DEVICE=cpu forces the
    latter on a GPU machine too (bench/gpu/plan_cuda.py compares the two)."""
    if os.environ.get(TRACE_DEVICE_ENV, "").strip().lower() == "cpu":
        return "cpu"
    if target.kind == "cuda" and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def prepare(loaded, config: Config, target: Target, fake, *, checkpoint_patterns: str = "",
            standins: dict | None = None):
    """The fake copy of the model for ``config``: (model, device, names to checkpoint)."""
    device = trace_device(target)
    d = DTYPES[config.setting.dtype]
    model = skeleton(loaded.model)
    pdt = TORCH_DTYPES[d.param]
    fakeify(model, fake, device, None if pdt == torch.float32 else pdt, buffers_too=d.autocast is None)
    if d.name == "fp8":
        from diagnostics.analyses.plan.analytic import to_float8

        to_float8(model)
    if standins:
        from diagnostics.analyses.plan.analytic import model_output, stand_in

        mods = dict(model.named_modules())
        for name, how in standins.items():
            if name == ROOT:
                stand_in(model, how, output=model_output(loaded, model))
            else:
                stand_in(mods[name], how)
    names = checkpointed_names(model, config.setting, checkpoint_patterns)
    return model, device, names


@contextmanager
def eager_transformers():
    """transformers takes fake tensors for a compiler's tracing: it then skips its check for packed
    sequences (several sequences in one row) and builds an explicit attention mask, where on real
    tensors it finds none and lets attention run causal without a mask (no batch x seq x seq mask, and
    the fused kernels). Our inputs are plain rows of tokens, never packed: during a trace that check
    answers as it does on them."""
    mu = sys.modules.get("transformers.masking_utils")
    orig = getattr(mu, "find_packed_sequence_indices", None)
    if orig is None:
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensor

    def unpacked(position_ids, *args, **kwargs):
        if isinstance(position_ids, FakeTensor):
            return None
        return orig(position_ids, *args, **kwargs)

    mu.find_packed_sequence_indices = unpacked
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = orig


def trace(loaded, config: Config, target: Target, fake, *, timeline: bool = False, checkpoint_patterns: str = "",
          standins: dict | None = None, scratch=None) -> StepTrace:
    """Predict one configuration (see the module doc). ``scratch``: a scratch.Scratch that probes the
    kernels' own buffers (None: not counted). Raises TraceFailure naming the module on failure."""
    with eager_transformers():
        return _trace(loaded, config, target, fake, timeline=timeline, checkpoint_patterns=checkpoint_patterns,
                      standins=standins, scratch=scratch)


def _trace(loaded, config, target, fake, *, timeline, checkpoint_patterns, standins, scratch) -> StepTrace:
    t0 = time.perf_counter()
    model, device, ck = prepare(loaded, config, target, fake, checkpoint_patterns=checkpoint_patterns,
                                standins=standins)
    inputs = inputs_for(loaded, config, fake, device)
    kernels = cuda_kernels(target, device)
    ledger = Ledger(target.rounding, names_of(model), timeline=timeline, scratch=scratch, cuda=kernels)
    with _as_on_cuda(kernels):
        if config.setting.mode == "inference":
            st = _trace_inference(loaded, model, inputs, config, ledger, fake, device, t0)
        else:
            st = train_step(loaded, model, inputs, config, target, ledger, fake, device, ck, t0)
    if kernels is not None:
        on_device(st, ledger, lazy_state=config.setting.mode == "train")
        if kernels.attention:
            st.notes.append("attention traced with the kernels CUDA picks on this GPU: " + ", ".join(
                f"{n} ({k} call{'s' if k > 1 else ''})" for n, k in sorted(kernels.attention.items())))
    return st


def trace_with_optimizer(loaded, config: Config, target: Target, fake, make_optimizer_for, scratch=None) -> StepTrace:
    """A training step as ``trace`` runs it, with the optimizer ``make_optimizer_for(fake_model)`` builds
    (an attached script's own class and settings: analyses/plan/attached.py) in place of the
    configuration's named one; ``scratch`` as for ``trace``. Raises TraceFailure naming the module on failure."""
    with eager_transformers():
        t0 = time.perf_counter()
        model, device, ck = prepare(loaded, config, target, fake)
        inputs = inputs_for(loaded, config, fake, device)
        kernels = cuda_kernels(target, device)
        ledger = Ledger(target.rounding, names_of(model), scratch=scratch, cuda=kernels)
        with _as_on_cuda(kernels):
            st = train_step(loaded, model, inputs, config, target, ledger, fake, device, ck, t0,
                            opt=make_optimizer_for(model))
        if kernels is not None:
            on_device(st, ledger)
        return st


def _as_on_cuda(kernels):
    """A CPU trace for a CUDA target runs attention and dropout with CUDA's kernels (cuda_kernels.cuda_choices)."""
    if kernels is None or not kernels.cpu_trace:
        return nullcontext()
    from diagnostics.analyses.plan.cuda_kernels import cuda_choices

    return cuda_choices(kernels)


def cuda_kernels(target: Target, device: str):
    """For a CUDA target, the ledger's CUDA rules (cuda_kernels.CudaKernels); None otherwise."""
    if target.kind != "cuda":
        return None
    from diagnostics.analyses.plan.cuda_kernels import CudaKernels, arch_of

    return CudaKernels(arch_of(target), cpu_trace=device == "cpu")


def on_device(st: StepTrace, ledger: Ledger, lazy_state: bool = True) -> None:
    """Turn ``st``'s peak (the tensors, 512-byte rounded) into the CUDA caching allocator's: the ledger's
    log replayed (allocator.replay) over a warm-up and the measured step. The difference goes to
    "workspaces" (cuBLAS / cuBLASLt, kept from their first use) and "rounding" (blocks larger than asked:
    the rounding and blocks the allocator did not split), so the parts still sum to the peak."""
    from diagnostics.analyses.plan.allocator import replay

    r = replay(ledger.log, lazy_state=lazy_state)
    ws = sum(r["workspaces"].values())

    def lift(total: int, parts: dict, device_peak: int) -> int:
        extra = max(0, int(device_peak) - int(total) - ws)
        parts["workspaces"] = parts.get("workspaces", 0) + ws
        parts["rounding"] = parts.get("rounding", 0) + extra
        return int(total) + ws + extra

    st.peak_bytes = lift(st.peak_bytes, st.parts, r["peak"])
    for ph, v in st.phase_peaks.items():
        v["bytes"] = lift(v["bytes"], v["parts"], r["phases"].get(ph, 0))
    st.on_device = True
    if ws:
        st.notes.append("library workspaces held through the step: " + ", ".join(
            f"{n} {b / 2**20:g} MiB" for n, b in r["workspaces"].items()))


def _run(ledger: Ledger, phase: str, fn):
    ledger.phase = phase
    try:
        return fn()
    except TorchScopeError:
        raise
    except Exception as e:  # fake tracing failed: say where, so analytic.py can stand in for that module
        where = ledger.last_stack[-1] if ledger.last_stack else (ledger.module if phase == "backward" else ROOT)
        raise TraceFailure(where, phase, e) from e


def train_step(loaded, model, inputs, config, target, ledger, fake, device, ck, t0, *, opt=None,
               persistent=()) -> StepTrace:
    """The training step of a prepared fake model under ``ledger``. ``opt``: the optimizer (default: the
    configuration's); ``persistent``: (tensor, category) pairs alive from before the step (DDP's buckets)."""
    if not any(p.requires_grad for p in model.parameters()):
        raise TorchScopeError("the model has no trainable parameters: a training step has nothing to train")
    model.train()
    opt = _optimizer(model, config, target) if opt is None else opt
    _init_state(model, opt, fake)
    params = list(model.parameters()) + list(model.buffers())
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its rank's state in .optim
    on_host = target.kind == "cuda" and device == "cpu" and config.setting.optimizer != "adamw_fused"
    # torch keeps each parameter's ``step`` counter on the host unless the optimizer is fused or capturable:
    # traced on fake CPU tensors for a CUDA target, those scalars are left out.
    state = [v for s in inner.state.values() for k, v in s.items()
             if isinstance(v, torch.Tensor) and not (on_host and k == "step")]
    offload = config.setting.offload
    for t in params:
        ledger.add(t, "parameters")
    for t in inputs:
        ledger.add(t, "inputs")
    if not offload:
        for t in state:
            ledger.add(t, "optimizer state")
    for t, category in persistent:
        ledger.add(t, category)
    notes = []
    with fake, ledger.watching(model), checkpointing(model, ck, ledger):
        def forward():
            with _autocast(config, device):
                out = inputs.call(model)
                return loaded.loss_fn(out)

        loss = _run(ledger, "forward", forward)
        ledger.tag_graph(loss, LOSS)
        saved = ledger.now["activations"]
        _run(ledger, "backward", loss.backward)
        del loss
        for p in model.parameters():
            if p.grad is not None:
                ledger.mark(p.grad, "gradients")
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if offload:
            # The optimizer runs on the host: the gradients are copied there when backward ends, and the
            # state and the step's scratch are host memory. The device's peak is forward's or backward's.
            notes.append("optimizer state and the optimizer step on the host (offload): gradients leave the "
                         "device when backward ends; the host needs the state and a copy of the gradients")
        else:
            _run(ledger, "optimizer", opt.step)
    gbytes = _bytes(grads)
    host = _bytes(state) + gbytes if offload else 0
    return StepTrace(
        peak_bytes=int(ledger.peak_bytes), parts=dict(ledger.peak_parts), phase=ledger.peak_phase,
        module=ledger.peak_module, phase_peaks=ledger.phase_peaks, saved_bytes=int(saved),
        saved_by_module=dict(ledger.saved_by_module), param_bytes=_bytes(params), grad_bytes=gbytes,
        state_bytes=_bytes(state), input_bytes=_bytes(list(inputs)), ops=ledger.ops,
        seconds=time.perf_counter() - t0, timeline=ledger.timeline(), host_bytes=host, notes=notes)


def _trace_inference(loaded, model, inputs, config, ledger, fake, device, t0) -> StepTrace:
    from diagnostics.analyses.plan.inference import run_inference

    model.eval()
    params = list(model.parameters()) + list(model.buffers())
    for t in params:
        ledger.add(t, "parameters")
    for t in inputs:
        ledger.add(t, "inputs")
    with fake, ledger.watching(None), torch.no_grad():
        with _autocast(config, device):
            notes = _run(ledger, "forward", lambda: run_inference(loaded, model, inputs, config, ledger))
    kv = config.setting.kv_dtype
    if kv != "model" and ledger.peak_parts.get("kv cache"):
        # transformers keeps K/V in the compute dtype: the traced cache is rescaled to the asked element size
        from diagnostics.analyses.plan.configs import KV_BYTES

        compute = DTYPES[config.setting.dtype].autocast or DTYPES[config.setting.dtype].param
        have, want = PARAM_BYTES.get(compute, 2), KV_BYTES[kv]

        def rescale(parts: dict) -> int:
            old = parts.get("kv cache", 0)
            parts["kv cache"] = old * want // have
            return parts["kv cache"] - old

        ledger.peak_bytes += rescale(ledger.peak_parts)
        for v in ledger.phase_peaks.values():
            v["bytes"] += rescale(v["parts"])
        notes = list(notes or []) + [
            f"KV cache counted in {kv} ({want} byte{'s' if want > 1 else ''} per element): transformers stores it "
            f"in the compute dtype ({have} bytes), so the traced cache was rescaled"]
    return StepTrace(
        peak_bytes=int(ledger.peak_bytes), parts=dict(ledger.peak_parts), phase=ledger.peak_phase,
        module=ledger.peak_module, phase_peaks=ledger.phase_peaks, saved_bytes=0, saved_by_module={},
        param_bytes=_bytes(params), grad_bytes=0, state_bytes=0, input_bytes=_bytes(list(inputs)), ops=ledger.ops,
        seconds=time.perf_counter() - t0, timeline=ledger.timeline(), notes=list(notes or []))
