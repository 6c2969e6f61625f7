"""profile_steps: marked steps under torch.profiler, returned as a Trace the step views read; with_rank_info:
the one way an exported trace gets its rank (the Profiler's process and each torchrun rank)."""

import json

import pytest
import torch
from torch import nn

from diagnostics.measure.profiling import SINGLE_PROCESS, profile_steps, with_rank_info, written_rank_info
from diagnostics.trace.classify import host_op_mask
from diagnostics.trace.breakdowns import steps


def test_marked_steps_come_back_as_a_trace():
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    x = torch.randn(16, 8)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()

    between = []
    trace = profile_steps(step, 3, "cpu", between=lambda: between.append(torch.ones(2).cumsum(0)))
    st = steps(trace)
    assert st["step"].tolist() == [0, 1, 2] and st["name"].tolist()[0] == "ProfilerStep#0"
    assert len(between) == 3
    ev = trace.events
    ts = ev["ts"].to_numpy()
    names = trace.strings("name")
    inside = [((ts >= s) & (ts <= s + d)) for s, d in zip(st["start_us"], st["dur_us"])]
    ops = host_op_mask(trace)
    for win in inside:  # each step holds its forward and backward
        assert "aten::addmm" in set(names[ops & win]) and "aten::mm" in set(names[ops & win])
    # what runs between the steps is outside every step
    sums = ops & (names == "aten::cumsum")
    assert sums.sum() >= 3 and not (sums & (inside[0] | inside[1] | inside[2])).any()


EVENTS = [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]


@pytest.mark.parametrize("info", [None, {"world_size": 1}, {"rank": 3, "world_size": 4, "backend": "gloo"}, "junk"])
def test_an_exported_trace_gets_a_rank_when_it_has_none(tmp_path, info):
    from diagnostics.trace import load_trace

    doc = {"schemaVersion": 1, "traceEvents": EVENTS}
    if info is not None:
        doc["distributedInfo"] = info
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=2))
    trace = load_trace(path)
    data = path.read_bytes()
    assert written_rank_info(data) == trace.meta.get("distributedInfo") == info
    out, kept = with_rank_info(data, trace.meta.get("distributedInfo"))
    want = info if isinstance(info, dict) and "rank" in info else SINGLE_PROCESS
    assert json.loads(out)["distributedInfo"] == want == kept
    assert (out is data) == (want is info)  # one that names its rank: the bytes untouched
    assert json.loads(out)["traceEvents"] == EVENTS and json.loads(out)["schemaVersion"] == 1


def test_a_ranks_trace_gets_its_rank_and_keeps_what_else_the_profiler_wrote():
    data = json.dumps({"distributedInfo": {"pg_count": 2}, "traceEvents": EVENTS}).encode()
    out, info = with_rank_info(data, written_rank_info(data), 3, 4, "gloo")
    assert json.loads(out)["distributedInfo"] == info == {"pg_count": 2, "rank": 3, "world_size": 4, "backend": "gloo"}
    spliced, info = with_rank_info(b'  {"traceEvents": []}', None, 1, 2, "nccl")  # no second parse: spliced in
    assert json.loads(spliced) == {"distributedInfo": {"rank": 1, "world_size": 2, "backend": "nccl"}, "traceEvents": []}
    assert json.loads(with_rank_info(b"{ }", None)[0]) == {"distributedInfo": SINGLE_PROCESS}  # nothing to put a comma before


def test_the_torchrun_rank_fills_in_its_file_once(tmp_path):
    from diagnostics.analyses.distributed.rank_main import _ensure_distributed_info

    p = tmp_path / "rank3.pt.trace.json"
    p.write_text(json.dumps({"traceEvents": EVENTS}))
    _ensure_distributed_info(p, 3, 4, "gloo")
    assert json.loads(p.read_text())["distributedInfo"] == {"rank": 3, "world_size": 4, "backend": "gloo"}
    before = p.stat().st_mtime_ns, p.read_bytes()
    _ensure_distributed_info(p, 3, 4, "gloo")  # already there: left alone, not rewritten
    assert (p.stat().st_mtime_ns, p.read_bytes()) == before
    assert not list(tmp_path.glob("*.tmp"))
