"""The memory ledger: every storage a traced step creates, by category, and the peak, without allocating.

``Ledger`` is a TorchDispatchMode over fake tensors. Each op's outputs are registered by storage (views
share one), sized as the device's allocator would size them (CUDA's caching allocator rounds each
block up to 512 bytes; the difference is the category "rounding"), and dropped when the storage
dies (a weakref callback: the fake storage is freed exactly when a real one would be, since the
same Python and autograd code holds it). What holds memory at any instant is known by category:

* parameters (and buffers), inputs, optimizer state: registered before the step;
* gradients: a parameter's ``.grad`` (post-accumulate-grad hooks, and a sweep after backward);
* activations: storages autograd saves for backward (``saved_tensors_hooks``), block inputs kept by
  activation checkpointing, and tensors recomputed in backward;
* kv cache: the keys and values an inference pass stores for the next token;
* temporaries: everything else (intermediates, gradients of activations, optimizer scratch).

The peak is recorded with its parts, phase (forward / backward / optimizer) and the innermost module
running: in forward the module stack (global module hooks), in backward the module whose forward
created the autograd node being run (nodes are tagged with their module when it returns). The
approach follows torch.distributed._tools.mem_tracker.MemTracker (weakrefs on storages, the
512-byte rounding, letting DTensor desugar before counting); the categories, attribution and
timeline are ours, and tests/analyses/plan check the totals against measured peaks.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "kv cache", "temporaries", "inputs",
              "rounding")
PHASES = ("forward", "backward", "optimizer")
ROOT = "(model)"
LOSS = "(loss)"
#: Timeline points kept per trace (the peak of each bucket of ops).
TIMELINE_POINTS = 400


class _Block:
    __slots__ = ("raw", "extra", "category", "alive", "__weakref__")

    def __init__(self, raw: int, extra: int, category: str):
        self.raw, self.extra, self.category, self.alive = raw, extra, category, True


def _storages(t: torch.Tensor):
    """The storages behind a tensor (a DTensor's local shard, a wrapper subclass' inner tensors)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    stack, out = [t], []
    while stack:
        x = stack.pop()
        if is_traceable_wrapper_subclass(x):
            attrs, _ = x.__tensor_flatten__()
            stack.extend(getattr(x, a) for a in attrs if isinstance(getattr(x, a), torch.Tensor))
        else:
            try:
                out.append(x.untyped_storage())
            except (RuntimeError, NotImplementedError):  # sparse or other storage-less tensors
                pass
    return out


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # a torch without distributed
        return None
    return DTensor


def stand_in_scalar(func, args):
    """An optimizer's data-dependent scalar (Adafactor's step count and norms, read with .item()) on a
    fake tensor: 1 of the tensor's kind. Such values scale the update, never its memory."""
    if func is torch.ops.aten._local_scalar_dense.default:
        t = args[0]
        return 1.0 if t.is_floating_point() else (True if t.dtype == torch.bool else 1)
    return None


#: ops whose fake (meta) kernel insists on bf16 where the CPU kernel also takes fp32 (transformers' mixture-of-
#: experts layers call aten._grouped_mm in the model's dtype)
BF16_ONLY_META = {torch.ops.aten._grouped_mm.default}


def _shape_in_bf16(func, args, kwargs):
    """The op's outputs from its bf16 meta kernel, in the (one) float dtype it was called with."""
    from torch.utils._pytree import tree_map

    dtypes = {t.dtype for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if dtypes == {torch.bfloat16} or len(dtypes) != 1:
        return func(*args, **(kwargs or {}))
    (dtype,) = dtypes
    cast = tree_map(lambda t: t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                    (list(args), dict(kwargs or {})))
    out = func(*cast[0], **cast[1])
    return tree_map(lambda t: torch.empty_like(t, dtype=dtype) if isinstance(t, torch.Tensor) and t.is_floating_point()
                    else t, out)


#: matmul-like ops whose real kernels (CPU and CUDA) refuse operands of two float dtypes, which their fake
#: (meta) kernels let through: checked here, or a model that cannot run in a dtype would get a plan
SAME_DTYPE_OPS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
                  torch.ops.aten.baddbmm.default, torch.ops.aten.addbmm.default, torch.ops.aten.convolution.default}


def check_dtypes(func, args) -> None:
    """Raise as the real kernel would when a matmul-like op gets two float dtypes."""
    if func not in SAME_DTYPE_OPS:
        return
    dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if len(set(dtypes)) > 1:
        raise RuntimeError(f"{func}: expected both operands to have the same dtype, got "
                           f"{' and '.join(str(d).replace('torch.', '') for d in dict.fromkeys(dtypes))}")


class ScalarsAnswered(TorchDispatchMode):
    """Inside: .item() on a fake tensor answers 1 instead of failing (for optimizer steps only)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        value = stand_in_scalar(func, args)
        return value if value is not None else func(*args, **(kwargs or {}))


class Ledger(TorchDispatchMode):
    """Memory by category over a traced step on fake tensors (see the module doc).

    ``rounding``: the allocator's block granularity in bytes (512 on CUDA, 1 on the CPU).
    ``names``: module -> qualified name, for attributing the peak and saved activations.
    """

    def __init__(self, rounding: int = 1, names: dict | None = None, timeline: bool = False, scratch=None,
                 cuda=None):
        super().__init__()
        self.scratch = scratch  # scratch.Scratch: kernels' own buffers, probed (None: not counted)
        # cuda_kernels.CudaKernels (a CUDA target): kernels' scratch and library workspaces by rule, and the
        # log of every allocation and free that allocator.replay turns into the caching allocator's peak
        self.cuda = cuda
        self.log: list | None = [] if cuda is not None else None
        self.rounding = max(1, int(rounding))
        self.names = names or {}
        self.blocks = WeakIdKeyDictionary()
        self.now = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self._phase = "setup"
        self.stack: list[str] = []  # forward module stack (also during recomputation in backward)
        self.peak_bytes = 0
        self.peak_parts: dict = {**self.now, "workspaces": 0}
        self.peak_phase = "setup"
        self.peak_module = ROOT
        self.phase_peaks: dict[str, dict] = {}
        self.saved_by_module: dict[str, int] = {}
        self.saved_keys: set = set()
        self.ops = 0
        self.last_stack: list[str] = []
        self.samples: list | None = [] if timeline else None
        self.recompute_depth = 0
        self._dtensor = _dtensor_type()
        self._hooks: list = []

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = value
        if self.log is not None:
            self.log.append(("p", value))

    # ------------------------------------------------------------------ registering storages
    def _size(self, n: int) -> tuple[int, int]:
        r = self.rounding
        if r == 1 or n == 0:
            return n, 0
        return n, -(-n // r) * r - n

    def add(self, t: torch.Tensor, category: str, nbytes: int | None = None) -> None:
        """Count ``t``'s storages under ``category`` unless already counted (then leave them as they are);
        ``nbytes``: the size its real kernel gives it, where that differs from the fake one's."""
        for st in _storages(t):
            if st in self.blocks:
                continue
            raw, extra = self._size(int(st.nbytes() if nbytes is None else nbytes))
            block = _Block(raw, extra, category)
            self.blocks[st] = block
            weakref.finalize(st, self._free, block)
            if self.log is not None and raw:
                self.log.append(("a", id(block), raw, category))
            self.now[category] += raw
            self.now["rounding"] += extra
            self.total += raw + extra

    def _resized(self, st) -> None:
        """A storage resized in place (FSDP2 frees and refills its gathered parameters this way, which no
        dispatch mode sees): the block takes its new size."""
        block = self.blocks.get(st)
        if block is None:
            self.blocks[st] = block = _Block(0, 0, "parameters")
            weakref.finalize(st, self._free, block)
        if not block.alive:
            return
        raw, extra = self._size(int(st.nbytes()))
        self.now[block.category] += raw - block.raw
        self.now["rounding"] += extra - block.extra
        self.total += raw + extra - block.raw - block.extra
        block.raw, block.extra = raw, extra
        self._after()

    def mark(self, t: torch.Tensor, category: str, only_from: tuple = ("temporaries",)) -> None:
        """Move ``t``'s storages to ``category`` (counting them first if they are new)."""
        for st in _storages(t):
            block = self.blocks.get(st)
            if block is None:
                self.add(t, category)
                continue
            if block.category != category and block.category in only_from and block.alive:
                self.now[block.category] -= block.raw
                self.now[category] += block.raw
                block.category = category

    def _free(self, block: _Block) -> None:
        if not block.alive:
            return
        block.alive = False
        if self.log is not None and block.raw:
            self.log.append(("f", id(block)))
        self.now[block.category] -= block.raw
        self.now["rounding"] -= block.extra
        self.total -= block.raw + block.extra

    # ------------------------------------------------------------------ where we are
    @property
    def module(self) -> str:
        if self.stack:
            return self.stack[-1]
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                try:
                    return node.metadata.get("plan_module", "(autograd)")
                except Exception:  # a node without metadata support
                    return "(autograd)"
            return "(autograd)"
        # forward with no module running: the loss, computed on the model's output
        return {"optimizer": "(optimizer)", "forward": LOSS}.get(self.phase, ROOT)

    def _new_category(self) -> str:
        if self.phase == "backward" and self.stack:
            return "activations"  # recomputed by activation checkpointing
        return "temporaries"

    def _after(self, scratch: int = 0) -> None:
        """After an op: the peak, with the kernel's own scratch (``scratch`` bytes, freed by the kernel) on top."""
        self.ops += 1
        high = self.total + scratch
        if high > self.peak_bytes:
            self.peak_bytes = high
            self.peak_parts = {**self.now, "workspaces": scratch}
            self.peak_phase = self.phase
            self.peak_module = self.module
        pp = self.phase_peaks.get(self.phase)
        if pp is None or high > pp["bytes"]:
            self.phase_peaks[self.phase] = {"bytes": high, "parts": {**self.now, "workspaces": scratch},
                                            "module": self.module}
        if self.samples is not None:
            self.samples.append((self.total, self.phase, tuple(self.now[c] for c in CATEGORIES)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._dtensor is not None and any(t is self._dtensor for t in types):
            return NotImplemented  # let DTensor run its local ops, which are counted then
        if self.phase == "optimizer":
            value = stand_in_scalar(func, args)
            if value is not None:
                return value
        self.last_stack = list(self.stack)
        check_dtypes(func, args)
        if func in BF16_ONLY_META:
            out = _shape_in_bf16(func, args, kwargs)
        else:
            out = func(*args, **(kwargs or {}))
        scratch, sizes = self.scratch.measure(func, args, kwargs, out) if self.scratch is not None else (0, None)
        leaves = tree_leaves(out)
        if sizes is not None and len(sizes) != len(leaves):
            sizes = None
        inner = [scratch] if scratch else []
        if self.cuda is not None:
            host = self.cuda.host_outputs(func)
            if host:
                sizes = [0 if i in host else (sizes[i] if sizes is not None else None) for i in range(len(leaves))]
            for name, nbytes in self.cuda.workspaces(func, args, self.phase):
                self.log.append(("w", name, nbytes))
        for i, t in enumerate(leaves):
            if isinstance(t, torch.Tensor):
                self.add(t, self._new_category(), sizes[i] if sizes is not None else None)
        if self.cuda is not None:
            inner += self.cuda.scratch(func, args, kwargs, out)
            if inner:
                self.log.append(("s", tuple(inner)))
            scratch = sum(-(-n // self.rounding) * self.rounding for n in inner)
        self._after(scratch)
        return out

    # ------------------------------------------------------------------ hooks
    def pack(self, t):
        """saved_tensors_hooks' pack: what autograd keeps for backward becomes an activation."""
        if isinstance(t, torch.nn.Parameter):  # a weight (FSDP2's gathered ones too) is not an activation
            self.mark(t, "parameters")
            return t
        if isinstance(t, torch.Tensor):
            for st in _storages(t):
                block = self.blocks.get(st)
                if block is None or block.category != "temporaries" or not block.alive:
                    continue
                self.mark(t, "activations")
                key = id(block)
                if key not in self.saved_keys:
                    self.saved_keys.add(key)
                    owner = self.stack[-1] if self.stack else ROOT
                    self.saved_by_module[owner] = self.saved_by_module.get(owner, 0) + block.raw
        return t

    def tag_graph(self, outputs, name: str) -> None:
        """Tag the autograd nodes behind ``outputs`` not tagged yet (the loss's) with ``name``."""
        self._tag([], outputs, name)

    def keep_for_recompute(self, tensors) -> None:
        """Block inputs that activation checkpointing keeps alive for its recomputation: activations."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self.pack(t)

    def _pre(self, module, _args):
        self.stack.append(self.names.get(module, type(module).__name__))

    def _post(self, module, args, out):
        if self.stack:
            self.stack.pop()
        if self.phase != "forward":
            return
        self._tag(args, out, self.names.get(module, type(module).__name__))

    @staticmethod
    def _tag(args, out, name: str) -> None:
        # Tag the autograd nodes a module created (not those of its inputs, made before it ran), so that
        # backward knows whose gradient it is computing; a child's nodes keep the child's name.
        stop = {t.grad_fn for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.grad_fn is not None}
        todo = [t.grad_fn for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        seen = set()
        while todo:
            node = todo.pop()
            if node is None or node in stop or node in seen:
                continue
            seen.add(node)
            try:
                md = node.metadata
            except Exception:
                continue
            md.setdefault("plan_module", name)
            todo.extend(n for n, _ in node.next_functions if n is not None)

    @contextmanager
    def watching(self, model: torch.nn.Module | None = None):
        """The ledger active, with module hooks, saved-tensor hooks and gradient hooks on ``model``."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        handles = [register_module_forward_pre_hook(self._pre),
                   register_module_forward_hook(self._post, always_call=True)]
        if model is not None:
            for p in model.parameters():
                if p.requires_grad:
                    handles.append(p.register_post_accumulate_grad_hook(
                        lambda p: self.mark(p.grad, "gradients") if p.grad is not None else None))
        original_resize = torch.UntypedStorage.resize_
        ledger = self

        def resize_(st, size):
            out = original_resize(st, size)
            ledger._resized(st)
            return out

        torch.UntypedStorage.resize_ = resize_
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t), self:
                yield self
        finally:
            torch.UntypedStorage.resize_ = original_resize
            for h in handles:
                h.remove()

    # ------------------------------------------------------------------ results
    def timeline(self) -> dict | None:
        """At most TIMELINE_POINTS samples (the highest of each bucket of ops), by category and phase."""
        if not self.samples:
            return None
        n = len(self.samples)
        step = max(1, -(-n // TIMELINE_POINTS))
        picks = []
        for start in range(0, n, step):
            chunk = range(start, min(n, start + step))
            picks.append(max(chunk, key=lambda i: self.samples[i][0]))
        return {"op_index": picks, "phase": [self.samples[i][1] for i in picks],
                "series": {c: [self.samples[i][2][k] for i in picks] for k, c in enumerate(CATEGORIES)},
                "ops": n}
