"""Hugging Face intake (diagnostics.hf): configs built with random weights, their inputs and losses,
the meta-device path for configs too big for the machine, and errors that name the problem. Numbers
are checked against models built directly with transformers in the test and against closed-form counts.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from diagnostics.errors import ModelLoadError, SpecError  # noqa: E402
from diagnostics.hf import HFSettings, parse_assignments, parse_hf_arg, require_transformers  # noqa: E402
from diagnostics.intake import load_model  # noqa: E402
from diagnostics.runner import Job, execute  # noqa: E402
from diagnostics.spec import ModelSpec  # noqa: E402

LLAMA_7B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "intermediate_size": 11008, "vocab_size": 32000}
SMALL_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000}


def hf_spec(config, task=None, seq_len=32, meta="auto", strict=True, batch_size=None):
    return ModelSpec(source="hf", name=config["model_type"], batch_size=batch_size,
                     hf=HFSettings(config, task, seq_len, meta, strict).to_json())


def storage_numel(model) -> int:
    """Parameters counted once per storage (tied weights once), independently of diagnostics.measure."""
    seen = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[(p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape))] = p.numel()
    return sum(seen.values())


def reference_flops(model, *args, **kwargs) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc, torch.no_grad():
        model(*args, **kwargs)
    return fc.get_total_flops()


# ----------------------------------------------------------------------------- the meta path
@pytest.fixture(scope="module")
def llama_7b_results(tmp_path_factory):
    spec = hf_spec(LLAMA_7B, seq_len=128, meta="on")
    art = tmp_path_factory.mktemp("art")
    return (execute(Job("summary", spec, {"skip_backward": True}), art),
            execute(Job("memory", spec, {"optimizer": "adamw"}), art))


def test_llama_7b_is_counted_exactly_on_the_meta_device(llama_7b_results):
    summary, memory = llama_7b_results
    p = 6_738_415_616
    assert summary.metrics.params_total == p and summary.metrics.tied_parameters == 0
    assert summary.meta is True and "meta device" in summary.notes[0]
    assert memory.metrics.param_bytes == p * 4
    assert memory.metrics.grad_bytes == p * 4
    assert memory.metrics.optimizer_state_bytes == p * 8
    # what was not measured says so: None, never 0
    for key in ("peak_train_bytes", "peak_inference_bytes", "saved_activation_bytes", "estimate_bytes"):
        assert getattr(memory.metrics, key) is None, key
    assert "not measured" in memory.notes[0]


def test_llama_7b_flops_per_token_match_the_closed_form(llama_7b_results):
    """2 FLOPs per weight of every matmul (q, k, v, o, gate, up, down, lm_head) per token, plus the
    attention matmuls QK^T and AV: 2 * 2 * seq * hidden per token and layer (torch counts the full
    square, causal or not)."""
    summary, _ = llama_7b_results
    h, i, layers, vocab, seq = 4096, 11008, 32, 32000, 128
    matmul_weights = layers * (4 * h * h + 3 * h * i) + h * vocab
    per_token = 2 * matmul_weights + layers * 4 * seq * h
    m = summary.metrics
    assert m.flops_forward_per_token == per_token
    assert m.flops_forward == per_token * 2 * seq  # batch 2


def test_meta_build_counts_what_the_real_build_counts(tmp_path):
    real = execute(Job("summary", hf_spec(SMALL_GPT2, meta="off"), {}), tmp_path)
    meta = execute(Job("summary", hf_spec(SMALL_GPT2, meta="on"), {}), tmp_path)
    assert meta.meta and not real.meta
    for key in ("params_total", "tied_parameters", "param_bytes", "flops_forward", "flops_forward_per_token"):
        assert getattr(meta.metrics, key) == getattr(real.metrics, key), key
    # Backward: on fake tensors attention's backward is the math one (4 matmuls of 2*b*h*s*s*d). The training
    # step is counted in training mode, where GPT-2's attention dropout (0.1) runs the math path on the CPU too
    # (in eval mode the CPU's fused kernel ran, and recomputed the scores QK^T: a 5th matmul per layer).
    assert real.metrics.flops_backward == meta.metrics.flops_backward
    assert any("math attention backward" in n for n in meta.notes)


def test_meta_model_refuses_measuring_analyses(tmp_path):
    with pytest.raises(SpecError, match="only the counting analyses run on it"):
        execute(Job("profile", hf_spec(SMALL_GPT2, meta="on"), {}), tmp_path)


def test_auto_meta_when_training_state_exceeds_free_memory(monkeypatch):
    import diagnostics.hf as hf

    monkeypatch.setattr(hf, "_free_bytes", lambda device: 2**20)  # 1 MiB free; 229,632 params need 3.5 MiB
    loaded = load_model(hf_spec(SMALL_GPT2))
    assert loaded.meta and "its 229,632 parameters need 3.50 MiB" in loaded.meta
    assert "more than half of the 1.00 MiB free on cpu" in loaded.meta
    assert all(p.device.type == "meta" for p in loaded.model.parameters())
    monkeypatch.setattr(hf, "_free_bytes", lambda device: 2**40)
    assert load_model(hf_spec(SMALL_GPT2)).meta is None


# ----------------------------------------------------------------------------- built models
def test_gpt2_small_parameters_equal_transformers_own_model(tmp_path):
    loaded = load_model(hf_spec({"model_type": "gpt2"}, seq_len=16))
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    n = storage_numel(ref)
    assert n == 124_439_808  # GPT-2 small, lm_head tied to wte
    result = execute(Job("summary", hf_spec({"model_type": "gpt2"}, seq_len=16), {"skip_backward": True}), tmp_path)
    assert result.metrics.params_total == n == storage_numel(loaded.model)
    assert result.metrics.tied_parameters == 1


def test_forward_flops_equal_flop_counter_with_math_attention(tmp_path):
    loaded = load_model(hf_spec(SMALL_GPT2, seq_len=32))
    (ids,) = loaded.inputs
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{k: v for k, v in SMALL_GPT2.items()
                                                                  if k != "model_type"}))
    expected = reference_flops(ref.eval(), ids)
    result = execute(Job("summary", hf_spec(SMALL_GPT2, seq_len=32), {}), tmp_path)
    assert result.metrics.flops_forward == expected > 0
    assert result.metrics.flops_forward_per_token == expected / ids.numel()
    assert ids.shape == (2, 32) and ids.dtype == torch.int64 and 0 <= ids.min() and ids.max() < 1000


def test_causal_lm_loss_equals_transformers_loss():
    loaded = load_model(hf_spec(SMALL_GPT2, seq_len=24))
    (ids,) = loaded.inputs
    inner = loaded.model.model
    assert type(inner).__name__ == "GPT2LMHeadModel"
    loaded.model.eval()
    with torch.no_grad():
        ours = loaded.loss_fn(loaded.forward())
        theirs = inner(ids, labels=ids).loss
    torch.testing.assert_close(ours, theirs)
    assert "causal-LM" in loaded.loss_name and not loaded.loss_stand_in


def test_masked_lm_loss_and_default_task_for_an_encoder():
    cfg = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 500}
    loaded = load_model(hf_spec(cfg, seq_len=16))
    assert type(loaded.model.model).__name__ == "BertForMaskedLM"  # an encoder: masked-LM by default
    (ids,) = loaded.inputs
    loaded.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.loss_fn(loaded.forward()), loaded.model.model(ids, labels=ids).loss)
    cls = load_model(hf_spec({**cfg, "num_labels": 3}, task="sequence-classification", seq_len=16))
    out = cls.forward()
    assert out.shape == (2, 3) and "3 classes" in cls.loss_name
    assert torch.isfinite(cls.loss_fn(out))


def test_vit_gets_pixel_values_and_image_classification():
    cfg = {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 64, "image_size": 32, "patch_size": 8, "num_labels": 5}
    loaded = load_model(hf_spec(cfg))
    assert type(loaded.model.model).__name__ == "ViTForImageClassification"
    (x,) = loaded.inputs
    assert x.shape == (2, 3, 32, 32) and x.dtype == torch.float32
    assert loaded.forward().shape == (2, 5)


def test_architectures_key_picks_the_task():
    cfg = {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "hidden_size": 32,
           "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    loaded = load_model(hf_spec(cfg, strict=False))
    assert type(loaded.model.model).__name__ == "BertForSequenceClassification"


def test_llama_with_grouped_query_attention_builds():
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300}
    loaded = load_model(hf_spec(cfg, seq_len=8))
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    assert storage_numel(loaded.model) == storage_numel(ref)
    logits, ids = loaded.forward()
    assert logits.shape == (2, 8, 300) and torch.equal(ids, loaded.inputs[0])


# ----------------------------------------------------------------------------- errors by message
def test_unknown_config_key_is_an_error_with_a_suggestion():
    with pytest.raises(ModelLoadError, match=r"unknown gpt2 config key 'n_layers' \(did you mean n_layer"):
        load_model(hf_spec({"model_type": "gpt2", "n_layers": 2}))


def test_config_json_unknown_keys_are_noted_not_fatal():
    loaded = load_model(hf_spec({**SMALL_GPT2, "my_custom_flag": 1, "transformers_version": "4.0"}, strict=False))
    assert any("my_custom_flag" in n for n in loaded.notes)
    assert not any("transformers_version" in n for n in loaded.notes)


def test_unknown_model_type_and_wrong_task_and_bad_values():
    with pytest.raises(ModelLoadError, match=r"unknown Hugging Face model_type 'lama'.*llama"):
        load_model(hf_spec({"model_type": "lama"}))
    with pytest.raises(ModelLoadError, match="gpt2 has no masked-lm head in transformers; its tasks: causal-lm"):
        load_model(hf_spec(SMALL_GPT2, task="masked-lm"))
    with pytest.raises(SpecError, match=r"sequence length 2048 is longer than the config's max_position_embeddings"):
        load_model(hf_spec(SMALL_GPT2, seq_len=2048))
    with pytest.raises(ModelLoadError, match="could not build llama|invalid llama config"):
        load_model(hf_spec({"model_type": "llama", "hidden_size": 30, "num_attention_heads": 4,
                            "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 10}))


def test_encoder_decoder_configs_build_as_seq2seq_lm():
    """Refused before keyword inputs; now T5 gets the seq2seq-lm task (tests/test_hf_seq2seq.py covers it)."""
    loaded = load_model(hf_spec({"model_type": "t5", "d_model": 32, "num_layers": 1, "num_heads": 2, "d_kv": 16,
                                 "d_ff": 64, "vocab_size": 100}, seq_len=8))
    assert type(loaded.model.model).__name__ == "T5ForConditionalGeneration"
    assert [s.name for s in loaded.input_specs] == ["input_ids", "decoder_input_ids"]


def test_missing_model_type_and_bad_json():
    with pytest.raises(SpecError, match="needs a model_type"):
        HFSettings({"n_layer": 2})
    from diagnostics.hf import read_config_json

    with pytest.raises(SpecError, match="cfg.json has no model_type key"):
        read_config_json(b'{"n_layer": 2}', "cfg.json")
    with pytest.raises(SpecError, match="cfg.json is not valid JSON"):
        read_config_json(b"{n_layer: 2", "cfg.json")
    with pytest.raises(SpecError, match="'n_layer' is not KEY=VALUE"):
        parse_assignments("n_layer")


def test_missing_transformers_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ModelLoadError, match="pip install transformers"):
        require_transformers()


def test_parse_hf_arg_architecture_and_file(tmp_path):
    cfg, strict = parse_hf_arg("llama:hidden_size=4096,rope_theta=1e4,tie_word_embeddings=true",
                               ["num_hidden_layers=2"])
    assert cfg == {"model_type": "llama", "hidden_size": 4096, "rope_theta": 10000.0, "tie_word_embeddings": True,
                   "num_hidden_layers": 2} and strict
    f = tmp_path / "config.json"
    f.write_text(json.dumps(SMALL_GPT2))
    cfg, strict = parse_hf_arg(str(f), ["n_layer=3"])
    assert cfg == {**SMALL_GPT2, "n_layer": 3} and not strict
    with pytest.raises(SpecError, match="config file not found"):
        parse_hf_arg(str(tmp_path / "nope.json"))


def test_spec_round_trip_and_other_specs_unchanged():
    spec = hf_spec(SMALL_GPT2)
    assert ModelSpec.from_json(spec.to_json()) == spec
    assert "hf" not in ModelSpec().to_dict()  # other sources keep their dict and cache keys
    other = hf_spec({**SMALL_GPT2, "n_layer": 3})
    assert spec.file_sha256 and other.file_sha256 != spec.file_sha256  # the config identifies the model
    with pytest.raises(SpecError, match="needs its config"):
        ModelSpec(source="hf", name="x")


def test_mixtral_on_the_meta_device_keeps_exact_parameters_when_flops_cannot_be_counted(tmp_path):
    """torch's meta kernel of the experts' grouped matmul asks for bf16 where the CPU runs fp32: the
    summary still comes, parameters exact, FLOPs None with the reason (never a silent 0)."""
    cfg = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300, "num_local_experts": 4,
           "num_experts_per_tok": 2}
    real = execute(Job("summary", hf_spec(cfg, seq_len=16, meta="off"), {"skip_backward": True}), tmp_path)
    meta = execute(Job("summary", hf_spec(cfg, seq_len=16, meta="on"), {"skip_backward": True}), tmp_path)
    ref = transformers.MixtralForCausalLM(transformers.MixtralConfig(**{k: v for k, v in cfg.items()
                                                                        if k != "model_type"}))
    assert meta.metrics.params_total == real.metrics.params_total == storage_numel(ref)
    assert real.metrics.flops_forward > 0
    m = meta.metrics
    if m.flops_forward is None:  # this torch's meta kernel refuses fp32 grouped matmuls
        assert m.flops_forward_per_token is None
        assert any(n.startswith("FLOPs not counted: the model could not run on fake tensors") for n in meta.notes)
    else:
        assert m.flops_forward == real.metrics.flops_forward


def test_an_hf_spec_longer_than_a_file_name_is_parsed_not_looked_up(tmp_path):
    """A spec over 255 characters crashed with ``OSError: [Errno 36] File name too long`` (is_file on it)."""
    from diagnostics.cli.model_args import hf_spec

    keys = ",".join(f"{k}={v}" for k, v in [("n_layer", 1), ("n_embd", 32), ("n_head", 4), ("vocab_size", 100),
                                             ("n_positions", 64), ("resid_pdrop", 0.0), ("embd_pdrop", 0.0),
                                             ("attn_pdrop", 0.0), ("layer_norm_epsilon", 1e-5),
                                             ("initializer_range", 0.02), ("activation_function", "gelu_new"),
                                             ("scale_attn_weights", "true"), ("use_cache", "false"),
                                             ("summary_first_dropout", 0.1), ("bos_token_id", 1), ("eos_token_id", 2),
                                             ("scale_attn_by_inverse_layer_idx", "false")])
    text = "gpt2:" + keys
    assert len(text) >= 300
    cfg, strict = parse_hf_arg(text)
    assert strict and cfg["model_type"] == "gpt2" and cfg["n_embd"] == 32 and cfg["eos_token_id"] == 2
    assert cfg["scale_attn_by_inverse_layer_idx"] is False
    spec = hf_spec(text, seq_len=8)
    loaded = load_model(spec)
    assert loaded.model.model.config.n_embd == 32 and loaded.model.model.config.eos_token_id == 2
    long_json = "x" * 300 + ".json"  # a path too long to exist: named, not an OSError
    with pytest.raises(SpecError, match="config file not found"):
        parse_hf_arg(long_json)
