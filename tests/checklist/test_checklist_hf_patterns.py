"""Issue #17 item 5: the checklist on the patterns of real transformer models, without false alarms.

The layers here are the transformers library's patterns written in plain torch (a BERT pooler,
normal(0, 0.02) init with LayerNorm, T5's relative-attention bias embedding with one column per
head, GPT-2's Conv1D storing its weight (in, out)), so each behaviour is pinned without the library;
a last test runs the real classes when transformers is installed."""

import math

import pytest
import torch
from torch import nn

from diagnostics.measure.structure import forward_facts, static_facts
from tests.checklist.test_checklist_models import expect, static_of


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: a Linear whose weight is stored (in, out)."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(0, 0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], self.nf)


class Pooler(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense, self.activation = nn.Linear(d, d), nn.Tanh()

    def forward(self, x):
        return self.activation(self.dense(x[:, 0]))


class TinyBert(nn.Module):
    """Embedding -> LayerNorm -> Linear/GELU block -> pooler (dense + tanh) -> classifier, HF init."""

    def __init__(self, d=64, vocab=100, heads=12):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.rel_bias = nn.Embedding(32, heads)  # T5: one column per attention head
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.dropout = nn.Dropout(0.0)  # a config's hidden_dropout_prob = 0
        self.pooler = Pooler(d)
        self.classifier = nn.Linear(d, 2)
        for m in self.modules():  # transformers' _init_weights: normal(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.data.normal_(0, 0.02)
                if getattr(m, "bias", None) is not None:
                    m.bias.data.zero_()

    def forward(self, ids):
        h = self.norm(self.embed(ids)) + self.rel_bias(torch.zeros_like(ids)).mean(-1, keepdim=True)
        h = self.dropout(self.ff(h))
        return self.classifier(self.pooler(h))


IDS = torch.randint(0, 100, (4, 16))


def test_pooler_tanh_is_not_a_hidden_activation():
    f = static_of(TinyBert(), IDS)
    assert f.forward.hidden_saturating == () and f.forward.pooler_saturating == ("pooler.activation",)
    expect("hidden_activations", f, "pass", "the Tanh/Sigmoid of the pooler (pooler.activation)")
    # the same Tanh outside a pooler is still a hidden activation
    m = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    assert forward_facts(m, (torch.randn(2, 8),)).hidden_saturating == ("1",)


def test_hf_init_with_layernorm_passes_and_a_broken_init_still_warns():
    model = TinyBert()
    f = static_of(model, IDS)
    gains = {r.name: r.gain for r in f.static.init}
    # normal(0, 0.02) at fan_in 64: 0.02 * 8 = 0.16, below the plain lower bound 0.2
    assert gains["ff.0"] == pytest.approx(model.ff[0].weight.std().item() * 8, rel=1e-5) and gains["ff.0"] < 0.2
    expect("weight_init", f, "pass", "lower bound 0.05: the model has 1 normalisation layers")
    with torch.no_grad():
        model.ff[0].weight.mul_(1e-3)  # a truly vanishing init is still caught
    expect("weight_init", static_of(model, IDS), "warn", "ff.0")
    # without normalisation layers, the plain bound holds
    plain = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    for lin in (plain[0], plain[2]):
        lin.weight.data.normal_(0, 0.02)
    expect("weight_init", static_of(plain, torch.randn(4, 64)), "warn", "outside [0.2, 3.0]")


def test_head_count_embedding_and_dropout_p0_are_not_flagged():
    f = static_of(TinyBert(), IDS)
    assert not any(o.name == "rel_bias" for o in f.forward.widths_not_multiple_of_8)
    expect("layer_widths", f, "pass", "multiples of 8")
    expect("redundant_layers", f, "pass", "1 Dropout(p=0) (dropout) are identities, harmless")


def test_hf_conv1d_is_a_linear_for_init_widths_and_counts():
    model = nn.Sequential(Conv1D(96, 64), nn.GELU(), Conv1D(64, 96))
    s = static_facts(model)
    assert s.n_linear == 2 and s.n_hf_conv1d == 2
    init = {r.name: r for r in s.init}
    assert init["0"].fan_in == 64 and init["0"].type == "Conv1D"
    assert init["0"].gain == pytest.approx(model[0].weight.std().item() * math.sqrt(64), rel=1e-5)
    widths = forward_facts(model, (torch.randn(2, 64),)).widths
    assert [(w.type, w.in_, w.out) for w in widths] == [("Conv1D", 64, 96), ("Conv1D", 96, 64)]


def test_real_transformers_models_have_no_false_alarms():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()

    class Logits(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids).logits

    f = static_of(Logits(bert), IDS)
    for rule_id in ("hidden_activations", "weight_init", "redundant_layers"):
        expect(rule_id, f, "pass", "")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4))
    s = static_facts(gpt2)
    assert s.n_hf_conv1d == 8 and s.n_linear == 9  # 4 Conv1D per block, and lm_head


class ZeroInitBlock(nn.Module):
    """A residual block whose last projection starts at zero (ReZero / adaLN-Zero / zero-init-residual):
    the block is the identity at initialisation, on purpose."""

    def __init__(self, d=64):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


def test_init_conventions_are_named_not_flagged():
    """T5 draws its vocabulary head (and its embedding, when tied) from N(0, 1): std x sqrt(fan_in) =
    sqrt(d_model), far above 3, on purpose. A residual branch's last projection started at zero is too."""
    d, vocab = 64, 100

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(d, d)  # a position table as wide as it is long: not the vocabulary
            self.block = ZeroInitBlock(d)
            self.head = nn.Linear(d, vocab, bias=False)
            for m in (self.embed, self.pos, self.block.up):
                m.weight.data.normal_(0, 0.02)
            self.head.weight.data.normal_(0, 1.0)  # T5's untied lm_head

        def forward(self, ids):
            return self.head(self.block(self.embed(ids) + self.pos.weight[: ids.shape[1]]))

    f = static_of(TinyLM(), IDS)
    roles = {r.name: r.role for r in f.static.init}
    assert roles == {"block.up": None, "block.down": "zero-initialised", "head": "vocabulary head"}
    expect("weight_init", f, "pass", "by convention, not judged: head (")
    expect("weight_init", f, "pass", "by convention, not judged: block.down (0.00): zero-initialised")
    # a plain layer at N(0, 1) is still too large, and a model whose every layer is zero still warns
    model = TinyLM()
    model.block.up.weight.data.normal_(0, 1.0)
    expect("weight_init", static_of(model, IDS), "warn", "block.up (8.")
    flat = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    for lin in (flat[0], flat[2]):
        nn.init.zeros_(lin.weight)
    expect("weight_init", static_of(flat, torch.randn(4, 8)), "warn", "2 of 2 layers")


def test_t5_from_a_config_has_no_init_warning(tmp_path):
    pytest.importorskip("transformers")
    from diagnostics.intake import load_model
    from diagnostics.measure.structure import static_facts
    from tests.real_architectures import spec_of

    model = load_model(spec_of("t5", tmp_path)).model
    from msgspec.structs import replace

    from tests.checklist.sample_facts import healthy

    f = replace(healthy(), static=static_facts(model))  # the weight_init rule reads the static facts only
    head = next(r for r in f.static.init if r.name == "model.lm_head")
    assert head.role == "vocabulary head" and head.gain == pytest.approx(math.sqrt(32), rel=0.05)
    expect("weight_init", f, "pass", "model.lm_head (5.")
