"""Invariants that hold on every result, whatever the model: checked over the samples and over real
architectures built from small transformers configs (random weights, nothing downloaded).

* no op above its roof (FLOPs and bytes over the inclusive time of the op the counters counted), and
  no MFU above 1, for the model and per module;
* the profiler's overhead, measured interleaved, never below 0 beyond its interval;
* a measured comparison's speed-up is the ratio of the times shown beside it, lies inside its interval,
  and "faster" / "slower" clear both 1 and the A/A control's interval.

Issue #31 found the CPU convolution at 26,324 % of its roof and aten::relu_ at 2,637 %, MFU-like
figures from self times, and a profiler overhead of -59.9 %.
"""

from __future__ import annotations

import pytest

from diagnostics.measure.compare import CONTROL
from diagnostics.measure.roofline import ABOVE_ROOF_TOLERANCE
from diagnostics.runner import Job, execute
from diagnostics.spec import ModelSpec

#: A short profile: what the invariants need (roofline, modules, the overhead's rounds), little else.
PROFILE = {"wait": 0, "warmup": 1, "active": 2, "latency_warmup": 1, "latency_iters": 5, "record_shapes": False,
           "timeline_max_events": 100, "overhead_rounds": 6}

#: Real architectures from transformers configs, as small as they build (the Hugging Face intake).
HF = {
    "gpt2": ({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000}, None),
    "bert": ({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 1000}, "masked-lm"),
    "llama": ({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}, None),
    "vit": ({"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "image_size": 32, "patch_size": 8, "num_labels": 10}, "image-classification"),
    "t5": ({"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4,
            "vocab_size": 1000}, "seq2seq-lm"),
}


def hf_spec(name: str) -> ModelSpec:
    pytest.importorskip("transformers")
    from diagnostics.hf import HFSettings

    config, task = HF[name]
    return ModelSpec(source="hf", name=config["model_type"], batch_size=2,
                     hf=HFSettings(config, task, seq_len=16).to_json())


def check_profile(r: dict) -> None:
    """The roofline, MFU and profiler-overhead invariants on one profile result."""
    m = r["metrics"]
    assert r["roofline"], "the roofline placed no operator"
    above = [(row["op"], f"{row['pct_of_roof']:.0f} %", row["memory_roof"]) for row in r["roofline"]
             if row["above_roof"]]
    assert not above, f"ops above their roof: {above} (roofs: {r['roofs']['method']})"
    for row in r["roofline"]:
        assert row["pct_of_roof"] <= 100 * ABOVE_ROOF_TOLERANCE and row["time_ms"] >= row["roof_ms"] / ABOVE_ROOF_TOLERANCE
    if m["mfu"] is not None:
        assert 0 < m["mfu"] <= 1, f"MFU {m['mfu']:.3f}"
    for mod in r["modules"]:
        if mod.get("mfu") is not None:
            assert 0 < mod["mfu"] <= ABOVE_ROOF_TOLERANCE, f"module {mod['name']}: MFU {mod['mfu']:.3f}"
    low, high = m["profiler_overhead_ci_low"], m["profiler_overhead_ci_high"]
    assert low is not None and low <= m["profiler_overhead_pct"] <= high
    assert high >= 0, f"the profiler made the step faster beyond the noise: {m['profiler_overhead_pct']:.1f} % " \
                      f"[{low:.1f}, {high:.1f}]"


def check_comparison(rows: dict[str, dict], baseline: str) -> None:
    """A measured comparison's rows (measure.compare's summary, or rows carrying its figures)."""
    base = rows[baseline]
    noise = rows[CONTROL].get("speedup_ci") if CONTROL in rows else None
    for key, r in rows.items():
        if key == baseline or r.get("speedup") is None:
            continue
        assert r["speedup"] == pytest.approx(base["time_ms"] / r["time_ms"]), key  # the times shown agree
        ci = r.get("speedup_ci")
        if ci is None:
            assert r["verdict"] == "within noise", key
            continue
        assert ci[0] <= r["speedup"] <= ci[1], key
        if r["verdict"] == "faster":
            assert ci[0] > 1 and (key == CONTROL or noise is None or ci[0] > noise[1]), key
        if r["verdict"] == "slower":
            assert ci[1] < 1 and (key == CONTROL or noise is None or ci[1] < noise[0]), key


# ----------------------------------------------------------------------------- samples
def test_cnn_inference_profile_keeps_every_op_under_its_roof(tmp_path):
    """The issue's case: the sample CNN, where convolution and relu_ read far above their roofs."""
    check_profile(execute(Job("profile", ModelSpec(name="cnn"), PROFILE), tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("sample,mode", [("cnn", "train"), ("mlp", "train"), ("resnet", "inference"),
                                         ("transformer", "train"), ("lstm", "inference")])
def test_sample_profiles_keep_the_invariants(sample, mode, tmp_path):
    check_profile(execute(Job("profile", ModelSpec(name=sample), {**PROFILE, "mode": mode}), tmp_path))


# ----------------------------------------------------------------------------- real architectures
@pytest.mark.parametrize("name", ["gpt2"])
def test_a_real_architecture_keeps_the_invariants(name, tmp_path):
    check_profile(execute(Job("profile", hf_spec(name), {**PROFILE, "mode": "train"}), tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", [("gpt2", "inference"), ("bert", "train"), ("llama", "train"),
                                       ("vit", "inference"), ("vit", "train"), ("t5", "train")])
def test_real_architectures_keep_the_invariants(name, mode, tmp_path):
    check_profile(execute(Job("profile", hf_spec(name), {**PROFILE, "mode": mode}), tmp_path))


# ----------------------------------------------------------------------------- comparisons
def test_optimize_rows_agree_with_their_times_and_the_control(tmp_path):
    r = execute(Job("optimize", ModelSpec(name="mlp"), {"fixes": ["inference_mode", "half"], "iters": 6,
                                                         "warmup": 1, "save_artifacts": False}), tmp_path)
    rows = {row["fix"]: row for row in r["rows"] if row["status"] == "ok"}
    check_comparison(rows, "baseline")
    m = r["metrics"]
    if m["best_fix"]:
        assert m["best_speedup_ci_low"] > max(1.0, m["control_ci_high"])


@pytest.mark.slow
def test_compile_and_training_comparisons_agree_with_their_times(tmp_path):
    r = execute(Job("compile", ModelSpec(name="mlp"), {"backend": "eager", "rounds": 6, "train": True,
                                                       "recompile_probe": False}), tmp_path)
    check_comparison(r["timing"], "eager")
    t = execute(Job("optimize", ModelSpec(name="mlp"), {"mode": "train", "fixes": ["fused_optimizer"], "iters": 6,
                                                        "warmup": 1, "train_steps": 1, "save_artifacts": False}),
                tmp_path / "train")
    check_comparison({row["fix"]: row for row in t["rows"] if row["status"] == "ok"}, "baseline")
