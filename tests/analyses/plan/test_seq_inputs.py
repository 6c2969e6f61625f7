"""Sequence lengths per input: each input keeps its own length unless --seq names it. A speech
encoder-decoder (4000 audio samples, 8 decoder tokens) used to be planned with the audio's length applied
to its decoder's tokens: a 4000 x 4000 decoder attention the model never runs."""

from pathlib import Path

import pytest

from diagnostics.analyses.plan import ANALYSIS
from diagnostics.analyses.plan.configs import Config, Setting, parse_seq, settings_of
from diagnostics.analyses.plan.trace import specs_at
from diagnostics.declare import OptionError
from diagnostics.intake import load_model
from diagnostics.spec import InputSpec, ModelSpec

pytest.importorskip("transformers")

SPEECH = Path(__file__).parents[2] / "data" / "plan" / "speech_seq2seq.py"
AUDIO = InputSpec((2, 4000), "float32", None, "input_values")
TOKENS = InputSpec((2, 8), "int64", 99, "decoder_input_ids")


def speech_spec() -> ModelSpec:
    return ModelSpec(source="python", name="speech_seq2seq.py", path=str(SPEECH))


def test_the_seq_option_names_an_input_or_every_token_input():
    assert parse_seq("4096, 2048") == ("", [2048, 4096])
    assert parse_seq("decoder_input_ids= 32,16") == ("decoder_input_ids", [16, 32])
    assert ANALYSIS.validate({"seq": "decoder_input_ids=32, 16"})["seq"] == "decoder_input_ids=16,32"
    with pytest.raises(OptionError, match=r"option seq: '1x' is not an input's name"):
        ANALYSIS.validate({"seq": "1x=4"})
    with pytest.raises(OptionError, match=r"option seq: no lengths after ids="):
        ANALYSIS.validate({"seq": "ids="})
    assert {s.seq_input for s in settings_of(ANALYSIS.validate({"seq": "ids=4", "dtype": ["fp32", "bf16"]}))} == {"ids"}


def test_a_length_applies_to_the_input_it_names_and_the_others_keep_theirs():
    both = (AUDIO, TOKENS)
    assert [s.shape for s in specs_at(both, 3, None)] == [(3, 4000), (3, 8)]
    assert [s.shape for s in specs_at(both, 3, 16)] == [(3, 4000), (3, 16)]  # unnamed: token inputs only
    assert [s.shape for s in specs_at(both, 3, 8000, "input_values")] == [(3, 8000), (3, 8)]
    assert [s.shape for s in specs_at(both, 3, 32, "decoder_input_ids")] == [(3, 4000), (3, 32)]


def _analyze(tmp_path, spec, options):
    from diagnostics.analyses.plan.job import analyze
    from diagnostics.runner import AnalysisContext, Job

    return analyze(AnalysisContext(Job("plan", spec, options), tmp_path), options)


@pytest.mark.slow
def test_the_held_out_speech_model_plans_within_goal_without_seq(tmp_path):
    """No --seq: the audio keeps its 4000 samples, the decoder its 8 tokens; the plan is within 5 % of the
    training step measured for real (here: to the byte)."""
    from diagnostics.analyses.plan.measured import measured_peak

    result = _analyze(tmp_path, speech_spec(), {"batch": "2", "sweep": False, "device": "cpu:64GiB",
                                                "optimizer": ["adamw"]})
    row, = result.rows
    assert row.seq == 8 and not row.error
    measured = measured_peak(load_model(speech_spec()), Config(2, None, Setting()))["peak_bytes"]
    assert abs(row.peak_bytes - measured) <= 0.05 * measured, (row.peak_bytes, measured)
    # the audio input at 4000 samples alone is 2 x 4000 x 4 bytes; a 4000-token decoder would hold far more
    assert row.parts["inputs"] == 2 * 4000 * 4 + 2 * 8 * 8


def test_inputs_of_different_lengths_keep_their_own_and_a_named_one_varies(tmp_path):
    """T5 (input_ids 16, decoder_input_ids 8): no --seq plans each at its own length (no seq axis, a note
    says so); --seq decoder_input_ids=4 changes the decoder's alone; a name that is no input is refused."""
    from diagnostics.hf import HFSettings

    t5 = {"model_type": "t5", "d_model": 32, "d_ff": 64, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 4,
          "d_kv": 8, "vocab_size": 300}
    spec = ModelSpec(source="hf", name="t5", hf=HFSettings(t5, None, 16, "auto", True, 8).to_json())
    own = _analyze(tmp_path, spec, {"batch": "2", "sweep": False, "device": "cpu:64GiB"})
    assert [r.seq for r in own.rows] == [None]
    assert any("each input keeps its own length (input_ids 16, decoder_input_ids 8)" in n for n in own.notes)
    named = _analyze(tmp_path, spec, {"batch": "2", "seq": "decoder_input_ids=4", "sweep": False,
                                      "device": "cpu:64GiB"})
    assert [r.seq for r in named.rows] == [4]
    assert named.rows[0].parts["inputs"] == own.rows[0].parts["inputs"] - 2 * 4 * 8  # 4 tokens fewer, int64
    with pytest.raises(OptionError, match=r"option seq: labels is not an input with a length .* the model's "
                                          r"inputs: input_ids \[2, 16\] int64, decoder_input_ids \[2, 8\] int64"):
        _analyze(tmp_path, spec, {"batch": "2", "seq": "labels=4", "sweep": False, "device": "cpu:64GiB"})
