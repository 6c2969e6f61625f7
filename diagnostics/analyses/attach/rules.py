"""What only a real run can tell, as findings in the checklist's form (diagnostics.findings), each
with the milliseconds per step it costs (``numbers["saving_ms"]``: what fixing it could save at most),
so that they rank in "fix this first". One visible list, ``RULES``; every threshold a named constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from diagnostics.findings import (COMMUNICATION_FRACTION_MAX, DATALOADER_FRACTION_MAX, GPU_UTILIZATION_MIN,
                                  LAUNCH_BOUND_MEDIAN_US, LAUNCH_BOUND_MIN_OPS, PREFETCH_FACTOR_MIN, Finding, FixFirst,
                                  Rule, not_applicable)

# ---------------------------------------------------------------------------- thresholds
# Those the checklist judges a step by too are its own constants, declared once (diagnostics.findings),
# named here for what a real run measures.
#: Share of the step the main thread may wait for DataLoader batches (the checklist's DATALOADER_FRACTION_MAX).
DATA_WAIT_SHARE_MAX = DATALOADER_FRACTION_MAX
#: Share of the step in Python outside torch's calls ("host") that warns, and that fails.
HOST_SHARE_WARN = 0.30
HOST_SHARE_FAIL = 0.50
#: Device syncs costing more than this per step (ms) warn; over SYNC_SHARE_FAIL of the step they fail.
SYNC_MS_WARN = 0.1
SYNC_SHARE_FAIL = 0.10
#: Share of the step in communication over which it is reported (the checklist's COMMUNICATION_FRACTION_MAX).
COMM_SHARE_MAX = COMMUNICATION_FRACTION_MAX
#: Share of the step the GPU may sit idle (the checklist's GPU_UTILIZATION_MIN busy).
GPU_IDLE_SHARE_MAX = 1.0 - GPU_UTILIZATION_MIN
#: Launch-bound: at least this many kernels per step, of median duration under LAUNCH_BOUND_MEDIAN_US
#: (the checklist's launch-bound rule), while the GPU idles over GPU_IDLE_SHARE_LAUNCH of the step.
LAUNCH_BOUND_MIN_KERNELS = LAUNCH_BOUND_MIN_OPS
GPU_IDLE_SHARE_LAUNCH = 0.20
# PREFETCH_FACTOR_MIN: the checklist's, under its own name.

THRESHOLDS = [
    ("DATA_WAIT_SHARE_MAX", DATA_WAIT_SHARE_MAX, "max share of the step waiting for DataLoader batches"),
    ("HOST_SHARE_WARN", HOST_SHARE_WARN, "share of the step in Python outside torch calls that warns"),
    ("HOST_SHARE_FAIL", HOST_SHARE_FAIL, "... that fails"),
    ("SYNC_MS_WARN", SYNC_MS_WARN, "device-sync ms per step that warn"),
    ("SYNC_SHARE_FAIL", SYNC_SHARE_FAIL, "share of the step in device syncs that fails"),
    ("COMM_SHARE_MAX", COMM_SHARE_MAX, "max share of the step in communication"),
    ("GPU_IDLE_SHARE_MAX", GPU_IDLE_SHARE_MAX, "max share of the step the GPU idles"),
    ("LAUNCH_BOUND_MIN_KERNELS", LAUNCH_BOUND_MIN_KERNELS, "kernels per step for the launch-bound rule"),
    ("LAUNCH_BOUND_MEDIAN_US", LAUNCH_BOUND_MEDIAN_US, "median kernel time (µs) under which kernels are tiny"),
    ("GPU_IDLE_SHARE_LAUNCH", GPU_IDLE_SHARE_LAUNCH, "GPU idle share from which tiny kernels are the cause"),
    ("PREFETCH_FACTOR_MIN", PREFETCH_FACTOR_MIN, "min DataLoader prefetch_factor"),
]


@dataclass(frozen=True)
class Facts:
    """What the rules read: the headline process' figures (job._figures), every rank's, the rank the
    others wait for, the machine's CPU count."""

    head: dict | None
    ranked: list
    waited_for: int | None
    cpu_count: int


na = not_applicable


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _step(f: Facts):
    h = f.head
    if not h or not h["step_ms"]:
        return None, {}
    return h["step_ms"], h["breakdown_ms"]


# ---------------------------------------------------------------------------- rules
def check_data_wait(f: Facts):
    step, b = _step(f)
    if step is None:
        return na("no step was measured")
    wait = b.get("data_wait", 0.0)
    share = wait / step
    w = f.head["workers"]
    loader = w.get("loader") or {}
    nums = {"saving_ms": wait, "data_wait_ms": wait, "step_ms": step, "share": share}
    ev = f"the main thread waited {wait:.2f} ms per step for DataLoader batches: {_pct(share)} of the {step:.2f} ms step"
    if not loader:
        ev += " (no torch DataLoader was iterated: the wait is in DataLoader calls only)"
    if share <= DATA_WAIT_SHARE_MAX:
        return "pass", ev + f" (max {_pct(DATA_WAIT_SHARE_MAX)})", "", nums
    tips = []
    n = loader.get("num_workers")
    per_batch, compute = w.get("fetch_collate_ms"), w.get("step_compute_ms") or 0.0
    if loader and not n:
        tips.append(f"num_workers is 0: every batch is loaded in the main process, in the step ({wait:.2f} ms). "
                    "Set num_workers so batches load while the step computes")
        needed = math.ceil(wait / compute) if compute > 0 else None
        if needed:
            tips.append(f"a batch takes {wait:.2f} ms to load and the rest of the step {compute:.2f} ms: at least "
                        f"{needed} worker(s) keep up")
            nums["workers_needed"] = needed
    elif per_batch is not None and n:
        needed = w.get("workers_needed")
        supply = w.get("supply_interval_ms")
        ev += (f"; each of the {n} worker(s) takes {per_batch:.2f} ms per batch (fetch + collate, median; collate "
               f"{w.get('collate_ms') or 0:.2f} ms), so they deliver a batch every {supply:.2f} ms while the step uses "
               f"one every {w.get('demand_interval_ms') or 0:.2f} ms")
        nums.update(fetch_collate_ms=per_batch, num_workers=n, workers_needed=needed)
        if needed and needed <= f.cpu_count:
            tips.append(f"too few workers: {needed} worker(s) would keep up (this machine has {f.cpu_count} CPUs); "
                        f"set num_workers={needed}")
        elif needed:
            tips.append(f"the workers are too slow: {needed} workers would be needed but this machine has "
                        f"{f.cpu_count} CPUs. Make each batch cheaper (decode or augment less in __getitem__, "
                        "precompute, cache, or move the transforms to the GPU)")
    if loader:
        if loader.get("prefetch_factor") is not None and loader["prefetch_factor"] < PREFETCH_FACTOR_MIN:
            tips.append(f"prefetch_factor is {loader['prefetch_factor']} (< {PREFETCH_FACTOR_MIN})")
        starts = loader.get("iter_starts_ms") or []
        if n and not loader.get("persistent_workers") and len(starts) > 1:
            tips.append(f"persistent_workers is off: the workers start again every epoch ({_median(starts):.1f} ms "
                        "each time); set persistent_workers=True")
        if f.head["model"].get("cuda") and not loader.get("pin_memory"):
            tips.append("pin_memory is off: pinned batches copy to the GPU faster and asynchronously")
    status = "fail" if share > 2 * DATA_WAIT_SHARE_MAX else "warn"
    return status, ev, ". ".join(tips) + ("." if tips else ""), nums


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def check_host(f: Facts):
    step, b = _step(f)
    if step is None:
        return na("no step was measured")
    host = b.get("host", 0.0)
    share = host / step
    nums = {"saving_ms": host, "host_ms": host, "share": share}
    ev = (f"{host:.2f} ms per step ({_pct(share)}) ran in Python outside the timed torch calls (data, forward, "
          "backward, optimizer, communication, syncs)")
    if share < HOST_SHARE_WARN:
        return "pass", ev, "", nums
    return ("fail" if share >= HOST_SHARE_FAIL else "warn", ev,
            "The step is host-bound: look at what the loop does between the model's calls (logging, metrics, "
            "Python loops over tensors, per-sample work) in the trace; run again with --stacks to see the Python "
            "lines, and move the work out of the step or into torch ops.", nums)


def check_syncs(f: Facts):
    step, _ = _step(f)
    if step is None:
        return na("no step was measured")
    syncs = f.head["syncs"]
    if not f.head["model"].get("cuda"):
        return na("no CUDA device in use: .item() and .cpu() do not wait for a device")
    if not syncs:
        return "pass", "no .item(), .tolist(), bool(), .cpu() of a device tensor or cuda.synchronize() in the steps", "", {}
    ms = sum(s["ms_per_step"] for s in syncs)
    where = "; ".join(f"{s['location']} ({s['calls_per_step']:.3g} per step, {s['ms_per_step']:.3f} ms)"
                      for s in syncs[:5])
    nums = {"saving_ms": ms, "sync_ms": ms, "sites": len(syncs), "top": syncs[:5]}
    ev = f"the host waited {ms:.3f} ms per step for the GPU at {len(syncs)} line(s): {where}"
    if ms < SYNC_MS_WARN:
        return "pass", ev, "", nums
    return ("fail" if ms / step > SYNC_SHARE_FAIL else "warn", ev,
            "Each of these lines makes the CPU wait until the GPU has finished everything queued: keep values on "
            "the device (accumulate a loss tensor and read it every N steps), log less often, avoid bool() of a "
            "tensor in the loop.", nums)


def check_recompiles(f: Facts):
    h = f.head
    if not h:
        return na("no step was measured")
    rc = h.get("recompiles")
    if rc is None or (not rc["graphs_before"] and not rc["graphs_after_warmup"]):
        return na("torch.compile was not used (no graph was compiled)")
    n = rc["graphs_after_warmup"]
    nums = {"graphs_after_warmup": n, "steps": rc["steps"][:20],
            "saving_ms": rc["extra_ms_total"] / max(1, h["steps"]) if n else 0.0}
    if n <= 0:
        return "pass", f"no graph was compiled after warm-up ({rc['graphs_before']} before)", "", nums
    return ("fail", f"{n} graph(s) were compiled after warm-up, in step(s) {rc['steps'][:10]}, costing "
            f"{rc['extra_ms_total']:.1f} ms in all",
            "Recompiles after warm-up come from changing shapes, dtypes or Python values the graph guards on: mark "
            "dynamic dimensions (torch._dynamo.mark_dynamic), pad batches to fixed sizes, or look at "
            "TORCH_LOGS=recompiles.", nums)


def check_comm(f: Facts):
    step, b = _step(f)
    if step is None:
        return na("no step was measured")
    comm = b.get("comm", 0.0)
    if len(f.ranked) < 2 and comm == 0:
        return na("one process, no collectives")
    share = comm / step
    nums = {"saving_ms": comm, "comm_ms": comm, "share": share, "waited_for_rank": f.waited_for}
    ev = f"{comm:.2f} ms per step ({_pct(share)}) in collectives"
    if f.waited_for is not None:
        busy = {r["rank"]: r["busy_ms"] for r in f.ranked}
        ev += (f"; the others wait for rank {f.waited_for} (busy {busy[f.waited_for]:.2f} ms per step against "
               + ", ".join(f"rank {k}: {v:.2f} ms" for k, v in busy.items() if k != f.waited_for) + ")")
    if share <= COMM_SHARE_MAX:
        return "pass", ev, "", nums
    tip = (f"Rank {f.waited_for} is slower than the others: balance its work (data, sequence lengths) or look at "
           "what else runs on its device." if f.waited_for is not None else
           "Overlap communication with computation (DDP's bucketing, gradient accumulation with no_sync), send "
           "less (bf16 gradients, fewer all-reduces).")
    return "fail" if share > 2 * COMM_SHARE_MAX else "warn", ev, tip, nums


def _gpu_idle(g: dict) -> tuple[float, float]:
    """(GPU idle ms per profiled step, its share of the median profiled step)."""
    step = _median([r["step_ms"] for r in g["steps"]])
    idle = g["idle_ms_per_step"]
    return idle, idle / step if step else 0.0


def check_gpu_idle(f: Facts):
    h = f.head
    if not h or not h.get("gpu"):
        return na("no GPU work in the trace")
    g = h["gpu"]
    idle, share = _gpu_idle(g)
    causes = g.get("idle_causes_ms_per_step") or {}
    why = ", ".join(f"{k} {v:.2f} ms" for k, v in list(causes.items())[:4])
    nums = {"saving_ms": idle, "gpu_idle_ms": idle, "share": share, "causes": causes}
    ev = (f"the GPU was idle {idle:.2f} ms per profiled step ({_pct(share)}); meanwhile the host was in: "
          f"{why or 'not placed'}")
    if share <= GPU_IDLE_SHARE_MAX:
        return "pass", ev, "", nums
    top = next(iter(causes), None)
    tip = {"data_wait": "The GPU waits for data: see the data loader finding.",
           "host": "The GPU waits for Python: see the host finding.",
           "sync": "The GPU waits after the host waited for it: see the sync finding."}.get(
        top, "Keep the GPU fed: overlap host work with device work.")
    return "fail", ev, tip, nums


def check_launch_bound(f: Facts):
    h = f.head
    if not h or not h.get("gpu"):
        return na("no GPU work in the trace")
    g = h["gpu"]
    k, med = g.get("kernels_per_step") or 0, g.get("kernel_us_median")
    idle, share = _gpu_idle(g)
    nums = {"kernels_per_step": k, "kernel_us_median": med, "gpu_idle_share": share,
            "saving_ms": idle if k >= LAUNCH_BOUND_MIN_KERNELS and med is not None
            and med < LAUNCH_BOUND_MEDIAN_US else 0.0}
    ev = f"{k:.0f} kernels per step, median {med or 0:.1f} µs; the GPU idles {_pct(share)} of the step"
    if k >= LAUNCH_BOUND_MIN_KERNELS and med is not None and med < LAUNCH_BOUND_MEDIAN_US \
            and share > GPU_IDLE_SHARE_LAUNCH:
        return ("warn", ev, "Many tiny kernels: the CPU cannot launch them as fast as the GPU runs them. Fuse them "
                "(torch.compile), use CUDA graphs, or larger batches.", nums)
    return "pass", ev, "", nums


def check_gradients(f: Facts):
    h = f.head
    g = (h or {}).get("gradients")
    if not g:
        return na("no gradients were read (no optimizer step in the profiled steps)")
    m = g["metrics"]
    flagged = [l for l in g["layers"] if l["status"] != "healthy"]
    ev = f"{m['layers']} layer(s) in the profiled steps: {g['verdict']}"
    if not flagged:
        return "pass", ev, "", {"layers": m["layers"]}
    ev += "; " + "; ".join(f"{l['layer']}: {l['status']} ({l['reason']})" for l in flagged[:5])
    return ("fail" if any(l["status"] in ("exploding", "non-finite") for l in flagged) else "warn", ev,
            "Open the Gradient flow view of this run for every layer.", {"layers_flagged": len(flagged)})


RULES = [
    Rule("data_wait", "The step waits for data", "data pipeline", check_data_wait),
    Rule("host_bound", "Python between torch calls", "compute", check_host),
    Rule("device_syncs", "Device syncs in the loop", "compute", check_syncs),
    Rule("recompiles", "Recompiles after warm-up", "compute", check_recompiles),
    Rule("communication", "Communication", "compute", check_comm),
    Rule("gpu_idle", "GPU idle in the step", "compute", check_gpu_idle),
    Rule("launch_bound", "Small kernels, launch-bound", "compute", check_launch_bound),
    Rule("gradient_flow", "Gradient flow of the real model", "model design", check_gradients),
]


def evaluate(facts: Facts) -> list[Finding]:
    return [rule(facts) for rule in RULES]


def fix_first_row(f: Finding) -> FixFirst:
    saving = f.numbers.get("saving_ms")
    return FixFirst(title=f.title, est_saving_ms=saving if saving else None,
                    how="measured: the part of the step it takes, from the run (at most what fixing it saves)"
                    if saving else "not estimated", source=f"run: {f.id}", fix=f.fix, detail=f.evidence)
