"""Inputs by keyword (issue #17 item 9): example_inputs() may return a tuple (positional), a dict (keyword
inputs) or an (args, kwargs) pair, and every analysis, fix, batch override, the CLI's --input grammar
and the sidebar feed keyword inputs by name.

Two models: a file whose forward takes keyword-only tensors, and a real transformers T5 from a tiny
config whose example_inputs returns {"input_ids": ..., "decoder_input_ids": ...}."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from diagnostics.errors import ModelLoadError, SpecError
from diagnostics.inputs import Inputs, as_inputs, call, from_example, make_inputs, rows, specs_of
from diagnostics.intake import load_model
from diagnostics.results import metrics_of, to_plain
from diagnostics.runner import Job, execute
from diagnostics.spec import InputSpec, ModelSpec, cache_key, parse_input, parse_inputs

KW_ONLY = textwrap.dedent("""
    import torch
    from torch import nn

    class KwOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.proj = nn.Linear(8, 4)
            self.gate = nn.Linear(3, 4)

        def forward(self, *, tokens, features):  # keyword-only: model(*inputs) cannot call it
            return self.proj(self.emb(tokens).mean(1)) + self.gate(features)

    def build_model():
        return KwOnly()

    def example_inputs():
        return {"tokens": torch.randint(0, 50, (4, 6)), "features": torch.randn(4, 3)}
""")

T5_FILE = textwrap.dedent("""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    CONFIG = dict(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                  decoder_start_token_id=0, pad_token_id=0)

    def build_model():
        torch.manual_seed(0)
        return T5ForConditionalGeneration(T5Config(**CONFIG))

    def example_inputs():
        g = torch.Generator().manual_seed(0)
        return {"input_ids": torch.randint(1, 100, (2, 16), generator=g),
                "decoder_input_ids": torch.randint(1, 100, (2, 8), generator=g)}

    def loss_fn(out):
        return out.logits.float().pow(2).mean()
""")


@pytest.fixture(scope="module")
def kw_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kw") / "kw_only.py"
    path.write_text(KW_ONLY)
    return path


@pytest.fixture(scope="module")
def t5_file(tmp_path_factory):
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("t5") / "t5_tiny.py"
    path.write_text(T5_FILE)
    return path


def _spec(path, **kw) -> ModelSpec:
    return ModelSpec(source="python", name=path.name, path=str(path), **kw)


def _t5_reference():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    return T5ForConditionalGeneration(T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                               num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                                               pad_token_id=0))


# ----------------------------------------------------------------------------- the grammar and the spec
def test_a_keyword_input_is_written_name_equals_shape():
    assert parse_input("input_ids=2,16:int64:100") == InputSpec((2, 16), "int64", 100, "input_ids")
    assert parse_input(" decoder_input_ids = 2x8 :int64") == InputSpec((2, 8), "int64", None, "decoder_input_ids")
    assert parse_input("8,3,32,32") == InputSpec((8, 3, 32, 32))  # positional as before
    assert parse_inputs("2,3 ; mask=2,3:bool") == (InputSpec((2, 3)), InputSpec((2, 3), "bool", None, "mask"))


@pytest.mark.parametrize("text, message", [
    ("1ids=2,16", "input name '1ids' in '1ids=2,16': a keyword argument of forward() (a Python identifier)"),
    ("ids=", "'ids=': write [NAME=]SHAPE[:DTYPE[:HIGH]]"),
    ("ids=2,a:int64", "shape '2,a': dimensions must be positive integers"),
    ("ids=2,16:int8", "dtype 'int8' in 'ids=2,16:int8'"),
])
def test_bad_keyword_grammar_is_named(text, message):
    with pytest.raises(SpecError) as e:
        parse_input(text)
    assert message in str(e.value)


def test_positional_inputs_come_first_and_names_once():
    with pytest.raises(SpecError, match=r"positional input 2 comes after keyword input\(s\) ids: give positional"):
        parse_inputs("ids=2,3:int64 ; 2,3")
    with pytest.raises(SpecError, match="keyword input 'ids' is given twice"):
        ModelSpec(inputs=(InputSpec((2, 3), name="ids"), InputSpec((2, 4), name="ids")))


def test_keyword_specs_round_trip_and_positional_keys_stay_as_they_were():
    spec = ModelSpec(name="transformer", inputs=(InputSpec((2, 3)), InputSpec((2, 8), "int64", 100, "ids")))
    back = ModelSpec.from_json(spec.to_json())
    assert back == spec and back.inputs[1].name == "ids" and back.inputs[0].name is None
    # a positional input serialises without a name key: cache keys of existing runs do not move
    positional = ModelSpec(name="mlp", inputs=(InputSpec((32, 64)),))
    assert positional.to_dict()["inputs"] == [{"shape": [32, 64], "dtype": "float32", "high": None}]
    assert cache_key(positional, "summary", {}) == cache_key(ModelSpec.from_json(positional.to_json()), "summary", {})


# ----------------------------------------------------------------------------- the structure
def test_example_inputs_forms():
    a, b = torch.randn(2, 3), torch.ones(2, 5, dtype=torch.int64)
    assert from_example(a).args == (a,) and from_example(a).kwargs == {}
    assert from_example((a, b)).args == (a, b)
    kw = from_example({"x": a, "ids": b})
    assert kw.args == () and list(kw.kwargs) == ["x", "ids"] and kw.kwargs["ids"] is b
    pair = from_example(((a,), {"ids": b}))
    assert pair.args == (a,) and pair.kwargs == {"ids": b} and len(pair) == 2
    assert specs_of(pair) == (InputSpec((2, 3)), InputSpec((2, 5), "int64", 2, "ids"))


@pytest.mark.parametrize("value, message", [
    ({"ids": [1, 2]}, "example_inputs(): keyword input 'ids' is a list, not a tensor"),
    ((torch.ones(1), "x"), "example_inputs(): positional input 2 is a str, not a tensor"),
    (3, "example_inputs() returned a int; it must return a tensor, a tuple of tensors (positional inputs), a dict"),
    ({"not valid": torch.ones(1)}, "keyword input name 'not valid' is not a Python identifier"),
])
def test_bad_example_inputs_are_named(value, message):
    with pytest.raises(SpecError) as e:
        from_example(value)
    assert message in str(e.value)


def test_inputs_call_split_and_copy_keep_the_names():
    def f(x, *, scale, shift):
        return x * scale + shift

    x, s, t = torch.arange(6.0).reshape(3, 2), torch.full((3, 2), 2.0), torch.ones(3, 2)
    inputs = Inputs((x,), {"scale": s, "shift": t})
    assert torch.equal(call(f, inputs), x * 2 + 1)
    assert torch.equal(call(lambda a: a + 1, (x,)), x + 1)  # a plain tuple: positional
    top = rows(inputs, 0, 2, 3)
    assert top.names == ("scale", "shift") and top.kwargs["scale"].shape == (2, 2) and top.args[0].shape == (2, 2)
    import copy
    import pickle
    for clone in (copy.deepcopy(inputs), pickle.loads(pickle.dumps(inputs))):
        assert clone.names == ("scale", "shift") and torch.equal(call(f, clone), x * 2 + 1)
    assert as_inputs({"a": x}).kwargs == {"a": x}


def test_made_inputs_are_the_same_for_positional_specs_as_before():
    """make_inputs draws positional tensors exactly as intake did (same generator, same order)."""
    specs = (InputSpec((2, 3)), InputSpec((2, 4), "int64", 9))
    made = make_inputs(specs, "cpu", 5)
    g = torch.Generator().manual_seed(5)
    assert torch.equal(made[0], torch.randn((2, 3), generator=g))
    assert torch.equal(made[1], torch.randint(0, 9, (2, 4), generator=g))
    named = make_inputs(specs[:1] + (InputSpec((2, 4), "int64", 9, "ids"),), "cpu", 5)
    assert named.names == ("ids",) and torch.equal(named.kwargs["ids"], made[1])


# ----------------------------------------------------------------------------- a keyword-only model
def test_a_keyword_only_model_loads_and_runs(kw_file):
    loaded = load_model(_spec(kw_file))
    assert [s.name for s in loaded.input_specs] == ["tokens", "features"]
    assert loaded.inputs.args == () and loaded.inputs.kwargs["tokens"].shape == (4, 6)
    assert loaded.forward().shape == (4, 4)
    assert loaded.batch_size == 4


def test_batch_override_scales_every_keyword_input(kw_file):
    loaded = load_model(_spec(kw_file, batch_size=3))
    assert {k: tuple(v.shape) for k, v in loaded.inputs.kwargs.items()} == {"tokens": (3, 6), "features": (3, 3)}
    assert loaded.forward().shape == (3, 4)
    bigger = loaded.make_inputs(10)
    assert {k: tuple(v.shape) for k, v in bigger.kwargs.items()} == {"tokens": (10, 6), "features": (10, 3)}
    assert int(bigger.kwargs["tokens"].max()) < 50  # the range came from the example's values (max + 1)


def test_a_keyword_only_model_summary_counts_exactly(kw_file, tmp_path):
    result = execute(Job("summary", _spec(kw_file), {}), tmp_path)
    m = result.metrics
    assert m.params_total == 50 * 8 + (8 * 4 + 4) + (3 * 4 + 4) == 452
    assert m.flops_forward == 2 * 4 * 8 * 4 + 2 * 4 * 3 * 4  # the two Linear layers at batch 4
    assert to_plain(result)["inputs"] == [{"shape": [4, 6], "dtype": "int64", "name": "tokens"},
                                {"shape": [4, 3], "dtype": "float32", "name": "features"}]


def test_a_bad_example_inputs_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(KW_ONLY.replace('"features": torch.randn(4, 3)', '"features": 3.0'))
    with pytest.raises(ModelLoadError, match=r"example_inputs\(\) in bad.py: keyword input 'features' is a float"):
        load_model(_spec(path))


def test_keyword_inputs_through_every_inference_fix(kw_file, tmp_path):
    fixes = ["amp", "int8_dynamic", "torchscript", "inference_mode", "half", "channels_last"]
    result = execute(Job("optimize", _spec(kw_file), {"fixes": fixes, "iters": 2, "warmup": 0}), tmp_path)
    rows_ = {r.fix: r for r in result.rows}
    for fix in fixes:
        assert rows_[fix].status in ("ok", "not_applicable"), (fix, rows_[fix].why)
        assert rows_[fix].status == "ok" or rows_[fix].why, fix
    assert rows_["torchscript"].status == "ok" and rows_["torchscript"].cosine > 0.9999
    assert any("keyword inputs (tokens, features) traced by position" in n for n in rows_["torchscript"].notes)
    assert rows_["torchscript"].artifact.kind == "torchscript"
    assert rows_["channels_last"].why == "no Conv2d layers: memory format does not matter"


def test_keyword_inputs_through_training_fixes(kw_file, tmp_path):
    fixes = ["grad_accumulation", "amp", "fused_optimizer"]
    result = execute(Job("optimize", _spec(kw_file), {"fixes": fixes, "mode": "train", "iters": 2, "warmup": 0}),
                     tmp_path)
    rows_ = {r.fix: r for r in result.rows}
    for fix in fixes:
        assert rows_[fix].status == "ok", (fix, rows_[fix].why)
    # two micro-batches of the keyword inputs (rows split by name): the same gradients as the whole batch
    assert rows_["grad_accumulation"].grad_cosine > 0.9999


def test_keyword_inputs_export_to_onnx_and_pt2e(kw_file, tmp_path):
    pytest.importorskip("onnxruntime")
    result = execute(Job("optimize", _spec(kw_file), {"fixes": ["onnxruntime", "static_int8"], "iters": 2,
                                                       "warmup": 0}), tmp_path)
    rows_ = {r.fix: r for r in result.rows}
    assert rows_["onnxruntime"].status == "ok", rows_["onnxruntime"].why
    assert rows_["onnxruntime"].max_abs_err < 1e-5
    assert rows_["static_int8"].status == "ok", rows_["static_int8"].why


# ----------------------------------------------------------------------------- a real T5
def test_t5_with_keyword_inputs_summary_counts_its_parameters(t5_file, tmp_path):
    result = execute(Job("summary", _spec(t5_file), {}), tmp_path)
    reference = _t5_reference()
    # parameters() yields each Parameter once: T5's lm_head is tied to the shared embedding
    assert result.metrics.params_total == sum(p.numel() for p in reference.parameters())
    assert [i.name for i in result.inputs] == ["input_ids", "decoder_input_ids"]
    assert result.metrics.flops_forward > 0 and result.metrics.batch_size == 2


@pytest.mark.parametrize("analysis, options", [
    ("profile", {"mode": "train", "wait": 0, "warmup": 0, "active": 1, "latency_iters": 2, "latency_warmup": 0,
                 "roofline": False}),
    ("memory", {"timeline": False}),
    ("gradients", {"steps": 2}),
    ("checklist", {"iters": 1, "profile_steps": 1}),
])
def test_t5_with_keyword_inputs_runs_every_analysis(t5_file, tmp_path, analysis, options):
    result = execute(Job(analysis, _spec(t5_file), options), tmp_path)
    m = metrics_of(result)  # typed or (not converted yet) plain: its headline metrics as a dict
    if analysis == "memory":
        assert m["input_bytes"] == (2 * 16 + 2 * 8) * 8  # both int64 keyword inputs
        assert m["peak_train_bytes"] > m["param_bytes"] > 0
    if analysis == "gradients":
        assert m["layers"] > 0 and m["loss_first"] > 0
        assert result.loss == "loss_fn() from the uploaded file"
    if analysis == "profile":
        assert m["latency_median_ms"] > 0 and m["batch_size"] == 2
    if analysis == "checklist":
        assert m["applicable"] > 0 and m["error"] == 0
        assert result.facts.errors == {}  # every probe (forward, train step, profile, compile) ran


def test_t5_with_keyword_inputs_through_fixes(t5_file, tmp_path):
    fixes = ["amp", "int8_dynamic", "inference_mode", "channels_last"]
    result = execute(Job("optimize", _spec(t5_file), {"fixes": fixes, "iters": 2, "warmup": 0,
                                                       "save_artifacts": False}), tmp_path)
    rows_ = {r.fix: r for r in result.rows}
    for fix in fixes:
        assert rows_[fix].status in ("ok", "not_applicable"), (fix, rows_[fix].why)
        assert rows_[fix].status == "ok" or rows_[fix].why, fix
    assert rows_["inference_mode"].status == "ok" and rows_["inference_mode"].max_abs_err == 0


# ----------------------------------------------------------------------------- the CLI
def test_cli_keyword_inputs_reach_the_model(t5_file, tmp_path, capsys):
    from diagnostics.cli.main import main

    out = tmp_path / "r"
    code = main(["summary", "--data-dir", str(tmp_path / "store"), "--out", str(out), "-q", "--skip-backward",
                 "--model", str(t5_file), "--input", "input_ids=3,16:int64:100",
                 "--input", "decoder_input_ids=3,8:int64:100"])
    assert code == 0, capsys.readouterr().err
    result = json.loads((next(out.glob("summary-*")) if not (out / "result.json").exists() else out)
                        .joinpath("result.json").read_text())
    assert result["inputs"] == [{"shape": [3, 16], "dtype": "int64", "name": "input_ids"},
                                {"shape": [3, 8], "dtype": "int64", "name": "decoder_input_ids"}]
    assert result["metrics"]["batch_size"] == 3


def test_cli_builds_keyword_specs_with_a_default_range(kw_file):
    from diagnostics.cli.model_args import build_spec

    spec = build_spec(str(kw_file), inputs=["tokens=2,6:int64", "features=2,3"])
    assert spec.inputs == (InputSpec((2, 6), "int64", 1000, "tokens"), InputSpec((2, 3), name="features"))


@pytest.mark.parametrize("inputs, needle", [
    (["ids=2,16:int64", "2,3"], "bad --input: positional input 2 comes after keyword input(s) ids"),
    (["1ids=2,16"], "bad --input input name '1ids' in '1ids=2,16'"),
    (["ids=2,16", "ids=2,8"], "keyword input 'ids' is given twice"),
])
def test_cli_bad_keyword_grammar_exits_2_naming_it(inputs, needle, tmp_path, capsys):
    from diagnostics.cli.main import main

    args = [a for i in inputs for a in ("--input", i)]
    assert main(["summary", "--no-report", "--data-dir", str(tmp_path), "--model", "mlp", *args]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and captured.out == ""


# ----------------------------------------------------------------------------- the sidebar
def test_the_sidebar_shows_keyword_inputs_by_name(new_app, kw_file, tmp_path):
    from diagnostics.runner import run_job
    from ui import state

    spec = _spec(kw_file, file_sha256="kw")
    validated = run_job(Job("validate", spec), artifact_dir=tmp_path / "v")
    assert validated.ok, validated.error
    assert [i.name for i in validated.result.inputs] == ["tokens", "features"]
    at = new_app()
    at.session_state["sb_source"] = "Upload a file"
    at.session_state[state.MODEL_INFO] = {"spec": spec.to_dict(), "check": validated.result}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [t.label for t in at.sidebar.text_input]
    assert "Keyword input tokens shape (after batch)" in labels
    assert "Keyword input features shape (after batch)" in labels
    assert at.session_state[state.SPEC].inputs is None  # as declared: the file's own example values
    at.sidebar.number_input(key="sb_batch_python-kw_only.py-kw").set_value(5).run()
    assert not at.exception, [e.value for e in at.exception]
    edited = at.session_state[state.SPEC].inputs
    assert [(s.name, s.shape) for s in edited] == [("tokens", (5, 6)), ("features", (5, 3))]


def test_keyword_inputs_through_compile_and_the_batch_scan(kw_file, tmp_path):
    compiled = execute(Job("compile", _spec(kw_file), {"backend": "eager", "rounds": 2, "warmup": 0, "train": True}),
                       tmp_path / "c")
    m = compiled.metrics
    assert m.graph_count == 1 and m.graph_break_count == 0 and m.fullgraph_ok is True
    assert m.train_speedup is not None  # the training step ran compiled, keyword inputs by name
    scan = execute(Job("batch_scan", _spec(kw_file), {"mode": "train", "max_batch": 16, "repeats": 1}), tmp_path / "b")
    assert [r.batch for r in scan.rows] == [1, 2, 4, 8, 16] and all(r.fits for r in scan.rows)
    assert scan.metrics.largest_batch_under_budget == 16
    peaks = [r.peak_bytes for r in scan.rows]
    assert peaks == sorted(peaks) and peaks[-1] > peaks[0]  # every keyword tensor grew with the batch


def test_a_rejected_keyword_input_is_named_in_the_error(kw_file):
    from diagnostics.errors import ModelRunError

    spec = _spec(kw_file, inputs=(InputSpec((4, 6), "int64", 50, "tokens"), InputSpec((4, 5), name="features")))
    with pytest.raises(ModelRunError, match=r"the model rejected its inputs \(tokens=\[4, 6\] int64, "
                                            r"features=\[4, 5\] float32\)"):
        load_model(spec).forward()


def test_an_export_archive_with_keyword_example_inputs_keeps_them(tmp_path):
    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x, *, scale):
            return self.lin(x) * scale

    path = tmp_path / "gate.pt2"
    torch.export.save(torch.export.export(Gate(), (torch.randn(5, 3),), {"scale": torch.rand(5, 2)}), str(path))
    loaded = load_model(ModelSpec(source="export", name=path.name, path=str(path)))
    assert [(s.name, s.shape) for s in loaded.input_specs] == [(None, (5, 3)), ("scale", (5, 2))]
    assert loaded.forward().shape == (5, 2)


def test_the_engine_never_calls_a_model_with_star_inputs():
    """model(*inputs) would pass keyword inputs by position: the engine calls through diagnostics.inputs."""
    import ast
    from pathlib import Path

    engine = Path(__file__).resolve().parents[1] / "diagnostics"
    bad = []
    for path in sorted(engine.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or any(k.arg is None for k in node.keywords):
                continue  # f(*args, **kwargs) forwards both
            for arg in node.args:
                if isinstance(arg, ast.Starred):
                    name = ast.unparse(arg.value)
                    if "input" in name or name in ("x", "xs", "part", "bigger", "batch"):
                        bad.append(f"{path.relative_to(engine.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert bad == []
