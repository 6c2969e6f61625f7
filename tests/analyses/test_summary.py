"""Summary numbers against hand computation on small layers."""

from pathlib import Path

import pytest

import torch
from torch import nn

from diagnostics.intake import LoadedModel, default_loss
from diagnostics.runner import AnalysisContext, Job
from diagnostics.spec import InputSpec, ModelSpec
from diagnostics.analyses.summary import job as summary
def run_summary(model, *inputs, tmp_path=Path("/tmp")):
    ctx = AnalysisContext(Job("summary", ModelSpec()), tmp_path)
    ctx._loaded = LoadedModel(ModelSpec(name="handmade"), model,
                              tuple(InputSpec(tuple(t.shape)) for t in inputs), inputs, default_loss, "mse")
    return summary.analyze(ctx, {})


def layer(result, name):
    return next(l for l in result.layers if l.name == name)


def test_linear_counts(tmp_path, no_hooks_left):
    B, I, O = 4, 10, 5
    model = nn.Sequential(nn.Linear(I, O))
    r = run_summary(model, torch.randn(B, I), tmp_path=tmp_path)
    m = r.metrics
    assert m.params_total == I * O + O == 55
    assert m.param_bytes == 55 * 4
    assert m.flops_forward == 2 * B * I * O
    # Backward of the only layer: grad of the weight (input needs no grad) = one more matmul.
    assert m.flops_backward == 2 * B * I * O
    assert layer(r, "0").output_shape == [B, O]
    assert layer(r, "0").pct_of_total == 100.0
    no_hooks_left(model)
    assert model.training  # mode restored


def test_conv2d_flops(tmp_path):
    B, C, K, H, W = 2, 3, 8, 16, 16
    model = nn.Sequential(nn.Conv2d(C, K, 3, padding=1, bias=False))
    r = run_summary(model, torch.randn(B, C, H, W), tmp_path=tmp_path)
    assert r.metrics.params_total == K * C * 9
    assert r.metrics.flops_forward == 2 * B * K * H * W * C * 9
    assert layer(r, "0").output_shape == [B, K, H, W]


class Attn(nn.Module):
    def __init__(self, E, h):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, h, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def test_attention_is_counted(tmp_path):
    B, L, E, h = 2, 12, 16, 4
    model = Attn(E, h)
    r = run_summary(model, torch.randn(B, L, E), tmp_path=tmp_path)
    in_proj = 2 * B * L * E * 3 * E
    scores = 2 * B * L * L * E  # h heads of (L x E/h) @ (E/h x L)
    weighted = 2 * B * L * L * E
    out_proj = 2 * B * L * E * E
    assert r.metrics.flops_forward == in_proj + scores + weighted + out_proj
    assert r.metrics.params_total == 3 * E * E + 3 * E + E * E + E


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 6, bias=False)
        self.dec = nn.Linear(6, 6, bias=False)
        self.dec.weight = self.enc.weight

    def forward(self, x):
        return self.dec(self.enc(x))


def test_tied_weights_count_once(tmp_path):
    r = run_summary(Tied(), torch.randn(2, 6), tmp_path=tmp_path)
    assert r.metrics.params_total == 36
    assert r.metrics.tied_parameters == 1
    assert layer(r, "enc").params == 36 and layer(r, "dec").params == 0


def test_frozen_parameters(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)
    r = run_summary(model, torch.randn(3, 4), tmp_path=tmp_path)
    assert r.metrics.params_frozen == 20 and r.metrics.params_trainable == 10


def test_result_is_typed_and_round_trips_through_json(tmp_path):
    import json

    from diagnostics.analyses.summary import ANALYSIS, SummaryResult
    from diagnostics.results import decode, to_json
    from sample_models import SAMPLES
    s = SAMPLES["resnet"]
    r = run_summary(s.build(), torch.randn(2, 3, 32, 32), tmp_path=tmp_path)
    assert isinstance(r, SummaryResult) and decode(ANALYSIS, json.loads(to_json(r))) == r
    assert r.metrics.params_total == sum(p.numel() for p in s.build().parameters())


def test_tied_weights_of_an_exported_model_are_counted_once(tmp_path):
    """torch.export save/load returns tied weights as two Parameters over one storage."""
    import torch
    from torch import nn

    from diagnostics.runner import Job, execute
    from diagnostics.spec import InputSpec, ModelSpec

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 16)
            self.head = nn.Linear(16, 100, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.emb(x))

    path = tmp_path / "lm.pt2"
    torch.export.save(torch.export.export(LM(), (torch.randint(0, 100, (2, 5)),)), str(path))
    spec = ModelSpec(source="export", name="lm.pt2", path=str(path), inputs=(InputSpec((2, 5), "int64", high=100),))
    m = execute(Job("summary", spec), tmp_path / "out").metrics
    assert m.params_total == 100 * 16 and m.tied_parameters == 1 and m.param_bytes == 100 * 16 * 4


def test_a_flop_counter_failure_leaves_the_summary_with_flops_not_counted(tmp_path, monkeypatch):
    from diagnostics.analyses.summary import job as summary_job
    from diagnostics.runner import Job, execute
    from diagnostics.spec import ModelSpec

    class Broken:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            raise AssertionError("the counter tripped on this model")

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(summary_job, "FlopCounter", Broken)
    r = execute(Job("summary", ModelSpec(name="mlp")), tmp_path)
    m = r.metrics
    assert m.params_total > 0 and m.flops_forward is None and m.flops_train_step is None
    assert r.notes[0].startswith("FLOPs not counted: torch's FlopCounterMode failed on this model "
                                    "(AssertionError: the counter tripped on this model)")
    assert all(l.flops_forward is None for l in r.layers) and r.output_shape == [32, 10]


def test_a_counter_failing_under_no_grad_counts_with_gradients_enabled(tmp_path, monkeypatch):
    """torch's counter tripped under no_grad on DeBERTa's position projections and worked with gradients
    recorded: count there, and say so, rather than 'not counted'."""
    from diagnostics.analyses.summary import job as summary_job
    from diagnostics.measure.flops import FlopCounter
    from diagnostics.runner import Job, execute
    from diagnostics.spec import ModelSpec

    class TripsUnderNoGrad(FlopCounter):
        """While counting, a module's forward under no_grad fails, as torch's module tracking did."""

        def __enter__(self):
            def trip(*_):
                if not torch.is_grad_enabled():
                    raise AssertionError("Expected gradient function to be set")

            self._trip = torch.nn.modules.module.register_module_forward_hook(trip)
            return super().__enter__()

        def __exit__(self, *exc):
            self._trip.remove()
            return super().__exit__(*exc)

    monkeypatch.setattr(summary_job, "FlopCounter", TripsUnderNoGrad)
    # skip_backward: the one counted pass is then a forward under no_grad (a training step's one pass
    # records gradients and never trips), so the counter trips there and in the forward pass that follows
    r = execute(Job("summary", ModelSpec(name="mlp"), {"skip_backward": True}), tmp_path)
    m = r.metrics
    assert m.flops_forward == 2 * 32 * (64 * 128 + 128 * 128 + 128 * 10)  # the mlp sample's three Linears
    assert r.notes[0] == ("forward FLOPs counted with gradients enabled: under no_grad torch's FlopCounterMode "
                             "failed on this model (AssertionError: Expected gradient function to be set)")


# ----------------------------------------------------------------------------- one pass, same figures
def _count_both_ways(model, *inputs, skip_backward=False):
    """(forward calls, counts) of the summary's one pass and of its pass-by-pass way, on one model."""
    from diagnostics.intake import LoadedModel, default_loss

    loaded = LoadedModel(ModelSpec(name="handmade"), model, tuple(InputSpec(tuple(t.shape)) for t in inputs), inputs,
                         default_loss, "mse")
    ctx = AnalysisContext(Job("summary", ModelSpec()), Path("/tmp"))
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    out = []
    try:
        for way in (summary._forward_counts, summary._counts_pass_by_pass):
            calls.clear()
            shapes = {}
            fwd, both, note, bnote = way(ctx, loaded, {"skip_backward": skip_backward}, 1, shapes)
            out.append((len(calls), fwd, both, note, bnote, shapes))
    finally:
        handle.remove()
    return out


@pytest.mark.parametrize("skip_backward", [False, True])
def test_the_summary_counts_in_one_pass_what_it_counted_in_three(skip_backward, no_hooks_left):
    """The forward's counts are read before the loss, the training step's at the end: one forward pass
    instead of three (shapes; forward FLOPs; forward + backward), the same shapes and FLOPs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    (n1, fwd1, both1, *notes1, shapes1), (n3, fwd3, both3, *notes3, shapes3) = _count_both_ways(
        model, torch.randn(2, 3, 8, 8), skip_backward=skip_backward)
    assert (n1, n3) == ((1, 2) if skip_backward else (1, 3))
    assert fwd1 == fwd3 and both1 == both3 and notes1 == notes3 == [None, None] and shapes1 == shapes3
    conv, linear = 2 * 2 * 8 * 6 * 6 * 3 * 3 * 3, 2 * 2 * 8 * 6 * 6 * 4  # 2 x batch x out x positions x in-kernel
    assert fwd1.total == conv + linear and fwd1.by_module["0"] == conv
    assert (both1 is None) if skip_backward else (both1.total - fwd1.total == conv + 2 * linear)  # no grad for the input
    assert shapes1["3"] == [2, 4]
    no_hooks_left(model)


def test_a_model_that_cannot_train_is_counted_pass_by_pass_with_its_note():
    """The training step fails (an integer output has no gradient): the forward's counts and the
    backward's note come as before, from the passes one by one."""

    class Argmax(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x).argmax(-1)

    (n1, fwd1, both1, note1, bnote1, shapes1), (_, fwd3, both3, note3, bnote3, shapes3) = _count_both_ways(
        Argmax(), torch.randn(2, 4))
    assert n1 == 1 + 3  # the failed one pass, then the three
    assert fwd1 == fwd3 and fwd1.total == 2 * 2 * 4 * 3 and both1 is both3 is None
    assert bnote1 == bnote3 and bnote1.startswith("backward not counted: RuntimeError")
    assert shapes1 == shapes3 == {"lin": [2, 3], "(model)": [2]}


# ----------------------------------------------------------------------------- real architectures, uncounted ops
class Logits(nn.Module):
    """A transformers model as users wrap it: token ids in, logits out."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids, use_cache=False).logits


def test_mixtral_expert_flops_are_counted_not_zero(tmp_path):
    """transformers runs Mixtral's experts through aten._grouped_mm, which torch's FlopCounterMode does
    not count: the experts showed 0 FLOPs beside their parameters."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=64)
    model = Logits(transformers.MixtralForCausalLM(cfg))
    assert model.lm.config._experts_implementation == "grouped_mm"
    B, S, H, I = 2, 16, cfg.hidden_size, cfg.intermediate_size
    ids = torch.randint(0, cfg.vocab_size, (B, S))
    r = run_summary(model, ids, tmp_path=tmp_path)
    # every token runs top-k experts: gate_up (H -> 2I) and down (I -> H)
    per_layer = B * S * cfg.num_experts_per_tok * (2 * H * 2 * I + 2 * I * H)
    for i in range(cfg.num_hidden_layers):
        experts = layer(r, f"lm.model.layers.{i}.mlp.experts")
        assert experts.params == cfg.num_local_experts * (H * 2 * I + I * H)
        assert experts.flops_forward == per_layer
        assert experts.flops_not_counted is None
    assert not any("not counted" in n for n in r.notes)
    # The same model with transformers' eager experts (a loop of F.linear per expert: plain matmuls that
    # torch's own formulas count), layer by layer, forward and backward.
    model.lm.set_experts_implementation("eager")
    eager = run_summary(model, ids, tmp_path=tmp_path)
    assert [(l.name, l.flops_forward, l.flops_backward) for l in r.layers] == \
        [(l.name, l.flops_forward, l.flops_backward) for l in eager.layers]
    assert r.metrics.flops_train_step == eager.metrics.flops_train_step > 3 * cfg.num_hidden_layers * per_layer


@torch.library.custom_op("torchscope_test::summary_mystery", mutates_args=())
def summary_mystery(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


summary_mystery.register_autograd(lambda ctx, g: (g @ ctx.w.t(), ctx.x.t() @ g),
                                  setup_context=lambda ctx, inputs, output: setattr(ctx, "x", inputs[0])
                                  or setattr(ctx, "w", inputs[1]))


class Mystery(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return summary_mystery(x, self.w)


def test_a_layer_running_an_op_the_counter_does_not_know_shows_not_counted_not_zero(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), Mystery())
    r = run_summary(model, torch.randn(4, 8), tmp_path=tmp_path)
    odd = layer(r, "1")
    assert odd.params == 64
    assert odd.flops_forward is None and odd.flops_not_counted == "torchscope_test::summary_mystery"
    assert odd.flops_backward == 2 * (2 * 4 * 8 * 8)  # its backward is two plain matmuls: counted
    assert layer(r, "0").flops_forward == 2 * 4 * 8 * 8 and layer(r, "0").flops_not_counted is None
    assert layer(r, "(model)").flops_not_counted == "torchscope_test::summary_mystery"
    assert r.metrics.flops_forward == 2 * 4 * 8 * 8  # the Linear: a lower bound, and the note says so
    note = next(n for n in r.notes if n.startswith("FLOPs not counted for "))
    assert "torchscope_test::summary_mystery (1 call; in 1)" in note and "lower bounds" in note


def test_a_model_whose_only_arithmetic_went_uncounted_has_no_flop_total(tmp_path):
    r = run_summary(Mystery(), torch.randn(4, 8), tmp_path=tmp_path)
    m = r.metrics
    assert m.flops_forward is None  # not 0
    assert m.flops_backward == m.flops_train_step == 2 * (2 * 4 * 8 * 8)  # lower bounds, as the note says
    assert any(n.startswith("FLOPs not counted for torchscope_test::summary_mystery") for n in r.notes)


# --- TorchScript: no hooks, so no per-layer breakdown; the result says why (issue #17 item 7) -----------

class _TSNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.head = nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4), nn.Tanh())

    def forward(self, x):
        return self.head(self.act(self.fc1(x)))


@pytest.mark.parametrize("how", ["trace", "script"])
def test_a_torchscript_file_says_why_its_layers_have_no_shapes_or_flops(how, tmp_path):
    from diagnostics.render.charts.summary import summary_sections
    from diagnostics.runner import execute

    torch.manual_seed(0)
    B, x = 2, torch.randn(2, 8)
    ts = torch.jit.trace(_TSNet().eval(), (x,)) if how == "trace" else torch.jit.script(_TSNet().eval())
    path = tmp_path / "net.pt"
    torch.jit.save(ts, str(path))
    spec = ModelSpec(source="torchscript", name="net.pt", path=str(path), inputs=(InputSpec((B, 8)),))
    r = execute(Job("summary", spec, {}), tmp_path / "out")
    note = r.notes[0]
    assert note.startswith("per-layer shapes and FLOPs not counted: this is a TorchScript model. TorchScript "
                           "modules take no Python forward hooks")
    assert "counted for the whole graph, on the model's row" in note
    # the whole graph's FLOPs, all on the root: 2·B·(8·16 + 16·4)
    assert r.metrics.flops_forward == layer(r, "(model)").flops_forward == 2 * B * (8 * 16 + 16 * 4)
    assert r.output_shape == layer(r, "(model)").output_shape == [B, 4]
    for name, type_, params in [("fc1", "Linear", 8 * 16 + 16), ("head.0", "Linear", 16 * 4 + 4), ("act", "ReLU", 0)]:
        row = layer(r, name)
        assert (row.type, row.params) == (type_, params)
        assert row.output_shape is None and row.flops_forward is None and row.flops_backward is None  # not 0
    # the report's overview carries the note (the CLI prints result.notes, the Model page shows them)
    assert any(note in str(sec.text) for sec in summary_sections(r))


def test_a_torchscript_submodule_gets_a_note_and_its_flops_land_on_its_python_parent(tmp_path):
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.jit.script(_TSNet())
            self.out = nn.Linear(4, 3)

        def forward(self, x):
            return self.out(self.inner(x))

    B = 5
    r = run_summary(Outer(), torch.randn(B, 8), tmp_path=tmp_path)
    assert r.notes[0].startswith("per-layer shapes and FLOPs not counted inside the TorchScript submodule inner.")
    assert layer(r, "out").flops_forward == 2 * B * 4 * 3 and layer(r, "out").output_shape == [B, 3]
    assert layer(r, "inner").flops_forward is None and layer(r, "inner.fc1").flops_forward is None
    assert layer(r, "(model)").flops_forward == r.metrics.flops_forward == 2 * B * (8 * 16 + 16 * 4 + 4 * 3)


class _GradOnlyInTraining(nn.Module):
    """As SpeechT5's feature encoder: its input asks for a gradient only in training mode, so the first
    convolution's input gradient is computed (and its FLOPs spent) only in a training step."""

    def __init__(self, attention: bool):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(1, 8, kernel_size=10, stride=5)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True) if attention else None
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = x[:, None]
        if self.training:
            x = x.detach().requires_grad_(True)
        h = self.conv(x).transpose(1, 2)  # B, L, 8
        if self.attn is not None:
            h = self.attn(h, h, h, need_weights=False)[0]
        return self.head(h).mean(1)


def _torch_step_flops(model, x, training: bool) -> int:
    """torch's own FlopCounterMode over forward + backward of the loss, in the mode asked."""
    from torch.utils.flop_counter import FlopCounterMode

    was = model.training
    model.train(training)
    try:
        with FlopCounterMode(display=False) as fc:
            default_loss(model(x)).backward()
    finally:
        model.train(was)
        model.zero_grad(set_to_none=True)
    return fc.get_total_flops()


@pytest.mark.parametrize("attention", [False, True])  # one counted pass; pass by pass (a fused fast path)
@pytest.mark.parametrize("mode", ["eval", "train"])  # the mode the model comes in
def test_a_training_step_is_counted_in_training_mode(attention, mode, tmp_path, no_hooks_left):
    B, T, C, K, S = 2, 400, 8, 10, 5
    x = torch.randn(B, T)
    model = _GradOnlyInTraining(attention).train(mode == "train")
    m = run_summary(model, x, tmp_path=tmp_path).metrics
    assert model.training == (mode == "train")  # the mode it came in, restored
    L = (T - K) // S + 1
    conv_input_grad = 2 * B * L * C * 1 * K  # d(input) of the conv: one multiply-add per weight and output
    train_flops, eval_flops = _torch_step_flops(model, x, True), _torch_step_flops(model, x, False)
    assert train_flops - eval_flops == conv_input_grad  # what only a training step computes
    if not attention:  # torch's counter and ours agree on convolutions and linears
        assert m.flops_train_step == train_flops  # eval mode gave eval_flops
    assert m.flops_forward + m.flops_backward == m.flops_train_step
    assert m.flops_train_step == profile_train_step_flops(model, x)


def profile_train_step_flops(model, x) -> int:
    """What ``profile --mode train`` counts: its training step (diagnostics.measure.training.Step) under
    the counter, the model in training mode."""
    from diagnostics.measure.roofline import count_ops
    from diagnostics.measure.training import Step

    loaded = LoadedModel(ModelSpec(name="handmade"), model, (InputSpec(tuple(x.shape)),), (x,), default_loss, "mse")
    was = model.training
    model.train()
    try:
        with torch.enable_grad():
            return count_ops(Step(loaded, True, "sgd", 0.01), type(model).__name__)[1].total
    finally:
        model.train(was)


def test_speecht5_forward_and_backward_equal_the_training_steps_count(tmp_path):
    """SpeechT5's feature encoder computes its first convolution's input gradient only in training: the
    summary (eval mode) gave 94,382,080 where profile --mode train gave 95,404,800 on the reported config."""
    pytest.importorskip("transformers")
    from diagnostics.intake import load_model
    from diagnostics.runner import execute
    from tests.real_architectures import python_spec

    spec = python_spec("speecht5", tmp_path)
    m = execute(Job("summary", spec, {}), tmp_path / "out").metrics
    loaded = load_model(spec)
    conv = loaded.model.speecht5.encoder.prenet.feature_encoder.conv_layers[0].conv
    B, T = loaded.inputs.kwargs["input_values"].shape
    L = (T - conv.kernel_size[0]) // conv.stride[0] + 1
    conv_input_grad = 2 * B * L * conv.out_channels * conv.kernel_size[0]  # one input channel
    from diagnostics.measure.roofline import count_ops
    from diagnostics.measure.training import Step

    counts = {}
    for training in (False, True):
        loaded.model.train(training)
        with torch.enable_grad():
            counts[training] = count_ops(Step(loaded, True, "sgd", 0.01), type(loaded.model).__name__)[1].total
    assert counts[True] - counts[False] == conv_input_grad == 204_160
    assert m.flops_forward + m.flops_backward == m.flops_train_step == counts[True]
