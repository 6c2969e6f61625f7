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

import copy

import pytest

from diagnostics.analyses.profile import ProfileResult
from diagnostics.measure.compare import CONTROL
from diagnostics.measure.roofline import ABOVE_ROOF_TOLERANCE, best_roofs, measure_roofs, memory_roof
from diagnostics.results import to_plain
from diagnostics.runner import Job, execute
from diagnostics.spec import ModelSpec

#: A short profile: what the invariants need (roofline, modules), little else; the profiler's overhead
#: (its interleaved rounds cost a profiler session each) where OVERHEAD is added.
PROFILE = {"wait": 0, "warmup": 1, "active": 2, "latency_warmup": 1, "latency_iters": 5, "record_shapes": False,
           "timeline_max_events": 100, "overhead_rounds": 0}
OVERHEAD = {"overhead_rounds": 6}

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


#: On a run the profile itself reports as disturbed (other processes used the cores) the roofs and the
#: ops were timed under load at different moments, and every roof measurement can land in a busy
#: moment (seen here at a load average of 11 on 2 cores: a 512 x 512 GEMM at 7 GFLOP/s, a convolution
#: call at 184). There an op is held to what the hardware cannot exceed (``physical_ceiling``), which
#: still catches what issue #31 saw (a CPU convolution at 10.93 TFLOP/s on 2 cores); on a quiet run,
#: to the measured roofs within the product's own tolerance.
GHZ_BOUND = 5.6  # no x86 core clocks faster (all-core or single-core boost)
FLOP_PER_CYCLE = {"avx512f": 64, "avx2": 32}  # fp32, two FMA units per core at most
BYTES_PER_CYCLE = 192  # an L1 cache's best: two 64-byte loads and one 64-byte store per cycle


def physical_ceiling() -> dict:
    """What this machine's CPU cannot exceed, from its cores and instruction set (not measured)."""
    import os

    flags = open("/proc/cpuinfo").read()
    per_cycle = next((v for k, v in FLOP_PER_CYCLE.items() if f" {k}" in flags), 16)
    cores = len(os.sched_getaffinity(0))
    peak = cores * GHZ_BOUND * 1e9 * per_cycle
    bw = cores * GHZ_BOUND * 1e9 * BYTES_PER_CYCLE
    return {"peak_flops": peak, "bandwidth_bytes_per_s": bw, "bandwidth_curve": [[1 << 62, bw]],
            "method": f"physical bound: {cores} cores x {GHZ_BOUND} GHz x {per_cycle} FLOP and {BYTES_PER_CYCLE} B per cycle"}


@pytest.fixture(scope="module")
def ceiling():
    """This machine's roofs, measured once for the module (the fastest of more calls than a job makes)."""
    return measure_roofs("cpu", reps=10)


@pytest.fixture(autouse=True)
def roofs_once(monkeypatch, ceiling):
    """Every profile here places its ops against the module's roofs (measuring them takes seconds a job:
    the invariants are about the ops' times and counts, and the roofs' measurement has its own tests)."""
    from diagnostics.analyses.profile import job

    monkeypatch.setattr(job, "measure_roofs", lambda device, dtype=None: copy.deepcopy(ceiling))


def check_profile(result: ProfileResult, ceiling: dict) -> None:
    """The roofline, MFU and profiler-overhead invariants on one profile result, read in its plain form (the
    roofs as measure.roofline's functions take them)."""
    r = to_plain(result)
    m, steps = r["metrics"], max(1, len(r["steps"]))
    assert r["roofline"], "the roofline placed no operator"
    if r["disturbance"]["disturbed"] and not r["cuda_ran"]:
        roofs = physical_ceiling()
    else:
        roofs = best_roofs(r["roofs"], ceiling)
    tol = ABOVE_ROOF_TOLERANCE
    for row in r["roofline"]:  # the result's own arithmetic
        assert row["pct_of_roof"] == pytest.approx(100 * row["roof_ms"] / row["time_ms"])

    def above(roofs: dict) -> list[str]:
        """Rows, modules and the model faster than ``roofs`` allow (physics against the best ceiling)."""
        out = []
        for row in r["roofline"]:
            bw, _ = memory_roof(row["bytes"] / max(1, row["calls"]), roofs)
            roof_ms = max(row["flops"] / roofs["peak_flops"], row["bytes"] / bw) * 1e3
            if row["time_ms"] * tol < roof_ms:
                out.append(f"{row['op']} at {100 * roof_ms / row['time_ms']:.0f} % of its roof")
        if m["model_flops_per_step"]:
            model_mfu = m["model_flops_per_step"] / (m["latency_median_ms"] / 1e3) / roofs["peak_flops"]
            if model_mfu > 1:
                out.append(f"MFU {model_mfu:.3f}")
        for mod in r["modules"]:
            if mod.get("flops"):
                t_s = ((mod.get("forward_ms") or 0) + (mod.get("backward_ms") or 0)) / steps / 1e3
                if mod["flops"] / t_s / roofs["peak_flops"] > tol:
                    out.append(f"module {mod['name']}: MFU {mod['flops'] / t_s / roofs['peak_flops']:.3f}")
        return out

    if above(roofs) and "physical" not in roofs["method"]:
        # as the job does: a ceiling measured in a busy moment (the run itself may have been quiet) is
        # measured once more, the higher of each kept
        roofs = best_roofs(roofs, measure_roofs("cuda:0" if r["cuda_ran"] else "cpu", reps=10))
    assert not above(roofs), f"{above(roofs)} ({roofs['method']})"
    flagged = [row["op"] for row in r["roofline"] if row["above_roof"]]
    assert not flagged or any("faster than this machine's roofs" in n for n in r["notes"])  # said, not hidden
    if r["config"]["overhead_rounds"] == 0:
        return
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
def test_cnn_inference_profile_keeps_every_op_under_its_roof(tmp_path, ceiling):
    """The issue's case: the sample CNN, where convolution and relu_ read far above their roofs."""
    check_profile(execute(Job("profile", ModelSpec(name="cnn"), {**PROFILE, **OVERHEAD}), tmp_path), ceiling)


@pytest.mark.slow
@pytest.mark.parametrize("sample,mode", [("cnn", "train"), ("mlp", "train"), ("resnet", "inference"),
                                         ("transformer", "train"), ("lstm", "inference"),
                                         ("deep_sigmoid_mlp", "train"), ("bad_init_mlp", "inference"),
                                         ("graph_break_mlp", "inference")])
def test_sample_profiles_keep_the_invariants(sample, mode, tmp_path, ceiling):
    check_profile(execute(Job("profile", ModelSpec(name=sample), {**PROFILE, "mode": mode}), tmp_path), ceiling)


# ----------------------------------------------------------------------------- real architectures
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2"])
def test_a_real_architecture_keeps_the_invariants(name, tmp_path, ceiling):
    check_profile(execute(Job("profile", hf_spec(name), {**PROFILE, "mode": "train", **OVERHEAD}), tmp_path), ceiling)



@pytest.mark.slow
@pytest.mark.parametrize("name,mode", [("gpt2", "inference"), ("bert", "train"), ("llama", "train"),
                                       ("vit", "inference"), ("vit", "train"), ("t5", "train")])
def test_real_architectures_keep_the_invariants(name, mode, tmp_path, ceiling):
    check_profile(execute(Job("profile", hf_spec(name), {**PROFILE, "mode": mode}), tmp_path), ceiling)


# ----------------------------------------------------------------------------- comparisons
def test_optimize_rows_agree_with_their_times_and_the_control(tmp_path):
    r = execute(Job("optimize", ModelSpec(name="mlp"), {"fixes": ["inference_mode", "half"], "iters": 6,
                                                         "warmup": 1, "save_artifacts": False}), tmp_path)
    rows = {row.fix: to_plain(row) for row in r.rows if row.status == "ok"}
    check_comparison(rows, "baseline")
    m = r.metrics
    if m.best_fix:
        assert m.best_speedup_ci_low > max(1.0, m.control_ci_high)


@pytest.mark.slow
def test_compile_and_training_comparisons_agree_with_their_times(tmp_path):
    r = execute(Job("compile", ModelSpec(name="mlp"), {"backend": "eager", "rounds": 6, "train": True,
                                                       "recompile_probe": False}), tmp_path)
    check_comparison({k: to_plain(t) for k, t in r.timing.items()}, "eager")
    t = execute(Job("optimize", ModelSpec(name="mlp"), {"mode": "train", "fixes": ["fused_optimizer"], "iters": 6,
                                                        "warmup": 1, "train_steps": 1, "save_artifacts": False}),
                tmp_path / "train")
    check_comparison({row.fix: to_plain(row) for row in t.rows if row.status == "ok"}, "baseline")


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sample,mode", [("cnn", "train"), ("transformer", "train")])
def test_cuda_profiles_keep_every_op_under_its_roof(sample, mode, tmp_path, monkeypatch):
    """On CUDA an op's time is the device time of the kernels it and its children launched: a
    convolution's kernels are its child's (cudnn_convolution). Roofs measured on the GPU by the job."""
    from diagnostics.analyses.profile import job

    monkeypatch.setattr(job, "measure_roofs", measure_roofs)  # the job's own GPU roofs, not the CPU's
    r = execute(Job("profile", ModelSpec(name=sample, device="cuda:0"), {**PROFILE, **OVERHEAD, "mode": mode}),
                tmp_path)
    assert r.cuda_ran and r.roofs.device.startswith("cuda")
    conv = next((row for row in r.roofline if row.op == "aten::convolution"), None)
    if conv is not None:  # its time is its kernels', not the ~0 self device time of the dispatching op
        ops = {o.name: o for o in r.operators}
        assert conv.time_ms >= 0.9 * ops["aten::convolution"].device_total_ms / len(r.steps)
    check_profile(r, to_plain(r.roofs))
