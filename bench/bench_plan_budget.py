"""The plan's budget answer against the machine: at a budget of 75 % of the transformer sample's
unconstrained training peak, the modules ``plan --budget`` picks are measured for real:

* memory: the training step's peak with those modules checkpointed (the Memory analysis' protocol,
  analyses/plan/measured.py), against the budget and the prediction (goal: under the budget, within 5 %);
* time: the step with and without that checkpointing, timed in interleaved rounds (measure.compare: the
  same Rounds every comparison here uses, with an A/A control), the median of the per-round differences
  against the answer's ``recompute_ms`` (goal: within 20 %); and, because a shared machine's load drifts
  between the plan and the rounds, the plan's measurement itself (each chosen module's forward with
  autograd recording) timed in the same rounds (``recompute_ms_alongside``): the method's error apart
  from the drift.

    .venv/bin/python bench/bench_plan_budget.py [--rounds 30] [--threads 1] [--model transformer]
    .venv/bin/python bench/bench_plan_budget.py --cases     # memory only, corpus models at 75 %

One intra-op thread by default: on a shared machine two threads wait on each other (a layer that takes
30 ms on one thread took 60-850 ms on two under a load of 7 on 2 cores), and the recompute times and the
steps are timed alike. Prints one JSON line; BENCHMARKS.md "Memory plan: fit in a budget" quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


#: the memory-only budget cases (``--cases``): corpus models (tests/analyses/plan/corpus.py) at 75 % of their peak
BUDGET_CASES = [("transformer", 8, 64), ("resnet", 8, None), ("gpt2", 4, 64), ("llama", 4, 64), ("bert", 4, 64),
                ("t5", 4, 64), ("qwen2", 4, 128), ("vit", 8, None)]


def cases(fraction: float) -> None:
    """Each budget case planned (fit.fit_budget at ``fraction`` of its unconstrained peak) and its choice
    measured for real (analyses/plan/measured.py): one JSON line per case."""
    sys.path.insert(0, str(ROOT / "tests" / "analyses" / "plan"))
    from corpus import Case

    from diagnostics.analyses.plan.configs import Setting
    from diagnostics.analyses.plan.fit import fit_budget
    from diagnostics.analyses.plan.measured import measured_peak
    from diagnostics.analyses.plan.planner import Planner
    from diagnostics.analyses.plan.targets import resolve
    from diagnostics.intake import load_model

    cpu = resolve("cpu", cpu={"ram_available_bytes": 1 << 36})
    for model, batch, seq in BUDGET_CASES:
        case = Case(model, batch, seq)
        planner = Planner(load_model(case.spec()), cpu)
        base = planner.device_peak(planner.run(case.config()))[0]
        budget = int(fraction * base)
        fit = fit_budget(planner, case.config(), budget, [])
        row = {"case": case.id, "unconstrained_peak_bytes": base, "budget_bytes": budget, "fits": fit.fits,
               "checkpoint_modules": list(fit.checkpoint_modules), "predicted_peak_bytes": fit.predicted_peak_bytes,
               "recompute_ms": fit.recompute_ms, "traces": fit.traces}
        if fit.checkpoint_modules:
            selected = case.config().with_size(batch, seq)
            selected = type(selected)(batch, seq, Setting(checkpointing="selected"))
            m = measured_peak(load_model(case.spec()), selected, checkpoint_patterns=fit.checkpoint_option)["peak_bytes"]
            row.update(measured_peak_bytes=m, under_budget=m <= budget,
                       error_pct=round(100 * (fit.predicted_peak_bytes - m) / m, 3))
        if not fit.fits:
            row["needed"] = [(x.change, x.peak_bytes, x.fits) for x in fit.needed]
        print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", action="store_true", help="the memory-only budget cases (no timing)")
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fraction", type=float, default=0.75)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    if a.cases:
        cases(a.fraction)
        return
    from diagnostics.analyses.plan.configs import Config, Setting
    from diagnostics.analyses.plan.fit import fit_budget
    from diagnostics.analyses.plan.measured import measured_peak
    from diagnostics.analyses.plan.planner import Planner
    from diagnostics.analyses.plan.targets import resolve
    from diagnostics.analyses.plan.trace import specs_at
    from diagnostics.inputs import make_inputs
    from diagnostics.intake import load_model
    from diagnostics.measure.checkpoint import checkpointing
    from diagnostics.measure.compare import timed_rounds
    from diagnostics.measure.training import make_optimizer
    from diagnostics.spec import ModelSpec

    spec = ModelSpec(name=a.model)
    loaded = load_model(spec)
    cpu = resolve("cpu", cpu={"ram_available_bytes": 1 << 36})
    spec_in = loaded.input_specs[0]
    seq = spec_in.shape[1] if len(spec_in.shape) >= 2 and spec_in.high is not None else None
    config = Config(int(loaded.batch_size), seq, Setting())
    planner = Planner(loaded, cpu)
    t0 = time.perf_counter()
    base = planner.device_peak(planner.run(config))[0]
    budget = int(a.fraction * base)
    fit = fit_budget(planner, config, budget, [])
    plan_s = time.perf_counter() - t0
    chosen = list(fit.checkpoint_modules)
    selected = Config(config.batch, config.seq, Setting(checkpointing="selected"))
    measured = measured_peak(load_model(spec), selected, checkpoint_patterns=fit.checkpoint_option)["peak_bytes"]

    # -- step time with and without the checkpointing, interleaved rounds on one model
    timed = load_model(spec)
    model = timed.model
    model.train()
    opt = make_optimizer(model.parameters(), "adamw", 1e-3)
    inputs = make_inputs(specs_at(timed.input_specs, config.batch, config.seq), "cpu", spec.seed)

    def step():
        loss = timed.loss_fn(inputs.call(model))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def step_ckpt():
        with checkpointing(model, chosen):
            step()

    # the plan's recompute measurement (each chosen module's forward, autograd recording, on the inputs a real
    # forward gave it), timed in the same rounds: the machine's load drifts between the plan and the steps
    mods = dict(model.named_modules())
    kept = {}
    hooks = [mods[n].register_forward_pre_hook(lambda m, args, kwargs, n=n: kept.setdefault(n, (args, kwargs)),
                                               with_kwargs=True) for n in chosen]
    with torch.no_grad():
        inputs.call(model)
    for h in hooks:
        h.remove()

    def fresh(x):
        return x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    def recompute():
        with torch.enable_grad():
            for n in chosen:
                args, kwargs = kept[n]
                mods[n](*[fresh(x) for x in args], **{k: fresh(v) for k, v in kwargs.items()})

    rounds, _ = timed_rounds({"plain": step, "checkpointed": step_ckpt, "recompute": recompute}, "cpu", a.rounds,
                             warmup=2, control=True)
    summ = rounds.summary()
    plain_ms = statistics.median(rounds.round_ms["plain"])
    ck_ms = statistics.median(rounds.round_ms["checkpointed"])
    diffs = [c - p for c, p in zip(rounds.round_ms["checkpointed"], rounds.round_ms["plain"])]
    diff = statistics.median(diffs)
    alongside = statistics.median(rounds.round_ms["recompute"])
    out = {
        "model": a.model, "batch": config.batch, "seq": config.seq, "threads": a.threads,
        "load_1min": os.getloadavg()[0], "unconstrained_peak_bytes": base, "budget_bytes": budget,
        "checkpoint_modules": chosen, "predicted_peak_bytes": fit.predicted_peak_bytes, "measured_peak_bytes": measured,
        "under_budget": measured <= budget,
        "peak_error_pct": round(100 * (fit.predicted_peak_bytes - measured) / measured, 3),
        "recompute_ms": fit.recompute_ms, "step_ms_plain": round(plain_ms, 3), "step_ms_checkpointed": round(ck_ms, 3),
        "step_ms_difference": round(diff, 3),
        "recompute_error_pct": round(100 * (fit.recompute_ms - diff) / diff, 1) if diff > 0 else None,
        "recompute_ms_alongside": round(alongside, 3),
        "alongside_error_pct": round(100 * (alongside - diff) / diff, 1) if diff > 0 else None,
        "speedup_interval": [summ["checkpointed"].get("ci_low"), summ["checkpointed"].get("ci_high")],
        "control_verdict": summ.get("control", {}).get("verdict"), "rounds": a.rounds, "plan_seconds": round(plan_s, 2),
        "traces": fit.traces, "candidates": [(c.module, c.saved_bytes, c.recompute_ms) for c in fit.candidates],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
