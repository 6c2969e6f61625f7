"""Gradient-flow statistics against param.grad after a manual backward; sick samples caught."""

import copy
import json
import math

import pytest
import torch
from torch import nn

from diagnostics.analyses.gradients import job as gradients
from diagnostics.measure import gradflow, gradient_health
from diagnostics.errors import TorchScopeError
from diagnostics.intake import LoadedModel, default_loss, load_model
from diagnostics.analyses.gradients import ANALYSIS as GRADIENTS
from diagnostics.results import decode, to_json, to_plain
from diagnostics.runner import AnalysisContext, Job
from diagnostics.spec import InputSpec, ModelSpec
from sample_models import SAMPLES


def run(model, inputs, tmp_path, loss_fn=default_loss, **options):
    ctx = AnalysisContext(Job("gradients", ModelSpec(), options), tmp_path)
    ctx._loaded = LoadedModel(ModelSpec(name="handmade"), model, tuple(InputSpec(tuple(t.shape)) for t in inputs),
                              tuple(inputs), loss_fn, "mse")
    return gradients.analyze(ctx, options)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.fc1 = nn.Linear(6, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_statistics_match_a_manual_backward(tmp_path, no_hooks_left):
    model, x = Net(), torch.randn(10, 6, generator=torch.Generator().manual_seed(3))
    ref = copy.deepcopy(model)
    default_loss(ref(x)).backward()
    lr = 0.05
    r = run(model, (x,), tmp_path, steps=1, optimizer="sgd", lr=lr)
    assert decode(GRADIENTS, json.loads(to_json(r))) == r  # typed, and back through its JSON
    layers = {l.layer: l for l in r.layers}
    assert [l.layer for l in r.layers] == ["fc1", "fc2"]  # forward order
    for name in ("fc1", "fc2"):
        mod = getattr(ref, name)
        grads = [mod.weight.grad, mod.bias.grad]
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
        flat = torch.cat([g.flatten() for g in grads])
        w = math.sqrt(sum(float(p.detach().pow(2).sum()) for p in (mod.weight, mod.bias)))
        l = layers[name]
        assert l.grad_norm_mean == pytest.approx(norm, rel=1e-6)
        assert l.grad_abs_mean == pytest.approx(float(flat.abs().mean()), rel=1e-6)
        assert l.grad_abs_max == pytest.approx(float(flat.abs().max()), rel=1e-6)
        assert l.zero_fraction == pytest.approx(float((flat == 0).float().mean()))
        # first SGD step with momentum: the buffer is the gradient, so the update is lr * g
        assert l.update_ratio_max == pytest.approx(lr * norm / w, rel=1e-5)
        assert l.nan_count == l.inf_count == 0
        assert l.status == "healthy"
    total = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in ref.parameters()))
    assert r.metrics.global_norm_first == pytest.approx(total, rel=1e-6)
    assert r.metrics.layers == 2 and r.metrics.layers_healthy == 2
    # per-step rows: one per layer per step
    assert [(s.step, s.layer) for s in r.steps] == [(1, "fc1"), (1, "fc2")]
    # ReLU dead units: units never positive over the batch
    h = ref.act(ref.fc1(x))
    dead = float(1 - (h > 0).any(dim=0).float().mean())
    assert r.activations[0].module == "act"
    assert r.activations[0].dead_fraction == pytest.approx(dead)
    # scoped: no hooks left, weights and mode restored
    no_hooks_left(model)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    assert model.training and all(p.grad is None for p in model.parameters())


def test_several_steps_and_adamw(tmp_path):
    model, x = Net(), torch.randn(10, 6)
    r = run(model, (x,), tmp_path, steps=3, optimizer="adamw", lr=1e-3)
    assert [g.step for g in r.global_norms] == [1, 2, 3]
    assert len(r.steps) == 6
    # AdamW's first step moves every weight by lr (m / sqrt(v) = sign(g)), plus a weight decay of
    # lr * 0.01 * w: the update ratio of fc2 (68 weights) is about lr * sqrt(68) / ||w||
    w = math.sqrt(sum(float(p.detach().pow(2).sum()) for p in Net().fc2.parameters()))
    first = next(s for s in r.steps if s.step == 1 and s.layer == "fc2")
    assert first.update_ratio == pytest.approx(1e-3 * math.sqrt(68) / w, rel=0.02)
    assert r.metrics.loss_first is not None and r.metrics.steps == 3


def test_dead_layer_and_dead_relu(tmp_path):
    model = Net()
    with torch.no_grad():
        model.fc1.bias.fill_(-100.0)  # every ReLU input negative: no gradient reaches fc1
    r = run(model, (torch.randn(8, 6),), tmp_path, steps=1)
    layers = {l.layer: l for l in r.layers}
    assert layers["fc1"].status == "dead" and layers["fc1"].zero_fraction == 1.0
    assert r.activations[0].dead_fraction == 1.0 and r.activations[0].flagged
    assert r.metrics.layers_dead == 1 and r.metrics.dead_relu_fraction_max == 1.0


class BigVocab(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50_000, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def test_a_large_vocabulary_embedding_is_not_dead_but_an_unreached_one_is(tmp_path):
    ids = torch.randint(0, 50_000, (8, 32))
    r = run(BigVocab(), (ids,), tmp_path / "a", steps=1)
    emb = next(l for l in r.layers if l.layer == "emb")
    assert emb.zero_fraction > 0.99  # 256 of 50,000 rows looked up
    assert emb.status == "healthy", emb.reason
    model = BigVocab()
    model.fc.weight.requires_grad_(False)
    with torch.no_grad():
        model.fc.weight.zero_()  # nothing flows back into the embedding
    r = run(model, (ids,), tmp_path / "b", steps=1)
    emb = next(l for l in r.layers if l.layer == "emb")
    assert (emb.status, emb.reason) == ("dead", "no row of this embedding got a gradient")


def test_relu_units_need_enough_values_to_be_called_dead(tmp_path):
    """At batch 1 about half of an MLP's units are zero by chance; a conv map's channel has many
    positions per sample, so it is judged even at batch 1."""
    r = run(Net(), (torch.randn(1, 6),), tmp_path / "a", steps=1)
    act = r.activations[0]
    assert act.dead_fraction is None and not act.flagged
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 2))
    r = run(conv, (torch.randn(1, 3, 8, 8),), tmp_path / "b", steps=1)
    assert r.activations[0].dead_fraction is not None
    assert gradflow.relu_units_alive(torch.tensor([[float("nan")] * 4] * 16)) is None  # NaN: not judged


class Saturated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.sig = nn.Sigmoid()
        self.tanh = nn.Tanh()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.sig(100 * self.fc(x)) + self.tanh(0.001 * x))


def test_saturation(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    model = Saturated()
    r = run(model, (x,), tmp_path, steps=1)
    acts = {a.module: a for a in r.activations}
    z = 100 * model.fc(x)
    y = torch.sigmoid(z)
    expected = float(((y < gradient_health.SATURATION_EPS) | (y > 1 - gradient_health.SATURATION_EPS)).float().mean())
    assert acts["sig"].saturated_fraction == pytest.approx(expected) and expected > 0.5
    assert acts["tanh"].saturated_fraction == 0.0


class NaNAfter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * torch.tensor(float("nan"))


def test_non_finite_gradients_are_counted_and_json_safe(tmp_path):
    r = run(NaNAfter(), (torch.randn(3, 4),), tmp_path, steps=1)
    l = r.layers[0]
    assert l.status == "non-finite" and l.nan_count == 20
    assert r.metrics.layers_nonfinite == 1
    assert r.metrics.loss_first is None  # NaN becomes None: the result stays valid JSON
    json.dumps(to_plain(r), allow_nan=False)


@pytest.mark.parametrize("name", list(SAMPLES))
def test_samples_sick_caught_healthy_not_flagged(name, tmp_path, no_hooks_left):
    loaded = load_model(ModelSpec(name=name))
    ctx = AnalysisContext(Job("gradients", ModelSpec(name=name), {}), tmp_path)
    ctx._loaded = loaded
    r = gradients.analyze(ctx, {"steps": 2})
    m = r.metrics
    sick = SAMPLES[name].sick
    if sick == "vanishing gradients":
        assert m.layers_vanishing >= 10 and m.layers_exploding == 0
        assert r.layers[0].status == "vanishing"  # the first layers starve
    elif sick == "exploding gradients":
        assert m.layers_exploding == m.layers
        assert m.global_norm_first > gradient_health.EXPLODING_NORM
    else:
        assert m.layers_flagged == 0, [(l.layer, l.status, l.reason) for l in r.layers
                                          if l.status != "healthy"]
        assert r.verdict == "healthy"
    no_hooks_left(loaded.model)
    json.dumps(to_plain(r), allow_nan=False)


def test_options_are_checked(tmp_path):
    with pytest.raises(TorchScopeError, match=r"option steps: must be an integer from 1 to 1000, got 0"):
        run(Net(), (torch.randn(2, 6),), tmp_path, steps=0)
    with pytest.raises(TorchScopeError, match=r"option optimizer: must be one of sgd, adamw, got 'rmsprop'"):
        run(Net(), (torch.randn(2, 6),), tmp_path, optimizer="rmsprop")
    with pytest.raises(TorchScopeError, match=r"option lr: must be a number > 0, got -1"):
        run(Net(), (torch.randn(2, 6),), tmp_path, lr=-1)


def test_layer_order_places_functionally_called_layers_after_their_parent():
    called = ["(model)", "enc", "enc.attn", "enc.ff", "head"]
    layers = ["enc.attn", "enc.attn.out_proj", "enc.ff", "head", "unused"]
    assert gradflow.layer_order(called, layers) == ["enc.attn", "enc.attn.out_proj", "enc.ff", "head", "unused"]


def test_a_stand_in_loss_is_named_and_makes_the_verdict_low_confidence(tmp_path):
    """No declared loss: the output projected on a fixed random direction stands in, and the result says so."""
    import textwrap

    from diagnostics.runner import Job, execute
    from diagnostics.spec import ModelSpec

    path = tmp_path / "noloss.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def build_model():
            return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.LayerNorm(8))

        def example_inputs():
            return (torch.randn(16, 8),)
    """))
    r = execute(Job("gradients", ModelSpec(source="python", name="noloss.py", path=str(path)), {"steps": 2}),
                tmp_path / "out")
    assert r.loss_stand_in is True and r.confidence == "low"
    assert r.loss == ("stand-in: the output projected on a fixed random direction (seed 0), averaged over the "
                         "batch (no loss declared)")
    assert r.notes[0].startswith(f"the loss is a stand-in ({r.loss})")
    declared = execute(Job("gradients", ModelSpec(name="mlp"), {"steps": 2}), tmp_path / "out2")
    assert declared.loss_stand_in is False and declared.confidence == "normal" and declared.notes == ()


def test_the_stand_in_loss_is_a_fixed_random_projection_of_the_output():
    """Independent: mean(output * u) with u ~ N(0, 1) from a generator seeded 0, one sample's shape; the
    same u whatever the batch size (micro-batches average to the batch's value)."""
    out = torch.randn(6, 3, 5)
    u = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(default_loss(out), (out * u).mean())
    assert torch.allclose(default_loss((out, "labels")), default_loss(out))
    assert torch.allclose((default_loss(out[:3]) + default_loss(out[3:])) / 2, default_loss(out))
    # behind a final normalisation the old stand-in, the mean square, is constant: no gradient reaches the layers
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    nn.functional.layer_norm(x, (8,)).pow(2).mean().backward()
    old = x.grad.abs().max()  # the norm's eps and rounding only
    x.grad = None
    default_loss(nn.functional.layer_norm(x, (8,))).backward()
    assert old < 1e-3 * x.grad.abs().max()


def test_a_healthy_nn_transformer_without_a_loss_is_healthy(tmp_path):
    """torch's nn.Transformer ends in LayerNorms: with the mean square standing in, every layer but the
    last norm looked vanishing (31 of 32 here); a random projection of the output gives real gradients."""
    import textwrap

    from diagnostics.runner import Job, execute
    from diagnostics.spec import ModelSpec

    path = tmp_path / "tf.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def build_model():
            return nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                  dim_feedforward=64, dropout=0.0, batch_first=True)

        def example_inputs():
            g = torch.Generator().manual_seed(0)
            return (torch.randn(4, 10, 32, generator=g), torch.randn(4, 8, 32, generator=g))
    """))
    r = execute(Job("gradients", ModelSpec(source="python", name="tf.py", path=str(path)), {"steps": 2}), tmp_path / "o")
    assert r.metrics.layers == 32 and r.loss_stand_in
    assert [(l.layer, l.reason) for l in r.layers if l.status != "healthy"] == []


def _row(name, g, w, kind="layer", **kw):
    return {"layer": name, "type": "Linear", "kind": kind, "grad_norm_mean": g, "grad_norm_max": g,
            "weight_norm": w, "gate_scale": None, "nan_count": 0, "inf_count": 0, "zero_fraction": 0.0, **kw}


def test_one_outlier_does_not_set_the_scale():
    """DETR's first decoder layer attends over all-zero queries: its output projection's gradient was
    ~1000x the encoder's, and the whole encoder fell under 1e-3 x it. The reference is the 90th percentile
    of the plain layers' relative gradients, so one outlier moves nothing."""
    rows = [_row(f"encoder.layers.{i}.fc", 0.05 + 0.01 * i, 1.0) for i in range(12)]
    rows.append(_row("decoder.layers.0.o_proj", 455.0, 1.0))
    ref = gradient_health.judge_layers(rows)
    assert ref == pytest.approx(0.16)  # the 2nd largest of 13 (int(0.1 x 13) = 1 above it), not 455
    assert [r["status"] for r in rows] == ["healthy"] * 13
    # a layer 1e-4.3 below the reference is vanishing, and says so with its numbers
    rows.append(_row("encoder.layers.12.fc", 0.16 * 5e-5, 1.0))
    gradient_health.judge_layers(rows)
    assert rows[-1]["status"] == "vanishing"
    assert rows[-1]["reason"] == ("‖g‖/‖w‖ 8e-06 is 5e-05 × the model's reference 0.16 (its layers' 90% "
                                  "percentile); < 0.0001")
    # judged relative to its own weights: the same gradient on weights 1e4 x smaller is healthy
    rows[-1] = _row("encoder.layers.12.fc", 0.16 * 5e-5, 1e-4)
    gradient_health.judge_layers(rows)
    assert rows[-1]["status"] == "healthy" and rows[-1]["relative_grad"] == pytest.approx(0.08)


def test_peers_at_other_depths_and_kinds_small_by_design():
    qk = [_row(f"enc.layer.{i}.attn.query", 1e-5, 1.0, kind="query/key projection") for i in range(4)]
    plain = [_row(f"enc.layer.{i}.attn.value", 1e-1, 1.0) for i in range(4)]
    rows = qk + plain
    gradient_health.judge_layers(rows)
    # 1e-4 x the reference: vanishing for a plain layer, within a query/key projection's allowance (1e-8)
    assert all(r["status"] == "healthy" for r in rows)
    assert qk[0]["peer_role"] == "enc.layer.*.attn.query" and qk[0]["peer_median"] == pytest.approx(1e-5)
    # one query starving among its peers (1e-4 x their median) is caught by the peer rule
    qk[0]["grad_norm_mean"] = qk[0]["grad_norm_max"] = 1e-9
    gradient_health.judge_layers(rows)
    assert qk[0]["status"] == "vanishing"
    assert qk[0]["reason"] == ("‖g‖/‖w‖ 1e-09 is 0.0001 × the median of its 3 peers enc.layer.*.attn.query (1e-05); "
                               "< 0.001")
    # after training a query/key projection is held to 1e-6 of the reference, at initialisation to 1e-8
    low = [_row(f"enc.layer.{i}.attn.query", 1e-8, 1.0, kind="query/key projection") for i in range(4)] + \
        [_row(f"enc.layer.{i}.attn.value", 1e-1, 1.0) for i in range(4)]
    gradient_health.judge_layers(low, gradient_health.PHASE_INIT)
    assert low[0]["status"] == "healthy"
    gradient_health.judge_layers(low, gradient_health.PHASE_TRAINED)
    assert low[0]["status"] == "vanishing" and low[0]["reason"].endswith(
        "< 1e-06, the allowance of a query/key projection after training")
    # a norm keeps its allowance after training (its weight is all ones by construction)
    assert gradient_health.kind_ratio("normalisation", gradient_health.PHASE_TRAINED) == 1e-8


def test_the_phase_comes_from_the_loss_against_chance_level():
    assert gradient_health.phase_of(6.2, 500)[0] == gradient_health.PHASE_INIT  # ln 500 = 6.21
    phase, why = gradient_health.phase_of(2.0, 500)
    assert phase == gradient_health.PHASE_TRAINED and why == ("the first loss 2 is below chance level (ln 500 = 6.21): "
                                                              "the model has learned")
    assert gradient_health.phase_of(None, None, random_init=True)[0] == gradient_health.PHASE_INIT
    assert gradient_health.phase_of(0.3, None)[0] == gradient_health.PHASE_UNKNOWN


def test_an_attention_over_identical_values_leaves_its_queries_idle_not_vanishing():
    """DETR's first decoder layer: its queries are all zero, so its values are identical and the attention's
    output does not depend on its scores: its query / key projections get no gradient (1e-15), ever."""
    names = [f"dec.layers.{i}.self_attn.{p}" for i in range(3) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    rows = [_row(n, 1e-1, 1.0, kind="query/key projection" if n[-6] in "qk" else "layer") for n in names]
    rows[0]["grad_norm_mean"] = rows[0]["grad_norm_max"] = 4.6e-15
    gradient_health.judge_layers(rows)
    assert rows[0]["status"] == "healthy" and rows[0]["reason"].startswith(
        "idle by construction, not vanishing: ‖g‖/‖w‖ 4.6e-15 is no gradient in float32 (< 1e-12) while its "
        "attention learns (dec.layers.0.self_attn.")
    # a plain layer without gradient is vanishing all the same
    rows[2]["grad_norm_mean"] = rows[2]["grad_norm_max"] = 4.6e-15
    gradient_health.judge_layers(rows)
    assert rows[2]["status"] == "vanishing"


def test_weights_without_gradient_behind_a_zero_input_are_idle_not_dead():
    """DETR's first decoder layer's value projection reads all-zero queries: its weight's gradient is zero,
    its bias's is not (the gradient reaches it). A layer with no gradient at all is dead."""
    row = _row("dec.layers.0.self_attn.v_proj", 1.0, 1.0, zero_fraction=0.996, reached=True)
    status, reason = gradient_health.classify({**row, "signal": 1.0}, 1.0)
    assert status == "healthy" and reason.startswith("idle weights by construction, not dead: 99.6% of its gradient")
    assert gradient_health.classify({**row, "signal": 1.0, "reached": False}, 1.0) == (
        "dead", "99.6% of gradient entries are exactly zero")


# --- layer kinds small at initialisation by design (issue #17 item 3) ------------------------------

def _hf_run(model, inputs, loss_fn, tmp_path, steps=2):
    ctx = AnalysisContext(Job("gradients", ModelSpec(), {}), tmp_path)
    ctx._loaded = LoadedModel(ModelSpec(name="hf"), model, tuple(InputSpec(tuple(t.shape), "int64"
                                                                            if not t.is_floating_point() else "float32")
                                                                 for t in inputs), tuple(inputs), loss_fn, "cross-entropy")
    return gradients.analyze(ctx, {"steps": steps})


def _bert(head):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                  intermediate_size=512)
    torch.manual_seed(0)
    return (transformers.BertForMaskedLM if head == "mlm" else transformers.BertForSequenceClassification)(cfg)


@pytest.mark.parametrize("head", ["mlm", "cls"])
def test_bert_with_hf_init_is_not_flagged_vanishing(head, tmp_path):
    """BERT's query / key gradients sit at ~4e-4 x the largest layer with HF's init (the softmax is
    nearly uniform): healthy by their own kind's rule, which the row names."""
    model = _bert(head)
    ids = torch.randint(0, 1000, (8, 32), generator=torch.Generator().manual_seed(1))
    labels = ids.clone() if head == "mlm" else torch.randint(0, 2, (8,), generator=torch.Generator().manual_seed(2))
    r = _hf_run(model, (ids,), lambda o: nn.functional.cross_entropy(
        o.logits.reshape(-1, o.logits.shape[-1]), labels.reshape(-1)), tmp_path)
    flagged = [(l.layer, l.reason) for l in r.layers if l.status != "healthy"]
    assert flagged == [] and r.verdict == "healthy"
    layers = {l.layer: l for l in r.layers}
    q = layers["bert.encoder.layer.0.attention.self.query"]
    # the first rule (< 1e-3 x the largest layer) flagged it: the kind's allowance is what keeps it healthy
    assert q.grad_norm_relative < 1e-3
    assert q.kind == gradient_health.KIND_QK == "query/key projection"
    assert q.rule == ("‖g‖/‖w‖ < 1e-08 × the model's reference (its layers' 90% percentile), or < 0.001 × its "
                      "peers' median (the same layer at >= 3 other depths)")
    assert q.relative_grad == pytest.approx(q.grad_norm_mean / q.weight_norm)
    assert q.peer_role == "bert.encoder.layer.*.attention.self.query"
    assert r.phase == "at initialisation"  # built here: its weights are drawn at random
    assert q.neighbourhood == "bert.encoder.layer.0.attention.self"  # query, key and value
    assert q.neighbourhood_norm == layers["bert.encoder.layer.0.attention.self.value"].grad_norm_mean
    assert layers["bert.encoder.layer.0.attention.self.value"].kind == "layer"
    assert layers["bert.encoder.layer.0.attention.self.value"].rule.startswith("‖g‖/‖w‖ < 0.0001 × the model's")
    assert layers["bert.embeddings.LayerNorm"].kind == "normalisation"
    assert layers["bert.embeddings.word_embeddings"].kind == "embedding"


def test_one_starving_query_among_its_peers_is_still_flagged(tmp_path):
    """Keys of layer 0 scaled by 3e-4: its query gradient (dQ = dS·K) drops ~3e-4 x its peers' and
    ~6e-6 x its neighbourhood's largest (its value projection), under the query/key rule's 1e-5. (At 1e-2
    it sits 2e-4 x its value projection: where a healthy Swin's first-stage queries sit, not flagged.)"""
    model = _bert("mlm")
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.self.key.weight.mul_(3e-4)
        model.bert.encoder.layer[0].attention.self.key.bias.zero_()
    ids = torch.randint(0, 1000, (8, 32), generator=torch.Generator().manual_seed(1))
    r = _hf_run(model, (ids,), lambda o: nn.functional.cross_entropy(o.logits.reshape(-1, 1000), ids.reshape(-1)),
                tmp_path, steps=1)
    layers = {l.layer: l for l in r.layers}
    q0 = layers["bert.encoder.layer.0.attention.self.query"]
    value = layers["bert.encoder.layer.0.attention.self.value"].grad_norm_mean
    assert q0.status == "vanishing" and q0.grad_norm_mean < 1e-5 * value
    # its peers: the queries of layers 1-3, their median independent of it
    peers = sorted(layers[f"bert.encoder.layer.{i}.attention.self.query"].relative_grad for i in (1, 2, 3))
    assert q0.peer_median == pytest.approx(peers[1])
    assert q0.reason == (f"‖g‖/‖w‖ {q0.relative_grad:.3g} is {q0.relative_grad / peers[1]:.2g} × the median of its 3 "
                         f"peers bert.encoder.layer.*.attention.self.query ({peers[1]:.3g}); < 0.001")
    assert layers["bert.encoder.layer.1.attention.self.query"].status == "healthy"


def test_layer_scale_gated_blocks_and_ssm_time_steps_are_judged_by_their_own_rules(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    convnext = transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
        hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], num_labels=10))  # layer scale γ = 1e-6
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    r = _hf_run(convnext, (x,), lambda o: nn.functional.cross_entropy(o.logits, y), tmp_path / "c")
    layers = {l.layer: l for l in r.layers}
    dw = layers["convnext.encoder.stages.0.layers.0.dwconv"]
    assert dw.grad_norm_mean < gradient_health.VANISHING_NORM  # every gradient behind γ = 1e-6 is tiny
    assert dw.gate_scale == pytest.approx(1e-6) and dw.status == "healthy"
    assert dw.rule.endswith("judged on ‖g‖/‖w‖ / layer scale mean |γ| 1e-06")
    assert layers["convnext.encoder.stages.0.layers.0"].kind == "layer scale"
    assert r.verdict == "healthy", [(l.layer, l.reason) for l in r.layers if l.status != "healthy"]

    torch.manual_seed(0)
    mamba = transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=500, hidden_size=64,
                                                                   num_hidden_layers=2, state_size=8))
    ids = torch.randint(0, 500, (2, 16))
    r = _hf_run(mamba, (ids,), lambda o: nn.functional.cross_entropy(o.logits.reshape(-1, 500), ids.reshape(-1)),
                tmp_path / "m")
    dt = next(l for l in r.layers if l.layer == "backbone.layers.0.mixer.dt_proj")
    assert dt.kind == "state-space time step" and dt.status == "healthy"
    assert r.verdict == "healthy", [(l.layer, l.reason) for l in r.layers if l.status != "healthy"]


def test_deep_sigmoid_mlp_is_still_flagged_under_the_plain_rule(tmp_path):
    loaded = load_model(ModelSpec(name="deep_sigmoid_mlp"))
    ctx = AnalysisContext(Job("gradients", ModelSpec(name="deep_sigmoid_mlp"), {}), tmp_path)
    ctx._loaded = loaded
    r = gradients.analyze(ctx, {"steps": 2})
    first = r.layers[0]
    assert first.kind == "layer" and first.status == "vanishing"
    assert first.grad_norm_relative < gradient_health.VANISHING_RATIO
    assert first.rule.startswith("‖g‖/‖w‖ < 0.0001 × the model's reference") and first.neighbourhood == "body"
    assert r.phase == "at initialisation"  # a sample is built with random weights
    # the first 14 of its 20 hidden layers, each judged against the reference, which the head does not set alone
    assert [l.status for l in r.layers[:14]] == ["vanishing"] * 14 and r.layers[-1].status == "healthy"


@pytest.mark.parametrize("name,type_,params,kind", [
    ("enc.layer.3.attention.self.query", "Linear", ["weight", "bias"], "query/key projection"),
    ("model.layers.0.self_attn.k_proj", "Linear", ["weight"], "query/key projection"),
    ("model.layers.0.self_attn.v_proj", "Linear", ["weight"], "layer"),
    ("h.0.attn.c_attn", "Conv1D", ["weight", "bias"], "layer"),  # fused q/k/v: v keeps it large
    ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias", "Embedding", ["weight"], "relative-position bias"),
    ("layers.0.attn", "WindowAttention", ["relative_position_bias_table"], "relative-position bias"),
    ("blocks.0.ls1", "LayerScale", ["gamma"], "layer scale"),
    ("blocks.0.norm1", "LayerNorm", ["weight", "bias"], "normalisation"),
    ("old.ln", "TFLayerNorm", ["gamma", "beta"], "normalisation"),
    # an exported program's modules lose their class: the name says it
    ("swin.encoder.layers.0.blocks.1.layernorm_after", "InterpreterModule", ["weight", "bias"], "normalisation"),
    ("transformer.h.0.ln_1", "InterpreterModule", ["weight", "bias"], "normalisation"),
    ("transformer.ln_f", "InterpreterModule", ["weight", "bias"], "normalisation"),
    ("model.layers.0.input_layernorm", "LlamaRMSNorm", ["weight"], "normalisation"),
    ("backbone.layers.0.mixer.dt_proj", "Linear", ["weight", "bias"], "state-space time step"),
    ("fc1", "Linear", ["weight", "bias"], "layer"),
])
def test_layer_kinds(name, type_, params, kind):
    assert gradient_health.layer_kind(name, type_, params) == kind


def test_without_weight_norms_the_gradient_norms_are_judged_the_same_way():
    """An attached run sees the script's gradients, not its weights: the rule reads gradient norms."""
    rows = [_row(f"blocks.{i}.fc", 0.1, None) for i in range(10)] + [_row("blocks.10.fc", 2e-6, None),
                                                                      _row("blocks.11.fc", 5e-8, None)]
    ref = gradient_health.judge_layers(rows)
    assert ref == pytest.approx(0.1) and all(r["relative_grad"] is None for r in rows)
    assert [r["status"] for r in rows[-2:]] == ["vanishing", "vanishing"]
    assert rows[-2]["reason"] == ("gradient norm 2e-06 is 2e-05 × the model's reference 0.1 (its layers' 90% "
                                  "percentile); < 0.0001")
    assert rows[-1]["reason"] == "gradient norm 5e-08 < 1e-07"
    assert rows[0]["rule"].startswith("gradient norm < 0.0001 × the model's reference")
