"""profile_steps: marked steps under torch.profiler, returned as a Trace the step views read."""

import torch
from torch import nn

from diagnostics.measure.profiling import profile_steps
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
