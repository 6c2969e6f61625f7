"""The roofline: what this machine can do (measured roofs), what each operator did (exact FLOPs and
bytes moved per step, measured time), and how far from its roof each one ran.

* ``measure_roofs(device, dtype)``: the machine's ceilings: the best dense GEMM FLOP/s over a few
  sizes and the copy bandwidth per working-set size (bytes read + written), the fastest of a few
  calls with the one timer; datasheet peaks beside them for known GPUs. ``memory_roof`` picks the
  bandwidth an op is held to from its bytes per call.
* ``count_ops(fn)``: run ``fn`` (one step) under ``flops.FlopCounter`` (the same FLOP formulas as
  the Model page: FlopCounterMode's plus grouped matmuls and fused attention) and a dispatch mode that
  sums the bytes of every op's tensor inputs and outputs (views move nothing and count 0): FLOPs,
  bytes and calls per aten op, and the ops whose FLOPs could not be counted.
* ``op_nesting(events)`` / ``counted_times(nesting, ops, steps)``: the time of each counted op, over
  its outermost calls and *inclusive* of the ops it runs: the counters see an op where the model
  calls it (``aten::convolution``), while its work runs in a child (``aten::mkldnn_convolution``),
  so its self time would put it far above its roof (26,324 % in issue #31).
* ``not_counted_rows(count, times_ms)``: those ops with their share of the measured op time.
* ``roofline_rows(ops, times_ms, roofs)``: per op, achieved FLOP/s, arithmetic intensity, the roof
  at that intensity, compute- or memory-bound, the time at the roof and the headroom.
* ``mfu(model_flops, step_ms, peak)``: model FLOPs utilisation of a step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from diagnostics.measure.flops import FlopCount, FlopCounter, op_name
from diagnostics.measure.timer import sync, time_calls

#: Dense peak FLOP/s and memory bandwidth from the datasheets (dense, no sparsity), by name fragment.
DATASHEET = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "bandwidth": 4.8e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "bandwidth": 3.35e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12, "bandwidth": 2.0e12},
    "L40S": {"bfloat16": 362e12, "float16": 362e12, "float32": 91.6e12, "bandwidth": 0.864e12},
    "L4": {"bfloat16": 121e12, "float16": 121e12, "float32": 30.3e12, "bandwidth": 0.3e12},
    "A10": {"bfloat16": 125e12, "float16": 125e12, "float32": 31.2e12, "bandwidth": 0.6e12},
    "V100": {"float16": 125e12, "float32": 15.7e12, "bandwidth": 0.9e12},
    "T4": {"float16": 65e12, "float32": 8.1e12, "bandwidth": 0.32e12},
}
#: An op whose achieved rate exceeds its roof by more than this factor is flagged (timing noise).
ABOVE_ROOF_TOLERANCE = 1.10
#: Ops moving at most this many bytes per call work in cache (the page's dotted roof line).
CACHE_OP_BYTES = 1 << 20
CACHE_COPY_BYTES = 256 << 10
#: GEMM sizes whose best rate is the compute roof: on the CPU a 1024 x 1024 product spills the cache of
#: a small machine (36 GFLOP/s here while 512 x 512 ran at 204), and a convolution whose working set
#: stays in cache then ran above the "roof" (issue #31): the roof is the best rate of any size.
GEMM_SIZES = {"cpu": (256, 512, 1024), "cuda": (4096, 8192)}
#: Channels of the 1x1 convolutions (over a CONV_HW x CONV_HW image, batch 1) that also measure the compute
#: roof on the CPU: torch.mm runs MKL's sgemm, which on AMD CPUs keeps to its AVX2 code, while
#: convolutions, LSTMs and linear layers through oneDNN run AVX-512 kernels (on the 2-core EPYC here: mm at
#: 200 GFLOP/s at best, a 1x1 convolution at 350; the CI saw a convolution, an LSTM layer and whole
#: modules "above their roof", MFU 1.2). The roof is the best rate of either library.
CONV_CHANNELS = {"cpu": (256, 512), "cuda": ()}
CONV_HW = 32
#: Bytes moved per call (read + write) of the copies that measure memory bandwidth per working-set
#: size (twice apart, so an op is held to a copy at most twice smaller than it): an op is held to the
#: bandwidth of the largest copy moving no more bytes per call than it does (a working set no larger than
#: the op's: at least as fast as any level the op's data lives in), the largest copy being DRAM's.
COPY_BYTES = {"cpu": (512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20,
                      256 << 20),
              "cuda": (8 << 20, 32 << 20, 64 << 20, 128 << 20, 512 << 20)}
#: Each copy size is repeated within one timed call until it moves at least this many bytes.
COPY_MIN_BYTES = 4 << 20
#: A roof is the fastest of several calls: at least ``reps``, more where a call is cheap, up to this
#: budget of seconds per size and ROOF_MAX_REPS calls (on a shared machine a few calls in a row can
#: all land in a busy moment; the ceiling is what the quiet moments show).
ROOF_BUDGET_S = 0.05
ROOF_MAX_REPS = 50


def datasheet(device_name: str | None, dtype: str) -> dict | None:
    for key, peaks in DATASHEET.items():
        if device_name and key.lower() in device_name.lower() and dtype in peaks:
            return {"gpu": key, "peak_flops": peaks[dtype], "bandwidth_bytes_per_s": peaks["bandwidth"]}
    return None


def measure_roofs(device: torch.device | str, dtype: torch.dtype = torch.float32, reps: int = 5) -> dict:
    """This machine's ceilings on ``device``: the best dense-GEMM FLOP/s over a few sizes and the best copy
    bandwidth per working-set size (each the fastest of ``reps`` timed calls: a roof is what the machine
    can do, so a call slowed by other load does not lower it)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    kind = "cuda" if cuda else "cpu"
    rates = {str(n): _gemm_rate(n, device, dtype, reps) for n in GEMM_SIZES[kind]}
    rates.update({f"conv1x1 c{c}": _conv_rate(c, device, dtype, reps) for c in CONV_CHANNELS[kind]})
    best_n = max(rates, key=rates.get)
    curve = [[moved, _copy_rate(moved // 8, device, reps, repeat=max(1, COPY_MIN_BYTES // moved))]
             for moved in COPY_BYTES[kind]]
    for i in range(len(curve) - 2, -1, -1):  # a smaller working set is never slower than a larger one
        curve[i][1] = max(curve[i][1], curve[i + 1][1])
    sync(device)
    peak, bandwidth = rates[best_n], curve[-1][1]
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    dt = str(dtype).replace("torch.", "")
    return {"device": str(device), "device_name": name, "dtype": dt,
            "threads": torch.get_num_threads(), "peak_flops": peak, "bandwidth_bytes_per_s": bandwidth,
            "cache_bandwidth_bytes_per_s": curve[0][1], "cache_op_bytes": CACHE_OP_BYTES,
            "bandwidth_curve": curve, "gemm_rates": rates,
            "ridge_intensity": peak / bandwidth,
            "method": f"fastest of {reps} to {ROOF_MAX_REPS} calls: torch.mm of two n x n {dt} matrices (2n^3 FLOP), the best of n = "
                      f"{', '.join(map(str, GEMM_SIZES[kind]))}"
                      + (f" and 1x1 convolutions (oneDNN) of {', '.join(map(str, CONV_CHANNELS[kind]))} channels over "
                         f"{CONV_HW} x {CONV_HW}" if CONV_CHANNELS[kind] else "")
                      + f" (best: {best_n if not best_n.isdigit() else 'n = ' + best_n}); copies moving "
                      f"{', '.join(_mib(b) for b in COPY_BYTES[kind])} per call (read + write), each op held to "
                      "the bandwidth of the largest copy moving no more than it does per call (the largest: DRAM)",
            "datasheet": datasheet(name if cuda else None, dt)}


def _mib(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _best_ms(fn: Callable[[], object], device, reps: int) -> float:
    """The fastest call of ``fn`` (after one untimed): at least ``reps`` calls, more while they are cheap."""
    first = time_calls(fn, device, 1, 1)[0]
    n = min(ROOF_MAX_REPS, max(reps, int(ROOF_BUDGET_S * 1e3 / max(first, 1e-6))))
    return min([first] + time_calls(fn, device, n - 1))


def _gemm_rate(n: int, device, dtype, reps: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2.0 * n ** 3 / (_best_ms(lambda: torch.mm(a, b), device, reps) / 1e3)


def _conv_rate(channels: int, device, dtype, reps: int) -> float:
    """A 1x1 convolution, channels -> channels over a CONV_HW x CONV_HW image: a GEMM through oneDNN."""
    x = torch.randn(1, channels, CONV_HW, CONV_HW, device=device, dtype=dtype)
    w = torch.randn(channels, channels, 1, 1, device=device, dtype=dtype)
    with torch.no_grad():
        ms = _best_ms(lambda: torch.nn.functional.conv2d(x, w), device, reps)
    return 2.0 * channels * channels * CONV_HW * CONV_HW / (ms / 1e3)


def _copy_rate(elems: int, device, reps: int, repeat: int = 1) -> float:
    x = torch.empty(elems, device=device, dtype=torch.float32).fill_(1.0)
    y = torch.empty_like(x)

    def copies():
        for _ in range(repeat):
            y.copy_(x)

    ms = _best_ms(copies, device, reps)
    if torch.device(device).type == "cpu":
        # the loop's own cost per call (Python, argument parsing: a one-element copy) is not the copy's: the
        # profiler's op times that are held to this roof exclude it (a 512 KiB copy read 136 GB/s with it,
        # 165 without, and a 512 KiB add under the profiler ran above the former); at most half is taken off
        one, other = torch.ones(1), torch.empty(1)

        def loop():
            for _ in range(repeat):
                other.copy_(one)

        ms = max(ms - _best_ms(loop, device, reps), ms / 2)
    return 2.0 * x.nbytes * repeat / (ms / 1e3)  # every byte read once and written once


def best_roofs(a: dict, b: dict) -> dict:
    """Two measurements of one machine's roofs combined: the higher of each ceiling (``b``'s other fields)."""
    out = dict(b)
    rates = {k: max(a["gemm_rates"].get(k, 0.0), v) for k, v in b["gemm_rates"].items()}
    out["gemm_rates"], out["peak_flops"] = rates, max(rates.values())
    out["bandwidth_curve"] = [[m, max(x, y)] for (m, x), (_, y) in zip(a["bandwidth_curve"], b["bandwidth_curve"])]
    out["bandwidth_bytes_per_s"] = out["bandwidth_curve"][-1][1]
    out["cache_bandwidth_bytes_per_s"] = out["bandwidth_curve"][0][1]
    out["ridge_intensity"] = out["peak_flops"] / out["bandwidth_bytes_per_s"]
    out["method"] = b["method"] + "; measured twice (an op ran above the first measurement), the higher of each"
    return out


def memory_roof(bytes_per_call: float, roofs: dict) -> tuple[float, str]:
    """The bandwidth an op moving ``bytes_per_call`` is held to, and which roof that is ("cache" or
    "DRAM"): the measured copy moving the most bytes per call but no more than the op does
    (``bandwidth_curve``; the smallest copy for an op smaller than all). A copy of a working set no larger than
    the op's is at least as fast as any level the op's data can live in, so the roof is never below what the
    op can reach (holding it to the next larger copy put a 1.3 MB add that fits two cores' L2 at 131 % of a
    roof measured with a 2 MiB copy). "DRAM" for the largest copy; without a curve, the cache bandwidth up to
    ``cache_op_bytes``."""
    curve = roofs.get("bandwidth_curve")
    if curve:
        within = [i for i, (moved, _) in enumerate(curve) if moved <= bytes_per_call]
        i = within[-1] if within else 0
        return curve[i][1], "DRAM" if i == len(curve) - 1 else "cache"
    dram = roofs["bandwidth_bytes_per_s"]
    if bytes_per_call <= roofs.get("cache_op_bytes", 0):
        return roofs.get("cache_bandwidth_bytes_per_s") or dram, "cache"
    return dram, "DRAM"


class _Bytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # A composite op (aten::linear under inference_mode) is counted as the ops it runs, as
        # FlopCounterMode counts its FLOPs and as the profiler charges their time (aten::addmm).
        with self:
            r = func.decompose(*args, **kwargs)
        if r is not NotImplemented:
            return r
        out = func(*args, **kwargs)
        name = op_name(func)
        self.calls[name] += 1
        self.bytes[name] += moved_bytes(func, args, kwargs, out)
        return out


#: Ops that allocate without writing (their output's bytes are not traffic).
_ALLOCATING = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted")


def _storage(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # no storage (a sparse or nested tensor): never the same as another's
        return ("no storage", id(t))


def moved_bytes(func, args, kwargs, out) -> int:
    """Bytes an op reads and writes: its tensor inputs and outputs. Nothing for a view (declared, or in all
    but name: every output shares an input's storage and nothing is written, as aten::_unsafe_view) and
    for an allocation (aten::empty: its output is not written); an in-place op's output is its write."""
    base = op_name(func).partition("::")[2]
    if getattr(func, "is_view", False) or base in _ALLOCATING:
        return 0
    ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    schema = getattr(func, "_schema", None)
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in getattr(schema, "arguments", ()))
    if outs and not writes and {_storage(t) for t in outs} <= {_storage(t) for t in ins}:
        return 0
    gathered = _GATHERS.get(base)
    if gathered is None or len(args) <= max(gathered) or not isinstance(args[gathered[0]], torch.Tensor) \
            or not isinstance(args[gathered[1]], torch.Tensor):
        return sum(footprint(t) for t in ins + outs)
    # A gather reads the source's elements its index names, not the whole source: nll_loss reads one log-prob
    # per target (counting the N x C input put aten::nll_loss_forward "at 125 % of its roof" in CI), an
    # embedding the rows its indices name. At most the source, and what the index addresses otherwise.
    src, index = args[gathered[0]], args[gathered[1]]
    dim = args[1] if base == "index_select" else 0
    rows = src.numel() // max(1, src.shape[dim]) if base in ("embedding", "index_select") and src.dim() else 1
    read = min(footprint(src), index.numel() * rows * src.element_size())
    rest = [t for t in ins if t is not src] + outs
    if base.startswith("nll_loss") and len(args) > 2 and isinstance(args[2], torch.Tensor):  # class weights
        rest = [t for t in rest if t is not args[2]]
        read += min(footprint(args[2]), index.numel() * args[2].element_size())
    return read + sum(footprint(t) for t in rest)


#: Ops that read only the elements of a source their index addresses: op -> (source arg, index arg); an
#: embedding and index_select read whole rows (slices along their dim), the others one element per index.
_GATHERS = {"nll_loss_forward": (0, 1), "nll_loss2d_forward": (0, 1), "embedding": (0, 1), "take": (0, 1),
            "gather": (0, 2), "index_select": (0, 2)}


def footprint(t: torch.Tensor) -> int:
    """The bytes a tensor occupies: a broadcast (expanded, stride 0) dimension is the same memory read
    again from cache, so it counts once (a bias expanded over the batch is its own size, not the batch's)."""
    try:
        strides = t.stride()
    except (RuntimeError, NotImplementedError):  # sparse / nested: no strides
        return t.numel() * t.element_size()
    if 0 not in strides or t.numel() == 0:
        return t.numel() * t.element_size()
    return math.prod(n for n, st in zip(t.shape, strides) if st != 0) * t.element_size()


def count_ops(fn: Callable[[], object], root: str | None = None) -> tuple[dict[str, dict], FlopCount]:
    """Per aten op of one call of ``fn``: {"flops", "bytes", "calls"}, and the ``FlopCount`` (total,
    FLOPs per module when ``root`` names the model's class, the ops not counted)."""
    counter = FlopCounter()
    moved = _Bytes()
    with counter, moved:
        fn()
    count = counter.result(root)
    ops = {name: {"flops": int(count.by_op.get(name, 0)), "bytes": int(moved.bytes.get(name, 0)),
                  "calls": int(moved.calls[name])} for name in set(moved.calls) | set(count.by_op)}
    return ops, count


def op_nesting(events) -> dict[tuple[str, frozenset], list[float]]:
    """A profiler's events (``prof.events()``: FunctionEvents on the host) summed per (op name, names of
    the ops around it): [inclusive CPU µs, inclusive device µs, calls]. Only names with a namespace
    ('aten::mm') are ops; ranges, module labels and autograd nodes neither count nor enclose."""
    out: dict[tuple[str, frozenset], list[float]] = {}
    for e in events:
        if "::" not in e.name or getattr(getattr(e, "device_type", None), "name", "CPU") != "CPU":
            continue
        around, a = set(), e.cpu_parent
        while a is not None:
            if "::" in a.name:
                around.add(a.name)
            a = a.cpu_parent
        acc = out.setdefault((e.name, frozenset(around)), [0.0, 0.0, 0])
        acc[0] += float(e.cpu_time_total)
        acc[1] += float(getattr(e, "device_time_total", 0.0) or 0.0)
        acc[2] += 1
    return out


def merge_nesting(parts: list[dict]) -> dict[tuple[str, frozenset], list[float]]:
    out: dict[tuple[str, frozenset], list[float]] = {}
    for part in parts:
        for key, (cpu, dev, calls) in part.items():
            acc = out.setdefault(key, [0.0, 0.0, 0])
            acc[0] += cpu
            acc[1] += dev
            acc[2] += calls
    return out


def counted_times(nesting: dict, counted: set[str] | frozenset[str], steps: int, device: bool = False) -> dict[str, float]:
    """Milliseconds per step of each op in ``counted`` (the ops the FLOP and byte counters saw), inclusive
    of what it runs, over its outermost calls: a call inside another counted op is that op's work (the
    counters saw only the outer one). ``device``: device time (kernels launched by the op and its
    children) where the op has any, else CPU time."""
    cpu: dict[str, float] = defaultdict(float)
    dev: dict[str, float] = defaultdict(float)
    for (name, around), (c, d, _calls) in nesting.items():
        if name in counted and not (around & counted):
            cpu[name] += c
            dev[name] += d
    steps = max(1, steps)
    return {n: ((dev[n] if device and dev[n] > 0 else cpu[n]) / 1e3 / steps) for n in cpu}


def not_counted_rows(count: FlopCount, times_ms: dict[str, float]) -> list[dict]:
    """The ops the FLOP count left out, each with its measured time per step and share of all op time."""
    total = sum(t for t in times_ms.values() if t and t > 0)
    rows = [{"op": op, "calls": d["calls"], "modules": d["modules"], "time_ms": times_ms.get(op),
             "pct_of_time": 100.0 * times_ms[op] / total if total and times_ms.get(op) else None}
            for op, d in count.not_counted.items()]
    rows.sort(key=lambda r: -(r["time_ms"] or 0.0))
    return rows


def roofline_rows(ops: dict[str, dict], times_ms: dict[str, float], roofs: dict) -> list[dict]:
    """One row per op with a measured time and counted work, slowest first."""
    peak = roofs["peak_flops"]
    rows = []
    for name, work in ops.items():
        t = times_ms.get(name)
        if not t or t <= 0 or (work["flops"] <= 0 and work["bytes"] <= 0):
            continue
        flops, nbytes = work["flops"], work["bytes"]
        bw, level = memory_roof(nbytes / max(1, work["calls"]), roofs)
        intensity = flops / nbytes if nbytes else None
        roof_rate = peak if intensity is None else min(peak, bw * intensity)
        roof_ms = max(flops / peak, nbytes / bw) * 1e3
        achieved = flops / (t / 1e3)
        bound = "compute" if intensity is None or intensity >= peak / bw else "memory"
        rows.append({
            "op": name, "calls": work["calls"], "flops": flops, "bytes": nbytes, "time_ms": t,
            "achieved_tflops": achieved / 1e12, "achieved_bytes_per_s": nbytes / (t / 1e3),
            "intensity": intensity, "roof_tflops": roof_rate / 1e12, "bound": bound, "roof_ms": roof_ms,
            "memory_roof": level,
            "headroom_ms": max(0.0, t - roof_ms), "pct_of_roof": 100.0 * roof_ms / t,
            "above_roof": roof_ms > t * ABOVE_ROOF_TOLERANCE,
        })
    rows.sort(key=lambda r: -r["time_ms"])
    return rows


def module_mfu(rows: list[dict], module_flops: dict[str, int], steps: int, peak_flops: float,
               root_name: str, not_counted: dict[str, dict[str, int]] | None = None) -> None:
    """Add ``flops``, ``mfu`` and ``flops_not_counted`` (the ops under the module whose FLOPs the count
    leaves out, or None) to each module row of the profiler (forward + backward time per step)."""
    for r in rows:
        key = "" if r["name"] == root_name else r["name"]
        f = module_flops.get(key)
        t_ms = ((r.get("forward_ms") or 0.0) + (r.get("backward_ms") or 0.0)) / max(1, steps)
        missing = sorted((not_counted or {}).get(key, {}))
        r["flops"] = f
        r["mfu"] = mfu(f, t_ms, peak_flops) if f else None
        r["flops_not_counted"] = ", ".join(missing) or None


def mfu(model_flops: float, step_ms: float, peak_flops: float) -> float | None:
    """Model FLOPs utilisation: FLOPs a step needs / (its time x the peak FLOP/s)."""
    if not model_flops or not step_ms or not peak_flops:
        return None
    return model_flops / (step_ms / 1e3) / peak_flops
