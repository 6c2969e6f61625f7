"""Real architectures nobody here wrote, built from small transformers configs (nothing downloaded):
a hierarchical vision transformer (Swin), relative-position attention encoders (DeBERTa, DeBERTa-v2
with separate position projections), a tied-embedding LM (GPT-2) and a speech encoder with a
weight-norm parametrized positional convolution (HuBERT, as a Python-file model).

Invariants checked on every one, against computations independent of diagnostics.measure:
parameters counted once per storage; the model's forward FLOPs equal torch's own FlopCounterMode;
per-layer FLOPs only where a layer computes (a layer with no forward FLOPs has no backward FLOPs, and
backward is at most 2.5 x the forward: the input and the weight gradient of every matmul and
convolution, plus a fused attention's recomputed scores); gradient
flow on a fresh init is healthy.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")

from diagnostics.hf import HFSettings  # noqa: E402
from diagnostics.intake import load_model  # noqa: E402
from diagnostics.runner import Job, execute  # noqa: E402
from diagnostics.spec import ModelSpec  # noqa: E402

CONFIGS = {
    # hierarchical: two stages of two blocks, window attention with a relative-position bias, patch merging
    "swin": {"model_type": "swin", "image_size": 32, "patch_size": 2, "embed_dim": 16, "depths": [2, 2],
             "num_heads": [2, 4], "window_size": 4, "num_labels": 10},
    # DeBERTa's disentangled attention: content-to-position and position-to-content logits
    "deberta": {"model_type": "deberta", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 128, "vocab_size": 1000, "relative_attention": True,
                "pos_att_type": ["p2c", "c2p"], "max_relative_positions": 64},
    # DeBERTa-v2 with its own position key / query projections (share_att_key=False)
    "deberta-v2": {"model_type": "deberta-v2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "intermediate_size": 128, "vocab_size": 1000, "relative_attention": True,
                   "pos_att_type": ["p2c", "c2p"], "share_att_key": False},
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 200, "n_positions": 64},
}

HUBERT = """
    import torch
    import transformers

    def build_model():
        torch.manual_seed(0)
        cfg = transformers.HubertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                        conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                        num_conv_pos_embedding_groups=4)
        return transformers.HubertModel(cfg)

    def example_inputs():
        return (torch.randn(2, 800, generator=torch.Generator().manual_seed(0)),)
"""


def spec_of(arch: str, tmp_path) -> ModelSpec:
    if arch == "hubert":
        path = tmp_path / "hubert.py"
        path.write_text(textwrap.dedent(HUBERT))
        return ModelSpec(source="python", name="hubert.py", path=str(path))
    # DeBERTa's share_att_key / position_buckets are read by the model but not in its config's defaults
    return ModelSpec(source="hf", name=arch, hf=HFSettings(CONFIGS[arch], None, 32, strict=False).to_json())


def storage_numel(model) -> int:
    """Parameters counted once per storage (tied weights once), independently of diagnostics.measure."""
    seen = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[(p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape))] = p.numel()
    return sum(seen.values())


def torch_forward_flops(loaded) -> int:
    """torch's own FlopCounterMode, the math attention backend, grad enabled (under no_grad torch's module
    tracker breaks on DeBERTa's position projections: "Expected gradient function to be set")."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    loaded.model.eval()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        loaded.forward()
    return fc.get_total_flops()


ARCHS = ["swin", "deberta", "deberta-v2", "gpt2", "hubert"]


@pytest.mark.parametrize("arch", ARCHS)
def test_parameters_once_per_storage_and_flops_only_where_layers_compute(arch, tmp_path):
    spec = spec_of(arch, tmp_path)
    r = execute(Job("summary", spec, {}), tmp_path / "out")
    loaded = load_model(spec)
    m = r.metrics
    assert m.params_total == storage_numel(loaded.model)
    assert not any("not counted" in n for n in r.notes), r.notes
    assert m.flops_forward == torch_forward_flops(loaded) > 0
    assert m.flops_backward > 0
    for row in r.layers:
        fwd, bwd = row.flops_forward, row.flops_backward
        assert fwd is not None and bwd is not None, row.name
        # a layer computes backward only where it computed forward: each matmul's and convolution's input
        # and weight gradient (2x), a fused attention also recomputes its scores (2.5x)
        assert bwd <= 2.5 * fwd, (row.name, row.type, fwd, bwd)
        if row.type in ("Dropout", "StableDropout", "Identity") or row.type.endswith("LayerNorm"):
            assert fwd == bwd == 0, (row.name, fwd, bwd)


@pytest.mark.parametrize("arch", ["swin", "deberta", "deberta-v2"])
def test_fresh_init_gradient_flow_is_healthy(arch, tmp_path):
    """Swin's first-stage query / key projections and relative-position biases sat under 1e-5 x its
    patch embedding (a small-init convolution behind a LayerNorm: its gradient is scaled up); DeBERTa's
    position projections and relative-position embeddings under 1e-3 x its word embeddings. Each is
    judged against its own neighbourhood (its attention; the encoder for the shared embeddings)."""
    r = execute(Job("gradients", spec_of(arch, tmp_path), {"steps": 1}), tmp_path / "out")
    flagged = [(l.layer, l.reason) for l in r.layers if l.status != "healthy"]
    assert flagged == [] and r.verdict == "healthy"
    layers = {l.layer: l for l in r.layers}
    if arch == "deberta-v2":
        pos = layers["model.deberta.encoder.layer.0.attention.self.pos_key_proj"]
        assert pos.kind == "query/key projection"
        assert pos.neighbourhood == "model.deberta.encoder.layer.0.attention.self"
        assert layers["model.deberta.encoder.rel_embeddings"].kind == "relative-position bias"
        assert layers["model.deberta.encoder.rel_embeddings"].neighbourhood == "model.deberta.encoder"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["swin", "gpt2"])
def test_exported_programs_get_a_stand_in_loss_that_gives_real_gradients(arch, tmp_path):
    """An exported program declares no loss. The old stand-in (the output's mean square) is nearly
    constant behind a final LayerNorm, so Swin's norms looked vanishing; GPT-2's embedding looked dead:
    export gives its tied weight back as two Parameter objects over one storage and the graph reads the
    embedding through the head's, so the embedding's own object never got a gradient."""
    loaded = load_model(spec_of(arch, tmp_path))
    model = loaded.model.eval()
    path = tmp_path / f"{arch}.pt2"
    torch.export.save(torch.export.export(model, tuple(loaded.inputs.args)), str(path))
    r = execute(Job("gradients", ModelSpec(source="export", name=path.name, path=str(path)), {"steps": 1}),
                tmp_path / "out")
    assert r.loss_stand_in and r.loss.startswith("stand-in: the output projected on a fixed random direction")
    flagged = [(l.layer, l.reason) for l in r.layers if l.status != "healthy"]
    assert flagged == [] and r.verdict == "healthy"
    if arch == "gpt2":
        layers = {l.layer: l for l in r.layers}
        assert "model.lm_head" not in layers  # its weight is the embedding's: one layer
        assert layers["model.transformer.wte"].zero_fraction < 0.5
