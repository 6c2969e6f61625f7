"""The plan's parts on their own: option parsing and bad input, devices, the result's round trip, the
ledger's rounding and attribution, the sweep's fit, the KV cache, and the analysis end to end."""

import json

import pytest
import torch
from torch import nn

from diagnostics.analyses.plan import ANALYSIS
from diagnostics.analyses.plan.configs import Config, Setting, parse_sizes, settings_of
from diagnostics.analyses.plan.planner import Planner
from diagnostics.analyses.plan.result import Breakdown, Grid, MaxBatch, PlanMetrics, PlanResult, Row, Suggestion
from diagnostics.analyses.plan.sweep import Curve, curve_point, max_batch
from diagnostics.analyses.plan.targets import CUDA_ROUNDING, DECLARED, MIB, resolve
from diagnostics.declare import OptionError
from diagnostics.errors import TorchScopeError
from diagnostics.intake import LoadedModel, default_loss, load_model
from diagnostics.results import ResultError, decode, metrics_of, to_json, to_plain
from diagnostics.spec import InputSpec, ModelSpec

CPU = resolve("cpu", cpu={"ram_available_bytes": 1 << 36})


def chain(L=3, D=64, B=16):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(L)])
    return LoadedModel(ModelSpec(name="chain"), model, (InputSpec((B, D)),), (torch.randn(B, D),), default_loss, "mse")


# ----------------------------------------------------------------------------- options and bad input
def test_sizes_parse_and_refuse_with_the_option_named():
    assert parse_sizes("8, 2,4,2", "batch") == [2, 4, 8]
    assert ANALYSIS.validate({"batch": "4, 1"})["batch"] == "1,4"
    with pytest.raises(OptionError, match=r"option batch: 'x' is not a whole number"):
        ANALYSIS.validate({"batch": "1,x"})
    with pytest.raises(OptionError, match="option seq: 0 must be at least 1"):
        ANALYSIS.validate({"seq": "0"})


def test_unknown_device_is_refused_with_the_known_ones():
    with pytest.raises(OptionError, match=r"unknown device 'H900'; known: H100-80GB, .*cpu"):
        ANALYSIS.validate({"device": "H900"})
    assert ANALYSIS.validate({"device": "h100"})["device"] == "h100"


def test_sharding_without_ranks_is_refused():
    with pytest.raises(OptionError, match=r"sharding zero3 needs the number of ranks: give --ranks N"):
        settings_of(ANALYSIS.validate({"shard": ["zero3"]}))
    with pytest.raises(OptionError, match="over 1 rank does nothing"):
        settings_of(ANALYSIS.validate({"shard": ["zero1"], "ranks": 1}))
    with pytest.raises(OptionError, match="checkpoint_modules"):
        settings_of(ANALYSIS.validate({"checkpointing": ["selected"]}))


def test_settings_are_the_product_of_the_options():
    o = ANALYSIS.validate({"dtype": ["fp32", "bf16"], "optimizer": ["sgd", "adamw"], "shard": ["none", "zero3"],
                           "ranks": 4})
    settings = settings_of(o)
    assert len(settings) == 8
    assert {s.ranks for s in settings if s.shard == "zero3"} == {4}
    assert Setting.from_dict(settings[3].to_dict()) == settings[3]


# ----------------------------------------------------------------------------- devices
def test_declared_devices_resolve_with_their_memory_and_source():
    t = resolve("H100-80GB", stored={})
    assert t.kind == "cuda" and t.capacity_bytes == DECLARED["H100-80GB"][0] * MIB and t.rounding == CUDA_ROUNDING
    assert "declared table" in t.source and "not calibrated" in t.calibration
    assert resolve("H200", stored={}).name == "H200-141GB"
    cal = {"NVIDIA H100 80GB HBM3": {"context_bytes": 500 * MIB, "workspace_bytes": 8 * MIB, "measured_on": "x"}}
    t = resolve("H100-80GB", stored=cal)
    assert (t.context_bytes, t.workspace_bytes) == (500 * MIB, 8 * MIB) and "calibrated on" in t.calibration
    local = resolve("local", gpus=[{"name": "NVIDIA L4", "memory_total_bytes": 123}], stored={})
    assert local.capacity_bytes == 123 and "NVML" in local.source
    with pytest.raises(OptionError, match="no NVIDIA GPU was found"):
        resolve("local", gpus=[])
    assert resolve("cpu:2GiB").capacity_bytes == 2 * 2**30 and resolve("cpu:2GiB").kind == "cpu"


# ----------------------------------------------------------------------------- the result
def test_the_result_round_trips_through_plain_data():
    row = Row(batch=2, seq=16, dtype="bf16", optimizer="adamw", checkpointing="none", shard="none", ranks=1,
              offload=False, mode="train", peak_bytes=10, parts={"parameters": 10}, phase="backward", module="m",
              fits=True, headroom_bytes=5, analytic=("x",))
    res = PlanResult(model="m", device=CPU, options={}, rows=(row,), breakdown=(Breakdown.of(row),),
                     max_batch=(MaxBatch("s", 16, 4, 9, "traced", 64),),
                     grids=(Grid("s", (1, 2), (16,), ((1, 2),), ((True, True),), ((1, 16),)),),
                     suggestions=(Suggestion("bf16", 5, True, 5, "none"),), notes=("n",),
                     metrics=PlanMetrics(configs=1, fitting_configs=1, min_peak_bytes=10, max_peak_bytes=10,
                                         capacity_bytes=CPU.capacity_bytes, traces=1, analytic_modules=0,
                                         trace_seconds=0.1))
    d = json.loads(to_json(res))  # the one serialisation (the worker, the store, --json)
    back = decode(ANALYSIS, d)
    assert back == res
    assert d["breakdown"][0]["parameters"] == 10 and d["breakdown"][0]["optimizer_state"] == 0
    assert d["rows"][0]["analytic"] == ["x"] and d["device"]["capacity_bytes"] == CPU.capacity_bytes
    with pytest.raises(ResultError, match=r"does not fit PlanResult: Expected `int`, got `str` - at `\$.rows\[0\].batch`"):
        decode(ANALYSIS, {**d, "rows": [{**d["rows"][0], "batch": "two"}]})


# ----------------------------------------------------------------------------- the ledger
def test_cuda_rounding_and_what_holds_the_peak_of_a_linear_chain():
    """Chain of L bias-free Linear(D, D) on [B, D] fp32, SGD with momentum: at the optimizer step the
    parameters, gradients and momentum are each L*D*D*4 bytes; every tensor here is a multiple of 512
    bytes, so CUDA's rounding adds nothing but to the loss' scalars (4 bytes -> 512), and every block is
    split from a 2 MiB segment exactly. On an H100 the step also holds two cuBLAS workspaces of 32 MiB
    (forward and backward threads; no bias, so no cuBLASLt one)."""
    L, D, B = 3, 64, 16
    loaded = chain(L, D, B)
    cpu = Planner(loaded, CPU).run(Config(B, None, Setting(optimizer="sgd")))
    gpu = Planner(loaded, resolve("H100-80GB", stored={})).run(Config(B, None, Setting(optimizer="sgd")))
    W = D * D * 4
    assert cpu.param_bytes == cpu.grad_bytes == cpu.state_bytes == L * W
    assert gpu.parts["workspaces"] == 2 * 32 * MIB
    assert gpu.parts["rounding"] == 2 * (512 - 4)  # the loss and its gradient: 4-byte scalars in 512-byte blocks
    assert gpu.peak_bytes - cpu.peak_bytes == gpu.parts["rounding"] + gpu.parts["workspaces"]
    assert sum(gpu.parts.values()) == gpu.peak_bytes
    assert sum(cpu.parts.values()) == cpu.peak_bytes
    measured = measure_peak_of(chain(L, D, B), "sgd")
    assert cpu.peak_bytes == measured


def measure_peak_of(loaded, optimizer):
    from diagnostics.analyses.plan.measured import measured_peak

    return measured_peak(loaded, Config(loaded.batch_size, None, Setting(optimizer=optimizer)))["peak_bytes"]


def test_the_peak_names_its_phase_and_module():
    loaded = load_model(ModelSpec(source="sample", name="transformer", batch_size=8))
    st = Planner(loaded, CPU).run(Config(8, 64, Setting()), timeline=True)
    assert st.phase in ("forward", "backward", "optimizer")
    assert st.module  # a module name, "(loss)" or "(optimizer)"
    assert set(st.phase_peaks) >= {"forward", "backward", "optimizer"}
    assert max(v["bytes"] for v in st.phase_peaks.values()) == st.peak_bytes
    tl = st.timeline
    assert max(sum(tl["series"][c][i] for c in tl["series"]) for i in range(len(tl["op_index"]))) <= st.peak_bytes
    assert st.saved_in("encoder.layers.0") > 0


def test_checkpointing_every_block_keeps_less_for_backward():
    loaded = load_model(ModelSpec(source="sample", name="transformer", batch_size=8))
    plan = Planner(loaded, CPU)
    plain = plan.run(Config(8, 64, Setting()))
    ck = plan.run(Config(8, 64, Setting(checkpointing="blocks")))
    assert ck.saved_bytes < plain.saved_bytes
    with pytest.raises(TorchScopeError, match="no module matches 'nope'"):
        Planner(loaded, CPU, checkpoint_patterns="nope").run(Config(8, 64, Setting(checkpointing="selected")))


# ----------------------------------------------------------------------------- the sweep
def test_the_largest_batch_is_checked_by_measurement_at_the_boundary():
    """With a budget between the measured peaks of batch 40 and 41, the sweep finds 40, and the real step
    agrees: batch 40 stays under the budget, batch 41 goes over."""
    planner = Planner(chain(), CPU)
    measured = {b: measure_peak_of(chain(B=b), "adamw") for b in (40, 41)}
    budget = (measured[40] + measured[41]) // 2
    planner.target = resolve(f"cpu:{budget}MB".replace(f"{budget}MB", f"{budget / 1e6}MB"))
    curve = Curve(Setting(), None)
    found = max_batch(planner, curve, limit=4096)
    assert found.max_batch == 40, found
    assert measured[40] <= planner.budget() < measured[41]
    assert "batch 40 fits, batch 41 does not" in found.checked
    assert len(curve.points) <= 5  # 1, 8, then the boundary: not every batch


def test_a_curve_is_exact_where_traced_and_linear_between():
    planner = Planner(chain(), CPU)
    curve = Curve(Setting(), None)
    for b in (1, 9):
        curve_point(planner, curve, b)
    traced = planner.device_peak(planner.run(Config(5, None, Setting())))[0]
    assert abs(curve.peak(5)[0] - traced) <= 64  # a chain's memory is linear in the batch


# ----------------------------------------------------------------------------- inference
def test_inference_counts_the_kv_cache_and_rescales_it_to_the_kv_dtype():
    from diagnostics.hf import HFSettings

    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 500}
    loaded = load_model(ModelSpec(source="hf", name="llama", hf=HFSettings(cfg, seq_len=32).to_json(), batch_size=2))
    plan = Planner(loaded, CPU)
    b, s = 2, 32
    kv = 2 * 2 * b * 2 * (s + 1) * 16  # layers x (K, V) x batch x kv heads x (prompt + 1 token) x head dim
    st = plan.run(Config(b, s, Setting(dtype="bf16", optimizer="none", mode="inference")))
    assert st.parts["kv cache"] in (kv * 2, 2 * 2 * b * 2 * s * 16 * 2)  # bf16 elements; at the peak
    from diagnostics.analyses.plan.measured import measured_inference_peak

    measured = measured_inference_peak(load_model(loaded.spec), Config(b, s, Setting(dtype="bf16", mode="inference")))
    assert abs(st.peak_bytes - measured["peak_bytes"]) <= 0.05 * measured["peak_bytes"]
    fp8 = plan.run(Config(b, s, Setting(dtype="bf16", optimizer="none", mode="inference", kv_dtype="fp8")))
    assert fp8.parts["kv cache"] == st.parts["kv cache"] // 2
    assert fp8.peak_bytes == st.peak_bytes - st.parts["kv cache"] // 2
    assert any("rescaled" in n for n in fp8.notes)


# ----------------------------------------------------------------------------- the analysis
def test_the_analysis_answers_rows_max_batch_grid_and_suggestions(tmp_path):
    from diagnostics.analyses.plan.job import analyze
    from diagnostics.runner import AnalysisContext, Job

    options = {"batch": "8,2048", "device": "cpu:1MB", "max_batch": 4096, "optimizer": ["sgd"]}
    ctx = AnalysisContext(Job("plan", ModelSpec(name="chain"), options), tmp_path)
    ctx._loaded = chain()
    result = analyze(ctx, options)
    assert isinstance(result, PlanResult) and decode(ANALYSIS, json.loads(to_json(result))) == result
    assert [(r.batch, r.seq) for r in result.rows] == [(8, None), (2048, None)]
    small, big = result.rows
    assert small.fits and not big.fits and big.headroom_bytes < 0
    assert all(ANALYSIS.metric(k) is not None for k in metrics_of(result))  # every metric declared
    assert [b.configuration for b in result.breakdown] == ["fp32, sgd · batch 8", "fp32, sgd · batch 2048"]
    assert sum(v for k, v in to_plain(result.breakdown[1]).items() if k != "configuration") == big.peak_bytes
    m = result.max_batch[0]
    assert 8 <= m.max_batch < 2048 and "fits" in m.checked
    assert result.grids[0].fits[0][0] is True
    assert result.suggestions and result.suggestions[0].fits
    assert result.timeline.series


def test_a_dtype_the_model_cannot_run_is_refused_by_name(tmp_path):
    from diagnostics.analyses.plan.job import analyze
    from diagnostics.runner import AnalysisContext, Job

    src = tmp_path / "fixed.py"
    src.write_text("import torch\nfrom torch import nn\n"
                   "class M(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n        self.w = nn.Parameter(torch.randn(8, 8))\n"
                   "    def forward(self, x):\n        return x.float() @ self.w\n"
                   "def build_model():\n    return M()\n"
                   "def example_inputs():\n    return (torch.randn(4, 8),)\n")
    spec = ModelSpec(source="python", name="fixed.py", path=str(src))
    options = {"dtype": ["bf16"], "device": "cpu", "sweep": False}
    ctx = AnalysisContext(Job("plan", spec, options), tmp_path)
    with pytest.raises(TorchScopeError, match=r"the model cannot run in bf16 \(bf16 weights and compute\)"):
        analyze(ctx, options)


@pytest.mark.slow
def test_uploads_plan_as_exported_programs_and_torchscript_is_refused_by_name(tmp_path):
    """A torch.export archive (a user's upload) plans like any model; TorchScript has no Python modules to run."""
    from diagnostics.analyses.plan.measured import measured_peak

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    example = (torch.randn(8, 16),)
    torch.export.save(torch.export.export(model, example), tmp_path / "m.pt2")
    torch.jit.save(torch.jit.trace(model, example), tmp_path / "m.ts")
    spec = ModelSpec(source="export", name="m.pt2", path=str(tmp_path / "m.pt2"))
    st = Planner(load_model(spec), CPU).run(Config(8, None, Setting()))
    measured = measured_peak(load_model(spec), Config(8, None, Setting()))["peak_bytes"]
    assert abs(st.peak_bytes - measured) <= 0.05 * measured
    ts = ModelSpec(source="torchscript", name="m.ts", path=str(tmp_path / "m.ts"), inputs=(InputSpec((8, 16)),))
    with pytest.raises(TorchScopeError, match="a TorchScript archive does not have: upload the model as a "
                                              "torch.export archive"):
        Planner(load_model(ts), CPU).run(Config(8, None, Setting()))
