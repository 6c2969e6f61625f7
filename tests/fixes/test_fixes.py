"""Each fix: its effect (smaller, fused, channels_last, zeros, inference tensors...), its fidelity,
and that the user's model never changes. Then the trial harness and the optimize analysis."""

import json

import pytest
import torch
from torch import nn

from diagnostics.measure.compare import verdict
from diagnostics.measure.environment import environment_facts
from diagnostics.measure.structure import BATCHNORM, forward_facts, static_facts
from diagnostics.errors import TorchScopeError
from diagnostics.analyses.optimize import catalog
from diagnostics.analyses.optimize.catalog import FIX_IDS, FIXES, get_fix
from diagnostics.analyses.optimize.fixes import run_fix
from diagnostics.analyses.optimize.trials import fidelity, run_trials, serialized_bytes, zero_fraction


def cnn():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    # Non-trivial BN statistics, so that fusion has something to fold.
    m.train()
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(8, 3, 12, 12))
    return m.eval()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).eval()


X_IMG = (torch.randn(4, 3, 12, 12),)
X_VEC = (torch.randn(16, 64),)


def ref(model, inputs):
    with torch.no_grad():
        return model.eval()(*inputs)


def facts_of(model, inputs):
    return {"static": static_facts(model), "env": environment_facts("cpu"), "forward": forward_facts(model, inputs)}


def test_registry():
    # every declared fix has a unique id, a title, a recipe that resolves to a function, and parameters
    # whose defaults pass their own declaration; the optimize analysis offers exactly these ids
    from diagnostics.analyses.optimize import ANALYSIS

    assert len(set(FIX_IDS)) == len(FIXES) > 0
    for fix in FIXES:
        assert fix.title and fix.description, fix.id
        module, _, name = fix.recipe.partition(":")
        assert callable(getattr(__import__(module, fromlist=[name]), name)), fix.id
        assert fix.options(None) == {p.key: p.validate(p.default) for p in fix.params}, fix.id
    # the fixes option offers every fix of both modes; none chosen means every fix of the mode
    assert ANALYSIS.option("fixes").choices == tuple(catalog.all_fix_ids()) and ANALYSIS.defaults()["fixes"] == []
    assert set(FIX_IDS) <= set(catalog.all_fix_ids()) and set(catalog.TRAIN_FIX_IDS) <= set(catalog.all_fix_ids())
    for fix in catalog.TRAIN_FIXES:
        assert fix.mode == "train" and fix.title and fix.description, fix.id
        module, _, name = fix.recipe.partition(":")
        assert callable(getattr(__import__(module, fromlist=[name]), name)), fix.id
    with pytest.raises(TorchScopeError, match="unknown fix 'magic'"):
        get_fix("magic")
    with pytest.raises(TorchScopeError, match=r"fix prune_l1: amount: must be a number from 0 to 0.95, got 2"):
        get_fix("prune_l1").options({"amount": 2})
    with pytest.raises(TorchScopeError, match=r"fix amp: dtype: must be one of auto, bfloat16, float16, got 'int4'"):
        get_fix("amp").options({"dtype": "int4"})
    with pytest.raises(TorchScopeError, match=r"fix half has no parameter 'amount'; its parameters: dtype"):
        get_fix("half").options({"amount": 1})


@pytest.mark.parametrize("fix_id", ["amp", "channels_last", "conv_bn_fusion", "prune_l1", "torchscript",
                                    "inference_mode", "half", "int8_dynamic"])
def test_the_users_model_never_changes(fix_id):
    m = cnn()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    run_fix(fix_id, m, X_IMG)
    after = m.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(isinstance(x, BATCHNORM) for x in m.modules())
    assert m[0].weight.is_contiguous()


def test_int8_dynamic_is_smaller_and_close():
    m = mlp()
    q, notes = run_fix("int8_dynamic", m, X_VEC)
    assert serialized_bytes(q)[0] < 0.5 * serialized_bytes(m)[0]
    fid = fidelity(ref(m, X_VEC), ref(q, X_VEC), classifier=True)
    assert fid["cosine"] > 0.99 and fid["top1_agreement"] >= 0.8
    assert "torchao" in notes[0] or "torch.ao" in notes[-1]


def test_int8_dynamic_torch_ao_backend():
    m = mlp()
    q, notes = run_fix("int8_dynamic", m, X_VEC, {"backend": "torch.ao"})
    assert "quantize_dynamic" in notes[-1]
    assert sum(type(x).__module__.startswith("torch.ao.nn.quantized.dynamic") and type(x).__name__ == "Linear"
               for x in q.modules()) == 3
    assert serialized_bytes(q)[0] < 0.5 * serialized_bytes(m)[0]
    assert fidelity(ref(m, X_VEC), ref(q, X_VEC), True)["cosine"] > 0.99


def test_conv_bn_fusion_removes_batchnorm_and_keeps_outputs():
    m = cnn()
    fused, notes = run_fix("conv_bn_fusion", m, X_IMG)
    assert not any(isinstance(x, BATCHNORM) for x in fused.modules())
    assert "2 of 2" in notes[0]
    torch.testing.assert_close(ref(fused, X_IMG), ref(m, X_IMG), atol=1e-4, rtol=1e-4)


class Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it, so fusion falls back to pairs."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return y if y.sum() > -1e9 else -y


def test_conv_bn_fusion_fallback_without_fx():
    torch.manual_seed(0)
    m = Untraceable()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    m.eval()
    fused, notes = run_fix("conv_bn_fusion", m, X_IMG)
    assert "fuse_conv_bn_eval" in notes[0] and "fused 1" in notes[0]
    assert isinstance(fused.bn, nn.Identity)
    torch.testing.assert_close(ref(fused, X_IMG), ref(m, X_IMG), atol=1e-4, rtol=1e-4)


def test_channels_last_strides_and_fidelity():
    m = cnn()
    cl, _ = run_fix("channels_last", m, X_IMG)
    w = cl.inner[0].weight
    assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    assert w.stride() == (27, 1, 9, 3)  # NHWC strides of a 16x3x3x3 weight
    torch.testing.assert_close(ref(cl, X_IMG), ref(m, X_IMG), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("amount", [0.3, 0.7])
def test_prune_zero_fraction(amount):
    m = mlp()
    p, _ = run_fix("prune_l1", m, X_VEC, {"amount": amount})
    for a, b in zip(m, p):
        if isinstance(a, nn.Linear):
            zeros = int((b.weight == 0).sum())
            assert zeros == round(amount * a.weight.numel())
            # the smallest-magnitude weights were the ones removed
            kept_min = b.weight[b.weight != 0].abs().min()
            assert kept_min >= a.weight.abs().flatten().kthvalue(zeros).values
    assert zero_fraction(p) == pytest.approx(amount, abs=1e-3)
    assert not hasattr(p[0], "weight_orig")  # pruning made permanent


def test_inference_mode_outputs_are_inference_tensors():
    m = mlp()
    im, _ = run_fix("inference_mode", m, X_VEC)
    out = im(*X_VEC)
    assert out.is_inference()
    torch.testing.assert_close(out, ref(m, X_VEC))


def test_torchscript_freeze():
    m = cnn()
    ts, notes = run_fix("torchscript", m, X_IMG)
    assert isinstance(ts, torch.jit.ScriptModule) and "freeze" in notes[0]
    torch.testing.assert_close(ref(ts, X_IMG), ref(m, X_IMG), atol=1e-5, rtol=1e-5)


def test_half_and_amp_on_cpu_use_bfloat16():
    m = mlp()
    h, notes = run_fix("half", m, X_VEC)
    assert all(p.dtype == torch.bfloat16 for p in h.parameters())
    out = ref(h, X_VEC)
    assert out.dtype == torch.float32
    fid = fidelity(ref(m, X_VEC), out, True)
    assert fid["cosine"] > 0.99 and 0 < fid["max_abs_err"] < 0.1  # bf16 moved the outputs a little
    a, notes = run_fix("amp", m, X_VEC)
    assert "bfloat16" in notes[0]
    fid = fidelity(ref(m, X_VEC), ref(a, X_VEC), True)
    assert fid["cosine"] > 0.99 and fid["max_abs_err"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_amp_on_cuda_uses_float16():
    m = mlp().cuda()
    x = (X_VEC[0].cuda(),)
    a, notes = run_fix("amp", m, x)
    assert "float16" in notes[0]
    assert fidelity(ref(m, x), ref(a, x), True)["cosine"] > 0.99


def test_fidelity_against_hand_numbers():
    a = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    b = torch.tensor([[1.0, 2.5, 3.0], [1.0, 4.0, 1.0]])
    f = fidelity(a, b, True)
    assert f["max_abs_err"] == 2.0 and f["rel_err"] == pytest.approx(2 / 3)
    assert f["top1_agreement"] == 0.5
    assert f["cosine"] == pytest.approx(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0).item())


def test_applies_says_why_not():
    f = facts_of(mlp(), X_VEC)
    assert get_fix("channels_last").applies(f) == (False, "no Conv2d layers: memory format does not matter")
    assert get_fix("conv_bn_fusion").applies(f)[1] == "no BatchNorm layers"
    assert get_fix("int8_dynamic").applies(f)[0]


def im_conf(by):
    return by["inference_mode"]["confidence"]


def test_trials_a_failing_fix_says_why_and_the_others_run(monkeypatch, tmp_path):
    def boom(model, inputs, opts):
        raise RuntimeError("this fix always breaks")

    monkeypatch.setattr(catalog, "FIXES", catalog.FIXES + [catalog.Fix("boom", "Boom", "", boom)])
    m = mlp()
    rows, disturbance, _ = run_trials(m, X_VEC, "cpu", ["boom", "channels_last", "inference_mode"],
                                   facts_of(m, X_VEC), iters=6, warmup=1, artifact_dir=tmp_path)
    json.dumps([rows, disturbance])
    by = {r["fix"]: r for r in rows}
    assert [r["fix"] for r in rows] == ["baseline", "control", "boom", "channels_last", "inference_mode"]
    assert by["control"]["status"] == "ok" and by["control"]["speedup_ci"] is not None
    assert by["control"]["artifact"] is None and by["control"]["size_bytes"] == by["baseline"]["size_bytes"]
    biased = by["control"]["verdict"] != "within noise"  # the measurement itself, not the model
    assert im_conf(by) == ("low" if disturbance["disturbed"] or biased else "normal")
    assert by["boom"]["status"] == "failed" and by["boom"]["why"] == "RuntimeError: this fix always breaks"
    assert by["channels_last"]["status"] == "not_applicable"
    im = by["inference_mode"]
    assert im["status"] == "ok" and im["max_abs_err"] == 0.0 and im["top1_agreement"] == 1.0
    low, high = im["speedup_ci"]  # the geometric mean of 6 interleaved rounds' ratios, inside its interval
    assert low <= im["speedup"] <= high and im["verdict"] == verdict(low, high, by["control"]["speedup_ci"])
    assert im["speedup"] == pytest.approx(by["baseline"]["time_ms"] / im["time_ms"])
    assert by["baseline"]["speedup"] == 1.0 and by["baseline"]["verdict"] is None
    assert im["p90_ms"] >= im["median_ms"] > 0
    assert im["throughput_per_s"] == pytest.approx(16 / (im["median_ms"] / 1e3))
    art = im["artifact"]
    assert art["kind"] == "torchscript"
    loaded = torch.jit.load(art["path"])
    torch.testing.assert_close(loaded(*X_VEC), ref(m, X_VEC))
    assert json.loads(open(art["recipe"]).read())["fix"] == "inference_mode"


def test_candidates_are_timed_in_interleaved_rounds():
    from diagnostics.analyses.optimize.trials import time_interleaved

    log = []

    class Tag(nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def forward(self, x):
            log.append(self.name)
            return x

    times, _, _ = time_interleaved({"a": Tag("a"), "b": Tag("b"), "c": Tag("c")}, (torch.zeros(4, 2),),
                             torch.device("cpu"), iters=3, warmup=2)
    # 2 warm-up calls each, then 3 rounds, each a permutation and its reverse
    text = "".join(log)
    assert text[:6] == "aabbcc" and len(text) == 6 + 3 * 6
    for r in range(3):
        half = text[6 + 6 * r: 9 + 6 * r]
        assert sorted(half) == ["a", "b", "c"] and text[9 + 6 * r: 12 + 6 * r] == half[::-1]
    assert times["b"]["speedup"] > 0 and times["a"]["speedup"] == 1.0
    assert times["a"]["throughput_per_s"] == pytest.approx(4 / (times["a"]["median_ms"] / 1e3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_trials_on_cuda_measure_memory_and_time(tmp_path):
    m = mlp().cuda()
    x = (X_VEC[0].cuda(),)
    rows, _, _ = run_trials(m, x, "cuda:0", ["half", "int8_dynamic"], facts_of(m, x) | {"env": environment_facts("cuda:0")},
                      iters=5, warmup=2)
    by = {r["fix"]: r for r in rows}
    assert by["baseline"]["peak_bytes"] > 0 and by["baseline"]["median_ms"] > 0
    assert by["half"]["status"] == "ok" and by["half"]["size_ratio"] == pytest.approx(0.5, abs=0.05)
    # torchao (a requirement) quantizes on CUDA; without it the row must say so, not pass quietly
    import importlib.util

    if importlib.util.find_spec("torchao") is not None:
        assert by["int8_dynamic"]["status"] == "ok", by["int8_dynamic"]["why"]
        assert by["int8_dynamic"]["cosine"] > 0.99
    else:
        assert by["int8_dynamic"]["status"] == "not_applicable"
        assert "torchao is not installed" in by["int8_dynamic"]["why"]


def test_int8_on_gpt2_quantizes_conv1d_and_keeps_the_tied_head():
    # issue #17 item 6: GPT-2's blocks are transformers Conv1D (skipped before: only lm_head was
    # quantized), and its lm_head shares the embedding's weight (an int8 copy grew the file 1.24x)
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4,
                                                                 n_positions=32)).eval()

    class Logits(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids).logits

    ids = (torch.randint(0, 1000, (2, 16)),)
    model = Logits(gpt2)
    for backend in ("torchao", "torch.ao"):
        q, notes = run_fix("int8_dynamic", model, ids, {"backend": backend})
        assert "8 transformers Conv1D layers turned into the equivalent nn.Linear first" in notes[0]
        assert "m.lm_head (tied to m.transformer.wte.weight)" in notes[1]
        base_size, q_size = serialized_bytes(model)[0], serialized_bytes(q)[0]
        # the 8 block matrices (4 * 64 * 64 * ... ) go to int8; the tied embedding stays float, stored once
        assert q_size < 0.9 * base_size, (backend, q_size / base_size)
        assert q.m.lm_head.weight.data_ptr() == q.m.transformer.wte.weight.data_ptr()
        f = fidelity(ref(model, ids), ref(q, ids), classifier=True)
        assert f["cosine"] > 0.99, (backend, f)


# ----------------------------------------------------------------------------- why a fix failed, in full
class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return {"logits": self.fc(x), "features": x}


def _cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def test_a_torchscript_trial_on_dict_outputs_traces_non_strict_and_says_so():
    m = DictOut().eval()
    rows, _, _ = run_trials(m, X_VEC, "cpu", ["torchscript"], facts_of(m, X_VEC), iters=2, warmup=1)
    row = rows[-1]
    assert row["status"] == "ok", row["why"]
    assert row["notes"][0].startswith("torch.jit.trace(strict=False) + torch.jit.freeze")
    assert "traced with strict=False: the model returns a dict, which a strict trace refuses" in row["notes"][1]
    ts, _ = run_fix("torchscript", m, X_VEC)
    out, base = ts(*X_VEC), ref(m, X_VEC)
    assert set(out) == {"logits", "features"} and torch.allclose(out["logits"], base["logits"], atol=1e-6)
    assert row["cosine"] == pytest.approx(_cosine(base["logits"], out["logits"]), abs=1e-9)


def _hf_lms():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                                                bos_token_id=0, eos_token_id=0)).eval()
    bert = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                                                num_attention_heads=4, intermediate_size=128)).eval()
    return {"gpt2": gpt2, "bert": bert}


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_the_torchscript_fix_runs_on_transformers_model_outputs(name):
    """GPT-2's CausalLMOutputWithCrossAttentions holds a DynamicCache (no strict or non-strict trace
    takes it): traced through the output-flattening wrapper. BERT's MaskedLMOutput holds tensors only."""
    model = _hf_lms()[name]
    ids = (torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(4)),)
    rows, _, _ = run_trials(model, ids, "cpu", ["torchscript"], {"static": {}, "env": {}}, iters=2, warmup=1)
    row = rows[-1]
    assert row["status"] == "ok", row["why"]
    base = ref(model, ids).logits
    ts, notes = run_fix("torchscript", model, ids)
    out = ts(*ids)
    logits = out[0] if isinstance(out, tuple) else out["logits"]
    assert logits.shape == base.shape and _cosine(base, logits) > 0.99999
    assert row["cosine"] == pytest.approx(_cosine(base, logits), abs=1e-6) and row["cosine"] > 0.99999
    assert notes == row["notes"]
    if name == "gpt2":
        assert notes[0].startswith("torch.jit.trace through an output-flattening wrapper + torch.jit.freeze")
        assert notes[1] == ("traced through an output-flattening wrapper: the CausalLMOutputWithCrossAttentions output "
                            "becomes a tuple of its 1 tensor, in order; left out (not tensors): "
                            f"{list(ref(model, ids).keys())[1]} (DynamicCache)")
        assert isinstance(out, tuple) and len(out) == 1
    else:
        assert notes[0].startswith("torch.jit.trace(strict=False)") and "strict=False" in notes[1]


def test_a_torchscript_trial_names_the_output_parts_the_wrapper_leaves_out():
    class StrOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 4)

        def forward(self, x):
            return self.fc(x), "label"

    m = StrOut().eval()
    rows, _, _ = run_trials(m, X_VEC, "cpu", ["torchscript"], {"static": {}, "env": {}}, iters=2, warmup=1)
    # torch.jit.trace refuses a str in the output; the wrapper drops it and names it
    assert rows[-1]["status"] == "ok" and "left out (not tensors): output[1] (str)" in rows[-1]["notes"][1]


def test_fixes_that_change_dtype_layout_or_modules_do_not_apply_to_an_exported_program(tmp_path):
    from diagnostics.analyses.optimize.catalog import EXPORT_DTYPE, EXPORT_LAYOUT, EXPORT_QUANTIZE, EXPORT_STRUCTURE
    from diagnostics.runner import Job, execute
    from diagnostics.spec import InputSpec, ModelSpec

    class WithConstant(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 8 * 8, 10)

        def forward(self, x):
            h = self.conv(x).flatten(1)
            return self.fc(h + torch.arange(h.shape[1], dtype=torch.float32))  # a float32 tensor made in the graph

    x = torch.randn(2, 3, 8, 8)
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(WithConstant().eval(), (x,)), str(path))
    # what the half fix did on it before: a bare dtype mismatch
    loaded = torch.export.load(str(path)).module()
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        run_fix("half", loaded, (x,))[0](x)
    spec = ModelSpec(source="export", name="m.pt2", path=str(path), inputs=(InputSpec((2, 3, 8, 8)),))
    r = execute(Job("optimize", spec, {"fixes": ["half", "channels_last", "conv_bn_fusion", "int8_dynamic",
                                                  "prune_l1", "inference_mode"], "iters": 2, "warmup": 1,
                                        "save_artifacts": False}), tmp_path / "out")
    rows = {row.fix: row for row in r.rows}
    assert rows["half"].status == "not_applicable" and rows["half"].why == EXPORT_DTYPE
    assert "fixed at export time" in EXPORT_DTYPE and "export a 16-bit copy instead" in EXPORT_DTYPE
    assert rows["channels_last"].why == EXPORT_LAYOUT
    for fix in ("conv_bn_fusion", "prune_l1"):
        assert rows[fix].status == "not_applicable" and rows[fix].why == EXPORT_STRUCTURE
    assert rows["int8_dynamic"].status == "not_applicable" and rows["int8_dynamic"].why == EXPORT_QUANTIZE
    assert rows["inference_mode"].status == "ok"  # a fix that leaves the graph alone still runs


def test_int8_on_an_all_linear_exported_program_says_why_and_static_int8_quantizes_the_graph(tmp_path):
    """Dynamic int8 swaps nn.Linear modules; an exported program has none (its module count is 0 on
    an all-Linear model): the row says why and points at static int8 (PT2E), which quantizes the graph."""
    from diagnostics.analyses.optimize.catalog import EXPORT_QUANTIZE
    from diagnostics.intake import load_model
    from diagnostics.runner import Job, execute
    from diagnostics.spec import InputSpec, ModelSpec

    m, x = mlp(), torch.randn(8, 64)
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(m, (x,)), str(path))
    spec = ModelSpec(source="export", name="mlp.pt2", path=str(path), inputs=(InputSpec((8, 64)),))
    assert static_facts(load_model(spec).model).n_linear == 0  # what misled the old check
    r = execute(Job("optimize", spec, {"fixes": ["int8_dynamic", "static_int8"], "iters": 2, "warmup": 1,
                                       "save_artifacts": False}), tmp_path / "out")
    rows = {row.fix: row for row in r.rows}
    why = rows["int8_dynamic"].why
    assert rows["int8_dynamic"].status == "not_applicable" and why == EXPORT_QUANTIZE
    assert "no Linear / LSTM / GRU layers" not in why and "static int8 fix" in why and "export it again" in why
    row = rows["static_int8"]
    assert row.status == "ok", row.why
    assert "quantized: 3 of 3 conv/linear ops (3 linear)" in " ".join(row.notes)
    assert row.cosine > 0.999


class _HalveGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


class WithAutogradFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.b(_HalveGrad.apply(torch.relu(self.a(x))))


def test_torchscript_on_a_custom_autograd_function_is_not_applicable_in_one_line():
    """torch.jit.trace cannot record a Python autograd Function: the trial said 'failed' with the tracer's
    stack dump down to multiprocessing internals; it is not applicable, and says why in one line."""
    from diagnostics.analyses.optimize.fixes import FixNotApplicable

    with pytest.raises(FixNotApplicable) as e:
        run_fix("torchscript", WithAutogradFunction().eval(), X_VEC)
    msg = str(e.value)
    assert msg.startswith("the model calls the Python autograd Function _HalveGrad (in test_fixes.py:")
    assert "torch.jit.trace cannot record" in msg and "\n" not in msg and "multiprocessing" not in msg
    assert "spawn.py" not in msg and "function.py" not in msg


def test_int8_and_structural_fixes_on_torchscript_name_what_it_holds():
    """A TorchScript program's Linear layers are compiled modules (RecursiveScriptModule, original_name
    'Linear'): the int8 row said 'no Linear layers' on a model with nine."""
    torch.manual_seed(0)
    layers = [nn.Linear(16, 16) for _ in range(9)]
    ts = torch.jit.script(nn.Sequential(*[x for l in layers for x in (l, nn.ReLU())]).eval())
    s = static_facts(ts)
    assert s.torchscript and s.script_types["Linear"] == 9
    facts = {"static": s, "env": environment_facts("cpu"), "source": "torchscript"}
    for fix in ("int8_dynamic", "prune_l1", "conv_bn_fusion", "channels_last"):
        ok, why = get_fix(fix).applies(facts)
        assert not ok and why.startswith("the model is TorchScript"), (fix, why)
        assert "no Linear" not in why
    ok, why = get_fix("int8_dynamic").applies(facts)
    assert "its 9 Linear layers" in why
