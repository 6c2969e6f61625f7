"""Fix trials, in this process: the fixes' names, the result built from a trials record (against numbers
computed here), and the trial guest installed into this interpreter's torch (each fix acting or saying why not,
and nothing of ours left afterwards)."""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from diagnostics.analyses.trials import protocol
from diagnostics.analyses.trials.job import build_result, max_rel_diff
from diagnostics.measure.compare import log_interval

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- names
def test_fixes_are_parsed_canonical_and_bad_ones_named_with_the_known_list():
    assert protocol.parse_fixes("amp_bf16, loader_workers=04,compile") == ("amp_bf16", "loader_workers=4", "compile")
    with pytest.raises(ValueError, match=r"unknown fix 'turbo'; known fixes: amp_bf16, .*loader_workers=N"):
        protocol.parse_fixes("amp_bf16,turbo")
    with pytest.raises(ValueError, match="loader_workers needs a whole number of at least 1"):
        protocol.parse_fixes("loader_workers")
    with pytest.raises(ValueError, match="the fix compile takes no value"):
        protocol.parse_fixes("compile=2")
    with pytest.raises(ValueError, match="the fix prefetch is given twice"):
        protocol.parse_fixes("prefetch=2,prefetch=4")


# ---------------------------------------------------------------------- the result of a record
def _outcome(losses, fixes=None, peak=100, warm=(50.0, 10.0, 10.0), done=True):
    return {"fixes": fixes or {}, "losses": list(losses), "grad_norms": [1.0] * len(losses), "peak_bytes": peak,
            "warmup_ms": list(warm), "done": done, "ended_by_us": True, "device": "cpu", "model": "Net",
            "steps_seen": 13}


def sample_record() -> dict:
    """A trials record of six rounds: a fix twice as fast, one not applicable, AMP with a small loss difference
    and a 2 s compile-like warm-up, one whose run crashed."""
    rng = np.random.default_rng(1)
    base = list(30 + rng.normal(0, 0.5, 6))
    control = list(30 + rng.normal(0, 0.5, 6))
    workers = list(15 + rng.normal(0, 0.5, 6))
    amp = list(31 + rng.normal(0, 0.5, 6))
    lw = {"loader_workers=2": {"applicable": True, "reason": "", "change": "DataLoader(..., num_workers=2) at t.py:9"}}
    runs = ([{"key": "baseline", "outcome": _outcome([0.7, 0.6, 0.5]), "error": None}]
            + [{"key": "control", "outcome": _outcome([0.7, 0.6, 0.5]), "error": None}]
            + [{"key": "loader_workers=2", "outcome": _outcome([0.7, 0.6, 0.5], lw, peak=140), "error": None}]
            + [{"key": "channels_last", "outcome": _outcome([0.7, 0.6, 0.5], {"channels_last": {
                "applicable": False, "reason": "no 4-D tensor", "change": None}}, done=False), "error": None}]
            + [{"key": "amp_bf16", "outcome": _outcome([0.7007, 0.6, 0.499], {"amp_bf16": {
                "applicable": True, "reason": "", "change": "autocast"}}, warm=(2050.0, 10.0, 10.0)), "error": None}]
            + [{"key": "fused_optimizer", "outcome": _outcome([0.7]), "error": "the script exited with code 1: Boom"}])
    record = {"fixes": ["loader_workers=2", "channels_last", "amp_bf16", "fused_optimizer"], "steps": 10, "warmup": 3,
              "rounds": 6, "runs": runs, "round_ms": {"baseline": base, "control": control,
                                                      "loader_workers=2": workers, "channels_last": [None],
                                                      "amp_bf16": amp, "fused_optimizer": [None]}}
    return record


def test_a_record_gives_speedups_intervals_and_costs_computed_independently():
    record = sample_record()
    base, workers = record["round_ms"]["baseline"], record["round_ms"]["loader_workers=2"]
    res = build_result(record, "/f")
    rows = {r.fix: r for r in res.trials}
    assert list(rows) == ["baseline", "control", "loader_workers=2", "channels_last", "amp_bf16", "fused_optimizer"]
    logs = np.log(np.array(base) / np.array(workers))
    lo, hi = log_interval(logs)
    w = rows["loader_workers=2"]
    assert w.speedup == pytest.approx(math.exp(logs.mean()))
    assert w.speedup_ci == pytest.approx((math.exp(lo), math.exp(hi)))
    assert w.step_ms == pytest.approx(math.exp(np.log(workers).mean()))
    assert w.verdict == "faster" and w.peak_bytes == 140 and w.rounds == 6
    assert rows["control"].verdict == "within noise"
    assert rows["channels_last"].verdict == "not applicable" and rows["channels_last"].reason == "no 4-D tensor"
    assert rows["channels_last"].speedup is None and rows["channels_last"].applicable is False
    a = rows["amp_bf16"]
    assert a.loss_max_rel_diff == pytest.approx(max(0.0007 / 0.7, 0.001 / 0.5))
    assert a.warmup_extra_ms == pytest.approx(2000.0)
    assert rows["fused_optimizer"].verdict == "failed" and "Boom" in rows["fused_optimizer"].reason
    assert res.metrics.best_fix == "loader_workers=2" and res.metrics.fixes_not_applicable == 1
    assert res.metrics.fixes_failed == 1
    assert res.changes == ("loader_workers=2: DataLoader(..., num_workers=2) at t.py:9",)


def test_losses_that_turn_non_finite_are_a_divergence_and_relative_differences_are_exact():
    assert max_rel_diff([1.0, 2.2], [1.0, 2.0]) == pytest.approx(0.1)
    assert max_rel_diff([1.0, float("nan")], [1.0, 2.0]) == math.inf
    assert max_rel_diff([], [1.0]) is None
    runs = [{"key": "baseline", "outcome": _outcome([0.7, 0.6, 0.5]), "error": None},
            {"key": "amp_fp16", "outcome": _outcome([0.7, float("inf"), float("nan")], {"amp_fp16": {
                "applicable": True, "reason": "", "change": "x"}}), "error": None}]
    record = {"fixes": ["amp_fp16"], "steps": 10, "warmup": 3, "rounds": 1, "runs": runs,
              "round_ms": {"baseline": [30.0], "control": [30.0], "amp_fp16": [20.0]}}
    row = build_result(record).trials[2]
    assert row.verdict == "diverged" and "non-finite" in row.reason and row.loss_max_rel_diff is None


# ---------------------------------------------------------------------- the guest in this process
def _load_guest():
    path = ROOT / "diagnostics" / "attach" / "fixes.py"
    spec = importlib.util.spec_from_file_location("_torchscope_trial_guest_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return x + torch.relu(self.conv(x))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.ModuleList(Block(4) for _ in range(3))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        self.seen_dtype = x.dtype
        self.seen_channels_last = x.is_contiguous(memory_format=torch.channels_last)
        return self.head(x.mean((2, 3)))


def _train(tmp_path, fixes, model, *, steps=2, warmup=2, loader=False, zero_false=False):
    """Install the guest with ``fixes``, train until it ends the loop (SystemExit), take it off; its outcome."""
    guest_mod = _load_guest()
    protocol.TrialConfig(fixes=fixes, warmup=warmup, steps=steps, compile_backend="eager").write(str(tmp_path))
    saved = {"backward": torch.Tensor.__dict__["backward"], "dl": torch.utils.data.DataLoader.__dict__["__init__"],
             "zg": torch.optim.Optimizer.__dict__["zero_grad"], "mzg": nn.Module.__dict__["zero_grad"]}
    g = guest_mod.install(torch, str(tmp_path), protocol)
    try:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        data = [(torch.randn(4, 3, 8, 8), torch.randint(0, 2, (4,))) for _ in range(8)]
        batches = torch.utils.data.DataLoader(data, batch_size=None) if loader else data
        with pytest.raises(SystemExit):
            for _ in range(3):
                for x, y in batches:
                    loss = nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad(set_to_none=not zero_false)
                    loss.backward()
                    opt.step()
    finally:
        atexit.unregister(g.at_exit)
        g.at_exit()
    # nothing of ours is left: class attributes back, global hooks gone
    assert torch.Tensor.__dict__["backward"] is saved["backward"]
    assert torch.utils.data.DataLoader.__dict__["__init__"] is saved["dl"]
    assert torch.optim.Optimizer.__dict__["zero_grad"] is saved["zg"] and nn.Module.__dict__["zero_grad"] is saved["mzg"]
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o

    assert not m._global_forward_pre_hooks and not m._global_forward_hooks
    assert not o._global_optimizer_pre_hooks and not o._global_optimizer_post_hooks
    out = json.loads(next(tmp_path.glob("trial-*.json")).read_text())
    return out, opt


def test_the_guest_applies_channels_last_amp_fused_and_checkpointing_and_leaves_nothing(tmp_path):
    torch.manual_seed(0)
    model = ConvNet()
    out, opt = _train(tmp_path, ("channels_last", "amp_bf16", "fused_optimizer", "checkpointing", "set_to_none"),
                      model, zero_false=True)
    f = out["fixes"]
    assert all(f[k]["applicable"] for k in ("channels_last", "amp_bf16", "fused_optimizer", "checkpointing",
                                            "set_to_none")), f
    assert model.seen_dtype == torch.bfloat16 and model.seen_channels_last  # inside the forward: autocast, NHWC
    assert model.stem.weight.is_contiguous(memory_format=torch.channels_last)
    assert all(g["fused"] for g in opt.param_groups)
    assert "3 Block blocks of ConvNet.blocks" in f["checkpointing"]["change"]
    assert "test_trials_unit.py:" in f["channels_last"]["change"] and "Adam(..., fused=True)" in f["fused_optimizer"]["change"]
    assert "zero_grad(set_to_none=True) at " in f["set_to_none"]["change"]
    assert out["done"] and len(out["step_ms"]) == 2 and len(out["losses"]) == 2 and len(out["grad_norms"]) == 2
    assert all(not hasattr(b, "forward") or "forward" not in b.__dict__ for b in model.blocks)  # wrappers taken off


def test_the_guest_says_why_a_fix_cannot_act(tmp_path):
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2))
    out, _ = _train(tmp_path, ("channels_last", "checkpointing", "loader_workers=2", "cudnn_benchmark", "set_to_none"),
                    mlp)
    f = out["fixes"]
    assert f["loader_workers=2"] == {"applicable": False, "reason": "no torch DataLoader: the script built none before "
                                     "its first steps", "change": None}
    assert f["checkpointing"]["applicable"] is False and "no repeated blocks" in f["checkpointing"]["reason"]
    assert f["cudnn_benchmark"]["applicable"] is False and "not CUDA" in f["cudnn_benchmark"]["reason"]
    assert f["set_to_none"]["applicable"] is False and "default since torch 2.0" in f["set_to_none"]["reason"]
    # the input is 4-D but the model has no 4-D parameter: channels_last still acts on the input
    assert f["channels_last"]["applicable"] is True
    assert not out["done"] or out["ended_by_us"]


def test_loader_fixes_change_the_dataloaders_arguments_and_name_its_line(tmp_path):
    model = ConvNet()
    out, _ = _train(tmp_path, ("prefetch=4", "pin_memory"), model, loader=True)
    f = out["fixes"]
    assert f["prefetch=4"]["applicable"] is False and "num_workers=0: prefetch_factor needs worker processes" in \
        f["prefetch=4"]["reason"]
    assert "test_trials_unit.py:" in f["prefetch=4"]["reason"]
    assert f["pin_memory"]["applicable"] is False and "no CUDA device" in f["pin_memory"]["reason"]


def test_amp_fp16_scales_the_loss_and_unscales_the_gradients_before_the_step(tmp_path):
    torch.manual_seed(0)
    model = ConvNet()
    out, opt = _train(tmp_path, ("amp_fp16",), model)
    assert out["fixes"]["amp_fp16"]["applicable"] and "GradScaler" in out["fixes"]["amp_fp16"]["change"]
    assert model.seen_dtype == torch.float16 and out["done"]
    # the gradient norms read before the step are the unscaled ones: of the order of the loss' gradients, not x65536
    assert all(0 < g < 100 for g in out["grad_norms"]), out["grad_norms"]
    assert all(math.isfinite(x) for x in out["losses"])


def test_the_report_and_the_cli_lines_show_the_rows_with_their_intervals(tmp_path):
    from diagnostics.render.charts.trials import build_trials_speedup_figure, summary_lines
    from diagnostics.render.html import write_report_folder

    res = build_result(sample_record(), "/f")
    lines = summary_lines(res)
    assert any(ln.startswith("loader_workers=2: x2.0") and "faster" in ln for ln in lines), lines
    assert "channels_last: not applicable: no 4-D tensor" in lines
    assert any(ln.startswith("fused_optimizer: failed: the script exited with code 1: Boom") for ln in lines)
    assert "change: loader_workers=2: DataLoader(..., num_workers=2) at t.py:9" in lines
    fig = build_trials_speedup_figure(res)
    bars = fig.data[0]
    assert list(bars.y) == ["control (baseline again: A/A)", "loader_workers=2", "amp_bf16"]  # baseline aside
    w = res.trials[2]
    assert bars.error_x.array[1] == pytest.approx(w.speedup_ci[1] - w.speedup)
    written = write_report_folder("trials", res, tmp_path / "rep", {}, title="t", meta={"run": "r", "source": "cli"})
    html = Path(written["report.html"]).read_text()
    assert "Fixes tried on the script" in html and "DataLoader(..., num_workers=2) at t.py:9" in html


def test_the_rounds_drop_a_fix_that_cannot_act_and_try_the_faster_ones_together(tmp_path, monkeypatch):
    """The orchestrator's logic with the runs replaced by figures (no process): a not-applicable fix leaves after its
    first run, two faster fixes are tried together in rounds of their own, the record reads back into the result."""
    from diagnostics.attach.command import check_command
    from diagnostics.attach.trials import Trials

    rng = np.random.default_rng(0)
    ms = {"baseline": 30.0, "control": 30.0, "loader_workers=2": 15.0, "fused_optimizer": 24.0,
          "loader_workers=2+fused_optimizer": 12.0}
    calls = []

    def fake(self, key, fixes, round_no):
        calls.append(key)
        na = key == "channels_last"
        states = {f: {"applicable": not na, "reason": "no 4-D tensor" if na else "", "change": None if na else f"do {f}"}
                  for f in fixes}
        self.runs.append({"key": key, "fixes": list(fixes), "round": round_no, "error": None,
                          "outcome": _outcome([0.7, 0.6, 0.5], states, done=not na)})
        if na:
            self.dead.add(key)
            return math.nan
        return ms[key] * float(np.exp(rng.normal(0, 0.02)))

    monkeypatch.setattr(Trials, "_run_once", fake)
    cmd = check_command([sys.executable, "-c", "pass"], str(tmp_path))
    t = Trials(cmd, "loader_workers=2,channels_last,fused_optimizer", rounds=6, folder=str(tmp_path / "t"))
    res = t.run().result
    assert calls.count("channels_last") == 1 and calls.count("loader_workers=2") == 6
    assert calls.count("loader_workers=2+fused_optimizer") == 6 and calls.count("baseline") == 12
    rows = {r.fix: r for r in res.trials}
    assert rows["loader_workers=2"].speedup == pytest.approx(2.0, rel=0.05) and rows["fused_optimizer"].verdict == "faster"
    assert rows["channels_last"].verdict == "not applicable"
    c = res.combination
    assert c.fix == "loader_workers=2+fused_optimizer" and c.verdict == "faster"
    assert c.speedup == pytest.approx(2.5, rel=0.05) and c.change == "do loader_workers=2; do fused_optimizer"
    assert res.metrics.best_fix == c.fix
    assert json.loads((tmp_path / "t" / "trials.json").read_text())["combination"]["key"] == c.fix


def test_the_cli_reads_try_and_refuses_its_options_without_it(capsys):
    from diagnostics.cli.attach import main, split_argv

    assert split_argv(["--try", "amp_bf16", "--rounds", "3", "python", "t.py", "--lr", "1"]) == \
        (["--try", "amp_bf16", "--rounds", "3"], ["python", "t.py", "--lr", "1"])
    assert main(["--rounds", "3", "--", "python", "t.py"]) == 2
    assert "--rounds and --warmup go with --try" in capsys.readouterr().err
    assert main(["--try", "amp_bf16", "--at", "4", "--", "python", "t.py"]) == 2
    assert "--at profiles a step; it does not go with --try" in capsys.readouterr().err


def _trials_result(rounds: int, ci):
    from tests.typed_samples import typed

    rows = [{"fix": "baseline", "speedup": 1.0, "rounds": rounds},
            {"fix": "control", "speedup": 0.99, "speedup_ci": ci, "rounds": rounds, "verdict": "within noise"},
            {"fix": "loader_workers=4", "speedup": 2.5, "speedup_ci": ci, "rounds": rounds,
             "verdict": "within noise" if ci is None else "faster"}]
    metrics = {"baseline_step_ms": 35.6, "control_speedup": 0.99, "control_verdict": "within noise", "runs": 4,
               "best_speedup": None if ci is None else 2.5, "best_fix": None if ci is None else "loader_workers=4",
               "best_ci_low": None if ci is None else ci[0], "best_ci_high": None if ci is None else ci[1],
               "control_ci_low": None if ci is None else 0.97, "control_ci_high": None if ci is None else 1.02}
    return typed("trials", {"trials": rows, "metrics": metrics, "status": "stopped", "rounds": 6})


def test_trials_stopped_before_an_interval_say_not_decided_rather_than_none_faster():
    """Stopped after one round, a 2.5x fix showed 'Best speed-up: none' and the control 'no interval within
    noise': with fewer rounds than an interval needs nothing is decided, and the tiles say so."""
    from diagnostics.measure.compare import MIN_ROUNDS
    from ui.views.trials import tiles

    t = {x.label: x for x in tiles(_trials_result(1, None))}
    assert t["Best speed-up"].text() == "not decided"
    assert t["Best speed-up"].detail == f"1 of the {MIN_ROUNDS} rounds an interval needs"
    assert t["A/A control"].detail == f"1 of the {MIN_ROUNDS} rounds an interval needs; within noise"
    done = {x.label: x for x in tiles(_trials_result(MIN_ROUNDS, (2.3, 2.7)))}
    assert done["Best speed-up"].text() == "x2.50" and done["Best speed-up"].detail.startswith("loader_workers=4 ")
