"""The optimize job reports its rows as they come (ctx.partial) and stops timing a fix once its verdict is
decided (measure.compare's interim looks), in the job itself: the baseline's row first, each fix's once it is
built and checked, the speed-ups while the rounds run, and the final rows agreeing with what was reported."""

import pytest
import torch

from diagnostics.analyses.optimize import trials
from diagnostics.analyses.optimize.result import OptimizePartial, OptimizeResult, TimingStop
from diagnostics.measure import compare
from diagnostics.results import UNSET
from diagnostics.runner import Job, execute
from diagnostics.spec import ModelSpec


def _run(tmp_path, monkeypatch, **options) -> tuple[OptimizeResult, list[OptimizePartial]]:
    monkeypatch.setattr(trials, "REPORT_EVERY_S", 0.0)  # every round reported
    partials = []
    job = Job("optimize", ModelSpec(name="mlp", batch_size=4),
              {"warmup": 1, "save_artifacts": False, **options})
    result = execute(job, tmp_path, partial=partials.append)
    return result, partials


def test_rows_are_reported_as_each_is_built_then_while_the_rounds_run(tmp_path, monkeypatch):
    result, partials = _run(tmp_path, monkeypatch, fixes=["inference_mode", "torchscript"], iters=6, early_stop=False)
    assert all(isinstance(p, OptimizePartial) for p in partials)  # typed, as they crossed the worker's pipe
    built = [[r.fix for r in p.rows] for p in partials if p.stage.startswith("built")]
    assert built == [["baseline"], ["baseline", "inference_mode"], ["baseline", "inference_mode", "torchscript"]]
    assert all(p.fixes == ("inference_mode", "torchscript") and p.mode == "inference" for p in partials)
    timing = [p for p in partials if p.stage.startswith("timing")]
    assert [p.stage for p in timing] == [f"timing: round {i}, 0 decided" for i in range(1, 7)]
    for i, p in enumerate(timing, 1):
        rows = {r.fix: r for r in p.rows}
        assert list(rows) == ["baseline", "control", "inference_mode", "torchscript"]
        for k in ("control", "inference_mode", "torchscript"):  # a speed-up so far, no verdict before the end
            assert rows[k].measuring == f"round {i}" and rows[k].verdict is None and rows[k].speedup > 0
        assert rows["baseline"].rounds == i
    # what was reported while building is what the result holds
    last_built = {r.fix: r for r in partials[2].rows}
    final = {r.fix: r for r in result.rows}
    for k in ("baseline", "inference_mode", "torchscript"):
        assert final[k].cosine == last_built[k].cosine and final[k].size_bytes == last_built[k].size_bytes
    assert final["torchscript"].measuring is UNSET and final["torchscript"].verdict is not None
    assert result.timing_stop == TimingStop(planned=6, run=6, reason=None, looks=(), budget_s=None)


def _fake_clock(monkeypatch, ms_of):
    """time_once with a fake clock: each call costs ``ms_of(model)`` ms times 1 +- 1 % noise (seeded)."""
    rng = torch.Generator().manual_seed(0)

    def time_once(fn, device):
        model = next(c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, torch.nn.Module))
        fn()
        return ms_of(model) * (1 + 0.01 * (2 * torch.rand((), generator=rng).item() - 1))

    monkeypatch.setattr(compare, "time_once", time_once)


def test_a_decided_fix_leaves_the_rounds_and_the_others_run_to_the_end(tmp_path, monkeypatch):
    _fake_clock(monkeypatch, lambda m: 5.0 if isinstance(m, torch.jit.ScriptModule) else 10.0)
    result, partials = _run(tmp_path, monkeypatch, fixes=["inference_mode", "torchscript"], iters=20)
    rows = {r.fix: r for r in result.rows}
    ts, same = rows["torchscript"], rows["inference_mode"]
    assert ts.decided_at == 11 and ts.rounds == 11 and ts.verdict == "faster"
    assert ts.speedup == pytest.approx(2.0, rel=0.02)
    assert same.decided_at is None and same.rounds == 20 and same.verdict == "within noise"
    assert result.timing_stop.run == 20 and result.timing_stop.reason is None
    assert any(n.startswith("early stop: Interim looks at rounds 11, 13, 15, 17, 19") for n in result.notes)
    # the decided row was reported, final, at its look, while the other was still measuring
    at_look = next(p for p in partials if p.stage == "timing: round 11, 1 decided")
    reported = {r.fix: r for r in at_look.rows}
    assert reported["torchscript"].verdict == "faster" and reported["torchscript"].measuring is UNSET
    assert reported["torchscript"].speedup_ci == ts.speedup_ci
    assert reported["inference_mode"].measuring == "round 11"


def test_every_fix_decided_stops_the_comparison_and_off_runs_every_round(tmp_path, monkeypatch):
    _fake_clock(monkeypatch, lambda m: 5.0 if isinstance(m, torch.jit.ScriptModule) else 10.0)
    result, _ = _run(tmp_path, monkeypatch, fixes=["torchscript"], iters=20)
    assert result.timing_stop.run == 11 and result.timing_stop.reason == "decided"
    assert result.rows[0].rounds == 11
    assert any("timing stopped after 11 of 20 rounds: every candidate's verdict was decided" in n
               for n in result.notes)
    off, _ = _run(tmp_path / "off", monkeypatch, fixes=["torchscript"], iters=20, early_stop=False)
    assert off.timing_stop.run == 20 and off.rows[0].rounds == 20
    assert {r.fix: r.verdict for r in off.rows} == {r.fix: r.verdict for r in result.rows}


def test_partials_cross_the_workers_pipe_typed_and_the_cli_prints_each_line_once(tmp_path):
    """Through a real worker: run_job's on_partial gets OptimizePartial (encoded in the worker, decoded in the
    runner: one serialisation), and the CLI's printer (the declared partial_text) prints each line once."""
    import io

    from diagnostics.cli.main import ProgressBar, partial_printer
    from diagnostics.runner import run_job

    out = io.StringIO()
    show, finish = partial_printer("optimize", ProgressBar("optimize", enabled=False), out)
    seen = []
    outcome = run_job(Job("optimize", ModelSpec(name="mlp", batch_size=4),
                          {"fixes": ["inference_mode", "conv_bn_fusion"], "iters": 2, "warmup": 0,
                           "save_artifacts": False}),
                      artifact_dir=tmp_path, on_partial=lambda p: (seen.append(p), show(p)))
    assert outcome.status == "ok", outcome.error
    assert seen and all(isinstance(p, OptimizePartial) for p in seen)
    finish(outcome.result)
    lines = out.getvalue().splitlines()
    assert lines[:3] == [
        f"  Baseline (eval, no_grad): built · cosine 1.0000 · top-1 100.0 % · first call {lines[0].rsplit(' call ', 1)[1]}",
        lines[1], "  Conv-BN fusion: not applicable: no BatchNorm layers"]
    assert lines[1].startswith("  inference_mode: built · cosine 1.0000") and len(lines) == len(set(lines)) == 5
    assert lines[4].startswith("  inference_mode: ") and lines[4].endswith("(no interval), within noise")
