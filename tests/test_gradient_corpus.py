"""Gradient health on real architectures nobody here wrote, freshly built from small configs
(tests/real_architectures.py): encoders (BERT, ModernBERT, DeBERTa), decoders (GPT-2, Llama),
encoder-decoders (T5 with its untied N(0, 1) LM head, BART), vision (ViT, SegFormer, Swin), detection
(DETR), speech (SpeechT5, Whisper), mixture of experts (Mixtral) and state space (Mamba): 0 layers flagged
over 3 steps of each one's real loss. Planted sickness in the same models is still flagged: a dead layer
(its output multiplied by 0) and a starving one (its output scaled by 1e-9)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from diagnostics.intake import load_model  # noqa: E402
from diagnostics.measure.gradflow import gradient_flow  # noqa: E402
from diagnostics.runner import Job, execute  # noqa: E402
from tests.real_architectures import HF_CONFIGS, PYTHON_MODELS, spec_of  # noqa: E402

CORPUS = list(HF_CONFIGS) + list(PYTHON_MODELS)


def test_the_corpus_spans_the_families():
    assert len(CORPUS) >= 12
    for family in ("bert", "modernbert", "deberta", "gpt2", "llama", "t5", "bart", "vit", "segformer", "detr",
                   "speecht5", "whisper", "mixtral", "mamba"):
        assert family in CORPUS


@pytest.mark.parametrize("arch", CORPUS)
def test_a_freshly_built_architecture_has_no_layer_flagged(arch, tmp_path):
    r = execute(Job("gradients", spec_of(arch, tmp_path), {"steps": 3}), tmp_path / "out")
    flagged = [(l.layer, l.status, l.reason) for l in r.layers if l.status != "healthy"]
    assert flagged == [] and r.verdict == "healthy"
    assert r.metrics.layers >= 15 and not r.loss_stand_in  # each judged on its own task's loss
    # every layer with weights is judged on its relative gradient, against its own weights
    judged = [l for l in r.layers if l.weight_norm]
    assert judged and all(l.relative_grad == pytest.approx(l.grad_norm_mean / l.weight_norm) for l in judged)
    if arch in HF_CONFIGS:  # built here from a config: at chance level
        assert r.phase == "at initialisation", r.phase_reason
    if arch == "detr":
        layers = {l.layer: l for l in r.layers}
        idle = layers["model.decoder.layers.0.self_attn.q_proj"]
        assert idle.relative_grad < 1e-12 and idle.reason.startswith("idle by construction, not vanishing")
        out = layers["model.decoder.layers.0.self_attn.o_proj"]
        encoder = [l.grad_norm_mean for n, l in layers.items() if n.startswith("model.encoder.layers.")]
        assert out.grad_norm_mean > 100 * max(encoder)  # the outlier that once set the scale


def _planted(arch, tmp_path, module: str, scale: float) -> dict:
    loaded = load_model(spec_of(arch, tmp_path))
    target = loaded.model.get_submodule(module)
    handle = target.register_forward_hook(lambda _m, _i, out: out * scale)
    try:
        r = gradient_flow(loaded, 2)
    finally:
        handle.remove()
    return {l["layer"]: l for l in r["layers"]}


LLAMA_MLP = "model.model.layers.0.mlp."


@pytest.mark.slow  # each model built and watched twice
@pytest.mark.parametrize("arch,module,dead", [
    # Llama's MLP is down(silu(gate(x)) * up(x)): with up's output zeroed, gate's gradient is exactly zero
    # (multiplied by it), down's input is zero (no bias: no gradient at all), and the norm before them feeds
    # nothing else
    ("llama", LLAMA_MLP + "up_proj", {LLAMA_MLP + "up_proj", LLAMA_MLP + "gate_proj", LLAMA_MLP + "down_proj",
                                      "model.model.layers.0.post_attention_layernorm"}),
    # DETR's fc2 reads relu(0) = 0: its weight gets no gradient, its bias does (the gradient reaches it)
    ("detr", "model.encoder.layers.0.mlp.fc1", {"model.encoder.layers.0.mlp.fc1"}),
])
def test_planted_dead_and_starving_layers_are_still_flagged(arch, module, dead, tmp_path):
    layers = _planted(arch, tmp_path, module, 0.0)  # nothing flows back into it
    assert layers[module]["zero_fraction"] == 1.0
    assert {n: l["status"] for n, l in layers.items() if l["status"] != "healthy"} == dict.fromkeys(dead, "dead")
    layers = _planted(arch, tmp_path, module, 1e-9)  # its output, and so its gradient, scaled by 1e-9
    row = layers[module]
    assert row["status"] == "vanishing", row
    assert row["reason"].startswith(f"‖g‖/‖w‖ {row['relative_grad']:.3g} is ")


def test_the_checklist_repeats_the_verdict_over_several_steps(tmp_path):
    """The checklist's gradient_flow finding read one step of the old rule (DETR: 37 layers "vanishing")."""
    from diagnostics.analyses.checklist.facts import GRADIENT_STEPS, gradient_facts
    from diagnostics.analyses.checklist.design_rules import check_gradient_flow

    g = gradient_facts(load_model(spec_of("detr", tmp_path)))
    assert GRADIENT_STEPS >= 3 and g.steps == GRADIENT_STEPS
    from msgspec.structs import replace

    from diagnostics.analyses.checklist.records import MeasuredFacts
    from tests.checklist.sample_facts import healthy

    status, evidence, _, nums = check_gradient_flow(replace(healthy(), measured=MeasuredFacts(gradients=g)))
    assert (status, nums["vanishing"], nums["dead"]) == ("pass", 0, 0), evidence
    assert evidence.startswith(f"all {g.layers} layers healthy")


@pytest.mark.slow  # 15 training steps, then 3 watched
def test_after_training_the_phase_is_named_and_nothing_is_flagged(tmp_path):
    """15 AdamW steps take Llama's loss from chance level (ln 500 = 6.2) to below 5: judged after training, when
    query / key projections lose the allowance of a fresh initialisation (1e-8 -> 1e-6 of the reference)."""
    loaded = load_model(spec_of("llama", tmp_path))
    model = loaded.model.train()
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(15):
        opt.zero_grad()
        loaded.loss_fn(loaded.forward()).backward()
        opt.step()
    r = gradient_flow(loaded, 3)
    assert r["phase"] == "after training" and r["metrics"]["loss_first"] < 5, r["phase_reason"]
    assert r["phase_reason"].endswith("is below chance level (ln 500 = 6.21): the model has learned")
    assert [(l["layer"], l["reason"]) for l in r["layers"] if l["status"] != "healthy"] == []
    q = next(l for l in r["layers"] if l["layer"] == "model.model.layers.0.self_attn.q_proj")
    assert q["rule"].startswith("‖g‖/‖w‖ < 1e-06 × the model's reference")
