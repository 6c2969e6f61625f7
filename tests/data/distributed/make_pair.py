"""Writes pair/rank0.pt.trace.json and pair/rank1.pt.trace.json: a hand-made 2-rank gloo trace.

The expected numbers in tests/distributed/test_analysis.py were worked out by hand from the
events below (all times in microseconds); see that file for the arithmetic.
"""

import json
from pathlib import Path


def X(name, ts, dur, tid=1, cat="cpu_op", args=None):
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur,
            "args": args or {}}


def meta(rank):
    return [
        {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "ts": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 2, "ts": 0,
         "args": {"name": "thread 2 (pt_gloo_runloop)"}},
    ]


FLOAT_1000 = {"Input Dims": [[1000]], "Input type": ["float"]}
TENSORLIST = {"Input Dims": [[[1000]], [], []], "Input type": ["TensorList", "", ""]}
PARAM_COMMS = {"In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float", "Collective name": "allreduce"}

rank0 = [
    X("gloo:broadcast", 500, 100, tid=2, cat="user_annotation", args=FLOAT_1000),  # before the steps
    X("ProfilerStep#1", 1000, 1000, cat="user_annotation"),
    X("aten::addmm", 1100, 200),
    X("aten::relu", 1250, 30),
    X("c10d::allreduce_", 1400, 50, args=TENSORLIST),
    X("aten::copy_", 1410, 20),  # inside the thread's own collective: not computation
    X("gloo:all_reduce", 1420, 380, tid=2, cat="user_annotation", args=FLOAT_1000),
    X("aten::mm", 1700, 200),
    X("ProfilerStep#2", 2000, 1000, cat="user_annotation"),
    X("aten::addmm", 2100, 100),
    X("c10d::allreduce_", 2300, 20, args=TENSORLIST),
    X("gloo:all_reduce", 2310, 300, tid=2, cat="user_annotation", args=FLOAT_1000),
    X("aten::broadcast_tensors", 2700, 50),  # an aten op named like a collective: computation
]
rank1 = [  # its own clock: starts at 11000
    X("ProfilerStep#1", 11000, 1000, cat="user_annotation"),
    X("aten::addmm", 11050, 600),
    X("record_param_comms", 11695, 30, args=PARAM_COMMS),
    X("c10d::allreduce_", 11700, 20, args=TENSORLIST),
    X("gloo:all_reduce", 11705, 55, tid=2, cat="user_annotation", args=FLOAT_1000),
    X("aten::mm", 11740, 100),
    X("ProfilerStep#2", 12000, 1000, cat="user_annotation"),
    X("aten::addmm", 12100, 800),
    X("record_param_comms", 12910, 20, args=PARAM_COMMS),
    X("c10d::allreduce_", 12912, 16, args=TENSORLIST),
    X("gloo:all_reduce", 12915, 35, tid=2, cat="user_annotation", args=FLOAT_1000),
]

out = Path(__file__).parent / "pair"
out.mkdir(exist_ok=True)
for rank, events in ((0, rank0), (1, rank1)):
    doc = {"schemaVersion": 1,
           "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
           "traceEvents": meta(rank) + events}
    (out / f"rank{rank}.pt.trace.json").write_text(json.dumps(doc, indent=0))
