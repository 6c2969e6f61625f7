"""Exact figures where a closed form exists.

* Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), section
  4.1: a transformer layer in 16-bit without flash attention keeps s*b*h*(34 + 5*a*s/h) bytes for
  backward. Their assumptions, which the block below follows: 16-bit activations (bf16 here), 1-byte
  dropout masks (``torch.native_dropout``, the fused kernel nn.Dropout runs on CUDA, keeps a bool mask;
  nn.Dropout on the CPU keeps its mask in the input's dtype, 2 bytes here, so the block calls
  native_dropout), attention computed as Q K^T, softmax, dropout and the product
  with V (no fused kernel), a 4h MLP with GeLU, two LayerNorms, dropout after the attention
  projection and after the MLP. The paper leaves out the LayerNorms' per-token statistics (mean and
  1/std, which autograd saves too; torch's CPU kernel keeps them in the input's dtype, 2 bytes each in
  bf16: 8*s*b bytes per layer): the test adds them, and nothing else.
* A 7B Llama config (hidden 4096, 32 layers, 32 heads, intermediate 11008, vocabulary 32000):
  parameters, gradients and optimizer state per dtype and optimizer equal the closed form computed
  from the config alone (6,738,415,616 parameters).
"""

import math

import pytest
import torch
from torch import nn

from diagnostics.analyses.plan.configs import Config, Setting
from diagnostics.analyses.plan.planner import Planner
from diagnostics.analyses.plan.targets import resolve
from diagnostics.intake import LoadedModel
from diagnostics.measure.memory import SavedTensorTracker
from diagnostics.spec import InputSpec, ModelSpec

CPU = resolve("cpu", cpu={"ram_available_bytes": 1 << 36})


class MaskDropout(nn.Module):
    """Dropout keeping a 1-byte mask for backward, as the paper assumes (torch.native_dropout)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        return torch.native_dropout(x, self.p, self.training)[0]


class PaperLayer(nn.Module):
    """One layer as the paper counts it (see the module doc); input and output [s, b, h]."""

    def __init__(self, h: int, a: int, p: float = 0.1):
        super().__init__()
        self.h, self.a = h, a
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.drop_attn, self.drop_proj, self.drop_mlp = MaskDropout(p), MaskDropout(p), MaskDropout(p)

    def forward(self, x):
        s, b, h = x.shape
        a, d = self.a, h // self.a
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)  # each [s, b, h], views of one output

        def heads(t):  # [s, b, h] -> [b, a, s, d]
            return t.reshape(s, b, a, d).permute(1, 2, 0, 3)

        scores = heads(q) @ heads(k).transpose(-1, -2)  # [b, a, s, s]
        probs = self.drop_attn(torch.softmax(scores * (1.0 / math.sqrt(d)), dim=-1))
        ctx = (probs @ heads(v)).permute(2, 0, 1, 3).reshape(s, b, h)
        x = x + self.drop_proj(self.proj(ctx))
        return x + self.drop_mlp(self.fc2(nn.functional.gelu(self.fc1(self.ln2(x)))))


class PaperModel(nn.Module):
    def __init__(self, h, a, layers):
        super().__init__()
        self.inp = nn.Linear(h, h)  # makes the first layer's input an activation, as inside a deep model
        self.layers = nn.ModuleList(PaperLayer(h, a) for _ in range(layers))

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return x


def korthikanti(s, b, h, a) -> int:
    return s * b * h * 34 + 5 * a * s * s * b


def layer_norm_stats(s, b) -> int:
    return 2 * 2 * 2 * s * b  # two LayerNorms, mean and rstd, bf16 (as the CPU kernel keeps them), per token


def _loaded(model, shape):
    return LoadedModel(ModelSpec(name="paper"), model, (InputSpec(shape),), (torch.randn(shape),),
                       lambda out: out.float().pow(2).mean(), "mean square")


@pytest.mark.parametrize("s, b, h, a", [(64, 2, 128, 4), (128, 3, 64, 8)])
def test_a_layers_saved_activations_equal_korthikanti_in_16_bit(s, b, h, a):
    torch.manual_seed(0)
    loaded = _loaded(PaperModel(h, a, layers=2), (s, b, h))
    st = Planner(loaded, CPU).run(Config(s, None, Setting(dtype="bf16", optimizer="sgd")))
    expected = korthikanti(s, b, h, a) + layer_norm_stats(s, b)
    assert st.saved_in("layers.0") == expected
    assert st.saved_in("layers.1") == expected


def test_the_paper_layer_saves_that_much_on_real_tensors_too():
    """The formula holds for the block as run (saved_tensors_hooks on real bf16 tensors), not only traced."""
    s, b, h, a = 32, 2, 64, 4
    torch.manual_seed(0)
    model = PaperModel(h, a, layers=1).to(torch.bfloat16).train()
    x = torch.randn(s, b, h, dtype=torch.bfloat16)
    tracker = SavedTensorTracker()
    with tracker.track(model, (x,)):
        out = model(x)
    saved = sum(v for k, v in tracker.saved.items() if k.startswith("layers.0"))
    assert saved == korthikanti(s, b, h, a) + layer_norm_stats(s, b)
    del out


# ----------------------------------------------------------------------------- 7B Llama, closed form
L, H, I, V, HEADS = 32, 4096, 11008, 32000, 32
N_PARAMS = V * H + L * (4 * H * H + 3 * H * I + 2 * H) + H + V * H  # embeddings, layers, final norm, LM head


def n_params(layers: int) -> int:
    return V * H + layers * (4 * H * H + 3 * H * I + 2 * H) + H + V * H


def llama_7b(layers: int = L):
    from diagnostics.hf import HFSettings
    from diagnostics.intake import load_model

    cfg = {"model_type": "llama", "hidden_size": H, "intermediate_size": I, "num_hidden_layers": layers,
           "num_attention_heads": HEADS, "vocab_size": V, "max_position_embeddings": 4096}
    return load_model(ModelSpec(source="hf", name="llama", hf=HFSettings(cfg, seq_len=16, meta="on").to_json(),
                                batch_size=1))


def test_the_closed_form_count_is_the_published_one():
    assert N_PARAMS == 6_738_415_616


@pytest.mark.slow
def test_7b_llama_step_holds_exactly_the_closed_form_weights_gradients_and_adamw_state():
    """One whole bf16 AdamW step of the 7B config traced for an H100 (planned for this CPU, the bf16 matmuls'
    scratch probes ran real 7B-wide products: 83 s of the suite on a busy machine): what it holds is the closed
    form. On CUDA, AdamW's step counters are host tensors (not capturable): no device bytes."""
    loaded = llama_7b()
    assert loaded.meta  # nothing of its 6.7 billion parameters is allocated
    st = Planner(loaded, resolve("H100-80GB")).run(Config(1, 16, Setting(dtype="bf16", optimizer="adamw")))
    assert n_params(L) == N_PARAMS
    buffers = sum(b.numel() for b in loaded.model.buffers())  # the rotary embedding's inverse frequencies
    assert buffers == 2 * (H // HEADS // 2)  # inv_freq and original_inv_freq: one per pair of head dimensions
    assert st.param_bytes == N_PARAMS * 2 + buffers * 2
    assert st.grad_bytes == N_PARAMS * 2
    assert st.state_bytes == 2 * N_PARAMS * 2  # exp_avg, exp_avg_sq in bf16 (the CPU plan adds 4 bytes a tensor)
    assert st.phase == "optimizer" and st.parts["gradients"] == N_PARAMS * 2


def _state_bytes(loaded, dtype, optimizer, target):
    """The optimizer state the plan creates before its traced step (trace._init_state), in bytes."""
    from diagnostics.analyses.plan.planner import fake_mode
    from diagnostics.analyses.plan.trace import _bytes, _init_state, _optimizer, _state_tensors, prepare

    fake = fake_mode()
    config = Config(1, 16, Setting(dtype=dtype, optimizer=optimizer))
    model, _, _ = prepare(loaded, config, target, fake)
    opt = _optimizer(model, config, target)
    _init_state(model, opt, fake)
    return _bytes(_state_tensors(opt))


@pytest.mark.parametrize("dtype, elt, optimizer, per_param, steps", [
    ("fp32", 4, "sgd", 1, False), ("bf16", 2, "sgd_nomomentum", 0, False), ("fp32", 4, "adam", 2, True),
])
def test_7b_llama_optimizer_state_per_dtype_and_optimizer_is_the_closed_form(dtype, elt, optimizer, per_param, steps):
    loaded = llama_7b()
    n_tensors = len(list(loaded.model.parameters()))
    assert _state_bytes(loaded, dtype, optimizer, CPU) == per_param * N_PARAMS * elt + (4 * n_tensors if steps else 0)


def test_7b_llama_adafactor_state_is_factored():
    """Adafactor keeps a row and a column vector per matrix (and the whole tensor for vectors): closed form."""
    loaded = llama_7b()
    matrices = [(V, H), (V, H)] + L * ([(H, H)] * 4 + [(I, H), (I, H), (H, I)])
    vectors = [H] * (2 * L + 1)
    factored = 2 * (sum(r + c for r, c in matrices) + sum(vectors))  # bf16
    n_tensors = len(list(loaded.model.parameters()))
    assert _state_bytes(loaded, "bf16", "adafactor", CPU) == factored + 4 * n_tensors
