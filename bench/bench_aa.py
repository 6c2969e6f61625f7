"""How often the A/A control reads anything but "within noise" on this machine, with the real timer.

Issue #31: on a quiet machine the default ``optimize --model cnn`` read its A/A control x0.87 [0.77, 0.92]
"slower"; the control always ran right after ONNX Runtime, and a percentile bootstrap over 3 rounds gave
a false verdict one time in four. This runs ``measure.compare.interleaved`` many times on the sample CNN
(eval, no_grad) beside the candidate that left state behind (an ONNX Runtime session of the same model,
when onnxruntime is installed; else a second copy of the model) and counts the control's verdicts, at
each round count. Expected: at most 5 % "faster" / "slower" where an interval exists (6 rounds and
more), none below.

    .venv/bin/python bench/bench_aa.py [--runs 40] [--rounds 3 6 10 20]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from diagnostics.measure.compare import CONTROL, interleaved  # noqa: E402


def candidates() -> tuple[dict, str]:
    from diagnostics.inputs import call as call_model
    from diagnostics.intake import load_model
    from diagnostics.spec import ModelSpec

    loaded = load_model(ModelSpec(name="cnn"))
    model, inputs = loaded.model.eval(), loaded.inputs

    def plain(m):
        def call():
            with torch.no_grad():
                return call_model(m, inputs)
        return call

    calls = {"baseline": plain(model)}
    try:
        from diagnostics.analyses.optimize.deploy import apply_onnxruntime

        ort, _ = apply_onnxruntime(copy.deepcopy(model), inputs, {})
        calls["onnxruntime"] = plain(ort)
        return calls, "ONNX Runtime session"
    except Exception as e:  # no onnxruntime here: a second copy of the model stands in
        calls["copy"] = plain(copy.deepcopy(model))
        return calls, f"a copy of the model (ONNX Runtime unavailable: {type(e).__name__})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--rounds", type=int, nargs="+", default=[3, 6, 10, 20])
    a = ap.parse_args()
    calls, neighbour = candidates()
    print(f"load before: {os.getloadavg()}; neighbour: {neighbour}; torch threads {torch.get_num_threads()}")
    for rounds in a.rounds:
        verdicts = {"faster": 0, "slower": 0, "within noise": 0}
        for seed in range(a.runs):
            out = interleaved(calls, "cpu", rounds, warmup=2, control=True, seed=seed)
            verdicts[out[CONTROL]["verdict"]] += 1
        false = verdicts["faster"] + verdicts["slower"]
        print(f"{rounds:>3} rounds: control {verdicts} -> {100 * false / a.runs:.1f} % false verdicts "
              f"(load now {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
