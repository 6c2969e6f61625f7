"""Writes h200_run2.json.gz from the allocator snapshots of run 2 (pickles of torch.cuda.memory._snapshot()
by bench/gpu/plan_snapshots.py, since folded into bench/gpu/plan_cuda.py --snapshots; on an NVIDIA H200,
torch 2.11.0+cu130, run by the lead; /work/notes/gpu/run2/snap-<case>.pickle and snap.log).

    python tests/data/plan/make_h200_run2.py SNAPSHOT_DIR

Per case: the blocks alive when recording started (address, size) (reconstructed by replaying the trace backwards from the
snapshot's segments), every alloc / free of the recorded window (requested bytes, address), the index of
the measured step's first event and the allocator's own figures for the measured step
(allocated_bytes.all.peak etc. from snap.log). No Python stacks are kept.
"""

import gzip
import json
import pickle
import sys
from pathlib import Path

PEAKS = {  # snap.log: allocated_bytes.all.peak, requested_bytes.all.peak, reserved_bytes.all.peak
    0: (340220928, 337860616, 350224384), 3: (81161216, 81157804, 92274688),
    5: (1066693632, 1061904456, 1157627904), 6: (1230489088, 1207263716, 1264582656),
}
LABELS = {0: "transformer b32 s256 fp32 adamw", 3: "mlp b4096 fp32 adam", 5: "gpt2 b8 s512 bf16 adamw",
          6: "llama b8 s512 amp_bf16 adamw_fused"}


def case(path: Path, i: int) -> dict:
    snap = pickle.load(open(path, "rb"))
    trace = snap["device_traces"][0]
    live = {b["address"]: b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    for e in reversed(trace):
        if e["action"] == "alloc":
            live.pop(e["addr"], None)
        elif e["action"] == "free_completed":
            live[e["addr"]] = e["size"]
    start = next(k for k, e in enumerate(trace) if any(f["name"] == "measure_peak" for f in e["frames"]))
    events = [["a" if e["action"] == "alloc" else "f", e["addr"], e["size"]] for e in trace[:start]
              if e["action"] in ("alloc", "free_requested")]
    first = len(events)
    events += [["a" if e["action"] == "alloc" else "f", e["addr"], e["size"]] for e in trace[start:]
               if e["action"] in ("alloc", "free_requested")]
    peak, requested, reserved = PEAKS[i]
    return {"case": LABELS[i], "initial": [[a, live[a]] for a in sorted(live)], "events": events, "measured_from": first,
            "allocated_peak": peak, "requested_peak": requested, "reserved_peak": reserved}


if __name__ == "__main__":
    src = Path(sys.argv[1])
    out = {str(i): case(src / f"snap-{i}.pickle", i) for i in PEAKS}
    with gzip.open(Path(__file__).with_name("h200_run2.json.gz"), "wt") as f:
        json.dump(out, f, separators=(",", ":"))
