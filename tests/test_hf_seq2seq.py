"""Encoder-decoder Hugging Face configs (T5, BART) as the seq2seq-lm task: keyword inputs input_ids and
decoder_input_ids, the decoder's next-token loss equal to transformers' own, the meta-device path for big
configs, and every analysis on small models. References are built directly with transformers in the test.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from diagnostics.errors import ModelLoadError, SpecError  # noqa: E402
from diagnostics.hf import HFSettings  # noqa: E402
from diagnostics.inputs import call  # noqa: E402
from diagnostics.intake import load_model  # noqa: E402
from diagnostics.results import metrics_of  # noqa: E402
from diagnostics.runner import Job, execute  # noqa: E402
from diagnostics.spec import ModelSpec  # noqa: E402

T5 = {"model_type": "t5", "d_model": 32, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 4,
      "d_kv": 8, "vocab_size": 300}
BART = {"model_type": "bart", "d_model": 32, "encoder_layers": 2, "decoder_layers": 1, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 300,
        "max_position_embeddings": 64}
T5_LARGE = {"model_type": "t5", "d_model": 1024, "d_ff": 4096, "num_layers": 24, "num_decoder_layers": 24,
            "num_heads": 16, "d_kv": 64, "vocab_size": 32128}
REFERENCE = {"t5": ("T5Config", "T5ForConditionalGeneration"), "bart": ("BartConfig", "BartForConditionalGeneration")}


def spec(config, seq_len=16, decoder_len=8, task=None, meta="auto", batch_size=None):
    return ModelSpec(source="hf", name=config["model_type"], batch_size=batch_size,
                     hf=HFSettings(config, task, seq_len, meta, True, decoder_len).to_json())


def reference(config, meta=False):
    """The model transformers builds from the same keys, independently of diagnostics.hf."""
    cfg_cls, model_cls = REFERENCE[config["model_type"]]
    cfg = getattr(transformers, cfg_cls).from_dict({k: v for k, v in config.items() if k != "model_type"})
    cfg.use_cache = False
    if meta:
        with torch.device("meta"):
            return getattr(transformers, model_cls)(cfg)
    return getattr(transformers, model_cls)(cfg)


def storage_numel(model) -> int:
    """Parameters counted once per storage (tied embeddings once), independently of diagnostics.measure."""
    seen = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        key = (id(p.untyped_storage()) if p.device.type == "meta" else p.untyped_storage().data_ptr(),
               p.storage_offset(), tuple(p.shape))
        seen[key] = p.numel()
    return sum(seen.values())


def meta_numel(model) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied Parameter once


def reference_flops(model, **kwargs) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc, torch.no_grad():
        model(**kwargs)
    return fc.get_total_flops()


# ----------------------------------------------------------------------------- model, inputs, loss
@pytest.mark.parametrize("config", [T5, BART], ids=["t5", "bart"])
def test_encoder_decoder_builds_as_seq2seq_with_keyword_inputs(config):
    loaded = load_model(spec(config, seq_len=16, decoder_len=8))
    assert type(loaded.model.model).__name__ == REFERENCE[config["model_type"]][1]  # auto task: seq2seq-lm
    assert [(s.name, s.shape, s.dtype, s.high) for s in loaded.input_specs] == [
        ("input_ids", (2, 16), "int64", 300), ("decoder_input_ids", (2, 8), "int64", 300)]
    kw = loaded.inputs.kwargs
    assert set(kw) == {"input_ids", "decoder_input_ids"} and loaded.inputs.args == ()
    assert all(0 <= t.min() and t.max() < 300 for t in kw.values())
    logits, ids = call(loaded.model, loaded.inputs)
    assert logits.shape == (2, 8, 300) and ids is kw["decoder_input_ids"]
    assert loaded.task == "lm" and not loaded.loss_stand_in and "seq2seq-LM" in loaded.loss_name


@pytest.mark.parametrize("config", [T5, BART], ids=["t5", "bart"])
def test_seq2seq_loss_equals_transformers_loss_with_labels_shifted_left(config):
    """transformers' loss is CE(logits[i], labels[i]); with the decoder inputs being the labels shifted
    right (training's convention), labels = decoder ids shifted left with the last position ignored (-100)
    reproduces our loss exactly; labels = the decoder ids themselves (predict the token you see) does not."""
    loaded = load_model(spec(config, seq_len=12, decoder_len=10))
    loaded.model.eval()  # no dropout: the two forwards must see the same network
    ids, dec = loaded.inputs.kwargs["input_ids"], loaded.inputs.kwargs["decoder_input_ids"]
    inner = loaded.model.model
    with torch.no_grad():
        ours = loaded.loss_fn(loaded.forward())
        labels = torch.cat([dec[:, 1:], torch.full((dec.shape[0], 1), -100)], dim=1)
        theirs = inner(input_ids=ids, decoder_input_ids=dec, labels=labels).loss
        unshifted = inner(input_ids=ids, decoder_input_ids=dec, labels=dec).loss
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert abs(ours.item() - unshifted.item()) > 1e-4
    # micro-batches: each output carries its own decoder ids, so the rows' loss is the rows' own
    with torch.no_grad():
        half = loaded.model(input_ids=ids[:1], decoder_input_ids=dec[:1])
        ref_half = inner(input_ids=ids[:1], decoder_input_ids=dec[:1], labels=labels[:1]).loss
    torch.testing.assert_close(loaded.loss_fn.for_rows(half, 0, 1, 2), ref_half, rtol=0, atol=1e-6)


def test_decoder_len_defaults_to_seq_len_and_is_checked():
    loaded = load_model(spec(T5, seq_len=12, decoder_len=None))
    assert [s.shape for s in loaded.input_specs] == [(2, 12), (2, 12)]
    with pytest.raises(SpecError, match="decoder length must be at least 2"):
        HFSettings(T5, None, 12, "auto", True, 1)
    with pytest.raises(SpecError, match="decoder length 100 is longer than the config's max_position_embeddings"):
        load_model(spec(BART, seq_len=16, decoder_len=100))
    with pytest.raises(SpecError, match="a decoder length applies to the seq2seq-lm task"):
        load_model(spec({"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100},
                        decoder_len=8))
    with pytest.raises(ModelLoadError, match="gpt2 has no seq2seq-lm head"):
        load_model(spec({"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100},
                        task="seq2seq-lm", decoder_len=None))


def test_other_heads_of_an_encoder_decoder():
    """BART's masked-LM head (BartForConditionalGeneration fed input_ids only) and its decoder-only causal-LM
    build with one positional input; sequence classification, which needs <eos> tokens, is refused clearly."""
    loaded = load_model(spec(BART, task="causal-lm", decoder_len=None))
    assert type(loaded.model.model).__name__ == "BartForCausalLM" and [s.name for s in loaded.input_specs] == [None]
    assert loaded.loss_fn(loaded.forward()).item() > 0
    for config in (T5, BART):
        with pytest.raises(ModelLoadError, match="sequence-classification head reads the decoder's state at <eos>"):
            load_model(spec(config, task="sequence-classification", decoder_len=None))


def test_decoder_len_in_the_spec_json_only_when_set():
    base = HFSettings(T5, None, 16)
    assert "decoder_len" not in base.to_json()  # other specs keep their JSON, hence their cache keys
    s = HFSettings(T5, "seq2seq-lm", 16, "auto", True, 8)
    assert HFSettings.from_json(s.to_json()) == s
    assert spec(T5, decoder_len=8).file_sha256 != spec(T5, decoder_len=9).file_sha256


# ----------------------------------------------------------------------------- summary against references
@pytest.mark.parametrize("config", [T5, BART], ids=["t5", "bart"])
def test_summary_params_and_forward_flops_equal_references(config, tmp_path):
    loaded = load_model(spec(config))
    ref = reference(config).eval()
    expected_flops = reference_flops(ref, **loaded.inputs.kwargs)
    result = execute(Job("summary", spec(config), {}), tmp_path)
    m = result.metrics
    assert m.params_total == storage_numel(ref) == storage_numel(loaded.model)
    assert m.tied_parameters >= 1  # the shared embedding (and the tied LM head) counted once
    assert m.flops_forward == expected_flops > 0
    assert m.flops_forward_per_token == expected_flops / (2 * 16)  # per encoder token
    assert [i.name for i in result.inputs] == ["input_ids", "decoder_input_ids"]


def test_t5_large_is_counted_exactly_on_the_meta_device(tmp_path):
    ref = reference(T5_LARGE, meta=True)
    assert meta_numel(ref) == 737_668_096
    result = execute(Job("summary", spec(T5_LARGE, seq_len=16, decoder_len=8, meta="on"), {"skip_backward": True}),
                     tmp_path)
    assert result.meta is True and result.metrics.params_total == meta_numel(ref)
    # FLOPs in closed form: 2 per weight per token of every matmul, plus the attention matmuls (QK^T, AV:
    # 4 * b * s_q * s_k * inner per layer). Encoder: q, k, v, o and the two FF matmuls per encoder token.
    # Decoder: self q, k, v, o, cross q, o and FF per decoder token; cross k, v per encoder token; LM head.
    d, ff, inner, layers, vocab, b, se, sd = 1024, 4096, 16 * 64, 24, 32128, 2, 16, 8
    te, td = b * se, b * sd
    encoder = layers * (te * 2 * (4 * d * inner + 2 * d * ff) + 4 * b * se * se * inner)
    decoder = layers * (td * 2 * (6 * d * inner + 2 * d * ff) + te * 2 * 2 * d * inner
                        + 4 * b * sd * sd * inner + 4 * b * sd * se * inner)
    assert result.metrics.flops_forward == encoder + decoder + td * 2 * d * vocab
    memory = execute(Job("memory", spec(T5_LARGE, seq_len=16, decoder_len=8, meta="on"), {"optimizer": "adamw"}),
                     tmp_path)
    assert memory.metrics.param_bytes == 737_668_096 * 4
    assert memory.metrics.optimizer_state_bytes == 737_668_096 * 8
    assert memory.metrics.peak_train_bytes is None  # not measured, never 0


def test_meta_summary_counts_what_the_real_build_counts(tmp_path):
    real = execute(Job("summary", spec(T5, meta="off"), {"skip_backward": True}), tmp_path)
    meta = execute(Job("summary", spec(T5, meta="on"), {"skip_backward": True}), tmp_path)
    assert meta.meta and not real.meta
    for key in ("params_total", "tied_parameters", "param_bytes", "flops_forward"):
        assert getattr(meta.metrics, key) == getattr(real.metrics, key), key


# ----------------------------------------------------------------------------- every analysis
@pytest.mark.parametrize("config", [T5, BART], ids=["t5", "bart"])
@pytest.mark.parametrize("analysis, options", [
    ("profile", {"mode": "train", "wait": 0, "warmup": 0, "active": 1, "latency_iters": 2, "latency_warmup": 0,
                 "roofline": False}),
    ("memory", {"timeline": False}),
    ("gradients", {"steps": 2}),
    ("checklist", {"iters": 1, "profile_steps": 1}),
])
def test_every_analysis_runs_on_a_small_encoder_decoder(config, analysis, options, tmp_path):
    result = execute(Job(analysis, spec(config), options), tmp_path)
    m = metrics_of(result)  # typed or (not converted yet) plain: its headline metrics as a dict
    if analysis == "memory":
        assert m["input_bytes"] == (2 * 16 + 2 * 8) * 8  # both int64 keyword inputs
        assert m["peak_train_bytes"] > m["param_bytes"] > 0
    if analysis == "gradients":
        assert m["layers"] > 0 and m["loss_first"] > 0
        assert "seq2seq-LM" in result.loss
    if analysis == "profile":
        assert m["latency_median_ms"] > 0 and m["batch_size"] == 2
    if analysis == "checklist":
        assert m["applicable"] > 0 and m["error"] == 0
        assert result.facts.errors == {}


@pytest.mark.parametrize("config", [T5, BART], ids=["t5", "bart"])
def test_optimize_fixes_on_an_encoder_decoder(config, tmp_path):
    fixes = ["amp", "int8_dynamic", "inference_mode", "channels_last", "torchscript"]
    result = execute(Job("optimize", spec(config), {"fixes": fixes, "iters": 2, "warmup": 0,
                                                    "save_artifacts": False}), tmp_path)
    rows = {r.fix: r for r in result.rows}
    for fix in fixes:
        assert rows[fix].status in ("ok", "not_applicable"), (fix, rows[fix].why)
        assert rows[fix].status == "ok" or rows[fix].why, fix
    assert rows["inference_mode"].status == "ok" and rows["inference_mode"].max_abs_err == 0
    assert rows["int8_dynamic"].status == "ok" and rows["int8_dynamic"].cosine > 0.999  # nn.Linear throughout
    assert rows["torchscript"].status == "ok" and rows["torchscript"].max_abs_err == 0  # traced by keyword
    assert rows["channels_last"].status == "not_applicable" and "no Conv2d layers" in rows["channels_last"].why
