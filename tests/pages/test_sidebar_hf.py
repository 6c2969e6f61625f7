"""AppTest of the sidebar's Hugging Face source: an architecture with sizes is built with random weights
in a worker, replaces the current model once it loads, and the Model page summarises it."""

import json

import pytest

from diagnostics.analyses.validate import ValidateMetrics, ValidateResult
from diagnostics.results import ModelInput
from ui import state

transformers = pytest.importorskip("transformers")


def _gpt2_params(**sizes) -> int:
    """Parameters of GPT-2 built directly with transformers, each storage once (lm_head is tied to wte)."""
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(**sizes))
    return sum({p.untyped_storage().data_ptr(): p.numel() for _, p in m.named_parameters(remove_duplicate=False)}.values())


def test_build_a_gpt2_config_and_see_its_summary(new_app):
    at = new_app().run()
    at.sidebar.radio(key="sb_source").set_value("Hugging Face config").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.selectbox(key="sb_hf_arch").value == "gpt2"
    assert at.sidebar.number_input(key="sb_hf_gpt2_num_hidden_layers").value == 12  # transformers' default
    at.sidebar.number_input(key="sb_hf_gpt2_num_hidden_layers").set_value(2)
    at.sidebar.number_input(key="sb_hf_gpt2_hidden_size").set_value(64)
    at.sidebar.number_input(key="sb_hf_gpt2_num_attention_heads").set_value(4)
    at.sidebar.number_input(key="sb_hf_gpt2_vocab_size").set_value(1000)
    at.sidebar.number_input(key="sb_hf_seq").set_value(16)
    at.sidebar.button(key="sb_hf_build").click().run()
    at.run()  # the load's job ended: switch to the model, summarise it
    assert not at.exception, [e.value for e in at.exception]
    assert not at.sidebar.error, [e.value for e in at.sidebar.error]
    spec = at.session_state[state.SPEC]
    assert spec.source == "hf" and json.loads(spec.hf)["config"] == {
        "model_type": "gpt2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "vocab_size": 1000}
    assert any("Loaded gpt2 (HFTaskModel[GPT2LMHeadModel])" in s.value for s in at.sidebar.success)
    # the Model page's summary: parameters of the same config built directly with transformers
    n = _gpt2_params(n_layer=2, n_embd=64, n_head=4, vocab_size=1000)
    params = next(m for m in at.metric if m.label == "Parameters")
    assert f"{n:,}" in params.help and n == 229_632
    assert any("[2, 16] int64" in c.value for c in at.caption)


def test_a_typo_in_more_keys_is_named(new_app):
    at = new_app().run()
    at.sidebar.radio(key="sb_source").set_value("Hugging Face config").run()
    at.sidebar.text_input(key="sb_hf_extra").set_value("n_layers=2").run()
    at.sidebar.button(key="sb_hf_build").click().run()
    at.run()
    errors = [e.value for e in at.sidebar.error]
    assert any("unknown gpt2 config key 'n_layers' (did you mean n_layer" in e for e in errors), errors
    assert at.session_state[state.SPEC].source == "sample"  # the previous model stays


def test_memory_page_of_a_meta_model_shows_counts_not_peaks(new_app):
    from diagnostics import ModelSpec
    from diagnostics.hf import HFSettings

    config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000}
    spec = ModelSpec(source="hf", name="gpt2", hf=HFSettings(config, seq_len=16, meta="on").to_json())
    at = new_app()
    at.session_state["sb_source"] = "Hugging Face config"
    at.session_state[state.MODEL_INFO] = {"spec": spec.to_dict(), "check": ValidateResult(
        model="gpt2", model_type="HFTaskModel[GPT2LMHeadModel]", inputs=(ModelInput(shape=(2, 16), dtype="int64",
                                                                                     high=1000),),
        output_shape=[2, 16, 1000], loss="cross-entropy", notes=(),
        metrics=ValidateMetrics(output_nan=None, output_inf=None, output_elements=None))}
    at.switch_page("pages/memory.py").run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    params = 229_632
    # one scale for the page's byte tiles (the largest one's, MiB): 918,528 B = 0.88 MiB would read 0.9 MiB,
    # so a tile that would show 0.x keeps its own scale
    assert metrics["Parameters"] == "897.0 KiB" and params * 4 == 918_528  # 918,528 B = 897 KiB
    assert metrics["Optimizer state"] == "1.75 MiB"  # AdamW: 2 x 918,528 B
    assert metrics["Training peak"] == "not measured"
    assert any("not measured" in i.value for i in at.info)


def _storage_numel(model) -> int:
    return sum({p.untyped_storage().data_ptr(): p.numel()
                for _, p in model.named_parameters(remove_duplicate=False)}.values())


@pytest.mark.parametrize("arch, sizes, reference", [
    ("t5", {"num_layers": 2, "num_decoder_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 4, "d_kv": 8,
            "vocab_size": 300}, "T5ForConditionalGeneration"),
    ("bart", {"encoder_layers": 2, "decoder_layers": 1, "d_model": 32, "encoder_attention_heads": 4,
              "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 300},
     "BartForConditionalGeneration"),
])
def test_build_an_encoder_decoder_with_a_decoder_length(new_app, arch, sizes, reference):
    at = new_app().run()
    at.sidebar.radio(key="sb_source").set_value("Hugging Face config").run()
    at.sidebar.selectbox(key="sb_hf_arch").set_value(arch).run()
    assert not at.exception, [e.value for e in at.exception]
    for key, value in sizes.items():  # the encoder-decoder's own keys, both stacks
        at.sidebar.number_input(key=f"sb_hf_{arch}_{key}").set_value(value)
    at.sidebar.number_input(key="sb_hf_seq").set_value(16)
    at.sidebar.number_input(key="sb_hf_dec").set_value(8)  # offered for an encoder-decoder (task auto)
    at.sidebar.button(key="sb_hf_build").click().run()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.sidebar.error, [e.value for e in at.sidebar.error]
    spec = at.session_state[state.SPEC]
    settings = json.loads(spec.hf)
    assert settings["config"] == {"model_type": arch, **sizes} and settings["decoder_len"] == 8
    assert any(f"HFTaskModel[{reference}]" in s.value for s in at.sidebar.success)
    cfg_cls = getattr(transformers, reference.replace("ForConditionalGeneration", "Config"))
    n = _storage_numel(getattr(transformers, reference)(cfg_cls(**sizes)))
    params = next(m for m in at.metric if m.label == "Parameters")
    assert f"{n:,}" in params.help
    assert any("decoder_input_ids=[2, 8] int64" in c.value for c in at.caption), [c.value for c in at.caption]


def test_decoder_length_is_offered_only_to_encoder_decoders(new_app):
    at = new_app().run()
    at.sidebar.radio(key="sb_source").set_value("Hugging Face config").run()
    assert not [n for n in at.sidebar.number_input if n.key == "sb_hf_dec"]  # gpt2, task auto
    at.sidebar.selectbox(key="sb_hf_arch").set_value("t5").run()
    assert [n for n in at.sidebar.number_input if n.key == "sb_hf_dec"]
