"""Measure memory: the peak of a piece of work, saved activations per layer, a timeline by category.

* ``measure_peak(fn, device)``: on CUDA ``torch.cuda.max_memory_allocated`` /
  ``max_memory_reserved`` after ``reset_peak_memory_stats``; on the CPU the peak of the running
  total of the profiler's allocation events (``profile_memory=True``) above what was allocated
  when it started. Returns the figures with a ``source`` string saying which.
* ``SavedTensorTracker``: bytes autograd saves for backward (``saved_tensors_hooks``), each storage
  once, parameters and inputs left out, attributed to the innermost module running when saved;
  plus each module's output bytes from forward hooks.
* ``category_timeline(prof, device)``: the profiler's memory timeline (``_memory_profiler``) by
  category, in plain lists.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from diagnostics.tensors import iter_tensors

ROOT = "(model)"

#: The profiler's categories, folded into the ones the page shows.
CATEGORY_NAMES = {
    "PARAMETER": "parameters",
    "OPTIMIZER_STATE": "optimizer state",
    "INPUT": "inputs",
    "TEMPORARY": "temporaries",
    "ACTIVATION": "activations",
    "GRADIENT": "gradients",
    "AUTOGRAD_DETAIL": "temporaries",  # gradients of activations flowing through backward
    None: "unattributed",
}
CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "temporaries", "inputs",
              "unattributed")


def is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def _storage_key(t: torch.Tensor):
    try:
        s = t.untyped_storage()
        return (s.data_ptr(), str(t.device)), s.nbytes()
    except (RuntimeError, NotImplementedError):
        return ("id", id(t)), t.numel() * t.element_size()


def _walk(nodes):
    for n in nodes:
        yield n
        yield from _walk(n.children)


def _cpu_profile(record_timeline: bool):
    from torch.profiler import ProfilerActivity, profile

    # The memory timeline needs shapes and stacks; the peak alone only needs the memory events.
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=record_timeline,
                   with_stack=record_timeline)


def allocation_peak(prof, device: str = "cpu") -> int:
    """Peak of the running sum of allocation sizes (frees are negative) over the profiled window."""
    from torch._C._profiler import _EventType

    dev = torch.device(device)
    events = []
    for n in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        if n.typed[0] == _EventType.Allocation:
            f = n.typed[1]
            if f.device.type == dev.type:
                events.append((n.start_time_ns, f.alloc_size))
    events.sort(key=lambda e: e[0])
    running = peak = 0
    for _, size in events:
        running += size
        peak = max(peak, running)
    return peak


@dataclass
class Peak:
    peak_bytes: int
    baseline_bytes: int
    reserved_bytes: int | None
    source: str
    prof: object = None

    def to_dict(self) -> dict:
        return {"peak_bytes": int(self.peak_bytes), "baseline_bytes": int(self.baseline_bytes),
                "reserved_bytes": None if self.reserved_bytes is None else int(self.reserved_bytes),
                "source": self.source}


def measure_peak(fn, device, baseline_bytes: int, *, profile: bool = False, timeline: bool = False) -> Peak:
    """Run ``fn()`` once and return its peak memory.

    ``baseline_bytes`` (CPU only) is what the work starts with (parameters, inputs, ...), which the
    CPU profiler cannot see since it only records allocations made while it runs.
    ``profile`` also runs the profiler on CUDA (for a timeline), kept in ``Peak.prof``.
    """
    if is_cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        if profile:
            from torch.profiler import ProfilerActivity, profile as _profile

            with _profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True,
                          record_shapes=timeline, with_stack=timeline) as prof:
                fn()
                torch.cuda.synchronize(device)
        else:
            prof = None
            fn()
            torch.cuda.synchronize(device)
        return Peak(torch.cuda.max_memory_allocated(device), start, torch.cuda.max_memory_reserved(device),
                    "torch.cuda.max_memory_allocated (peak of live tensors; reserved = caching allocator's "
                    "max_memory_reserved), after reset_peak_memory_stats", prof)
    with _cpu_profile(timeline) as prof:
        fn()
    delta = allocation_peak(prof, "cpu")
    return Peak(baseline_bytes + delta, baseline_bytes, None,
                "CPU: torch.profiler memory events (profile_memory=True): peak of the running allocated "
                "total during the work, plus the tensors alive before it (parameters, buffers, inputs, "
                "gradients, optimizer state)", prof if (profile or timeline) else None)


# ------------------------------------------------------------------------ saved activations
@dataclass
class SavedTensorTracker:
    """Per-module bytes saved for backward and output bytes; filled inside ``track(model)``."""

    exclude: set = field(default_factory=set)  # storage keys of parameters and inputs
    saved: dict = field(default_factory=dict)  # module -> bytes saved for backward
    outputs: dict = field(default_factory=dict)  # module -> output bytes (first call)
    calls: list = field(default_factory=list)  # modules in forward order
    seen: set = field(default_factory=set)
    saved_params_bytes: int = 0

    @property
    def saved_total(self) -> int:
        return sum(self.saved.values())

    @contextmanager
    def track(self, model: nn.Module, inputs=()):
        for t in list(model.parameters()) + list(model.buffers()) + list(iter_tensors(inputs)):
            self.exclude.add(_storage_key(t)[0])
        stack: list[str] = []
        handles = []

        def pack(t):
            if isinstance(t, torch.Tensor):
                key, n = _storage_key(t)
                if key in self.exclude:
                    if key not in self.seen:
                        self.seen.add(key)
                        self.saved_params_bytes += n
                elif key not in self.seen:
                    self.seen.add(key)
                    owner = stack[-1] if stack else ROOT
                    self.saved[owner] = self.saved.get(owner, 0) + n
            return t

        try:
            for name, mod in model.named_modules():
                if isinstance(mod, torch.jit.ScriptModule):
                    continue
                name = name or ROOT

                def pre(_m, _inp, name=name):
                    stack.append(name)
                    if name not in self.calls:
                        self.calls.append(name)

                def post(_m, _inp, out, name=name):
                    if stack and stack[-1] == name:
                        stack.pop()
                    if name not in self.outputs:
                        keys = {}
                        for t in iter_tensors(out):
                            k, n = _storage_key(t)
                            keys[k] = n
                        self.outputs[name] = sum(keys.values())

                handles.append(mod.register_forward_pre_hook(pre))
                handles.append(mod.register_forward_hook(post, always_call=True))
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield self
        finally:
            for h in handles:
                h.remove()


def measure_saved(loaded, inputs) -> SavedTensorTracker:
    """One training-mode forward at ``inputs``: what autograd saves, then the graph is dropped."""
    model = loaded.model
    tracker = SavedTensorTracker()
    with tracker.track(model, inputs):
        out = loaded.forward(inputs)
        loss = loaded.loss_fn(out)
    del out, loss  # frees the graph and what it saved
    return tracker


# ------------------------------------------------------------------------------ timeline
def phase_ranges(prof, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Start/end (ns, the profiler's clock) of record_function ranges with the given names."""
    out = {}
    for n in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        if n.name in names and n.name not in out:
            out[n.name] = (n.start_time_ns, n.end_time_ns)
    return out


def category_timeline(prof, device: str) -> dict:
    """The profiler's memory timeline by category: times in µs, bytes per category per time."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    tl = MemoryProfileTimeline(prof._memory_profile())
    times, sizes = tl._coalesce_timeline(str(torch.device(device)))
    names = [CATEGORY_NAMES[c.name if c is not None else None] for c in _CATEGORY_TO_INDEX]
    series = {c: [0] * len(times) for c in CATEGORIES}
    for i, row in enumerate(sizes):
        for name, v in zip(names, row[1:]):  # row[0] is a spare slot of the profiler's
            series[name][i] += int(v)
    return {"times_us": [int(t) for t in times], "series": series}


def added_peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes allocated during one call of ``fn`` above what was allocated before it."""
    p = measure_peak(fn, device, 0)
    return int(p.peak_bytes - p.baseline_bytes)


def peak_in_use_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes in use during one call of ``fn``, what was allocated before included (CUDA)."""
    return int(measure_peak(fn, device, 0).peak_bytes)
