import pytest

from diagnostics.errors import SpecError
from diagnostics.spec import InputSpec, ModelSpec, cache_key


def test_spec_round_trips_through_json():
    spec = ModelSpec(source="sample", name="transformer", inputs=(InputSpec((4, 16), "int64", high=1000),),
                     batch_size=4, device="cpu", seed=3)
    again = ModelSpec.from_json(spec.to_json())
    assert again == spec
    assert again.inputs[0].shape == (4, 16) and again.inputs[0].high == 1000


def test_cache_key_follows_content():
    a = ModelSpec(name="mlp")
    assert cache_key(a, "summary", {}) == cache_key(ModelSpec(name="mlp"), "summary", {})
    assert cache_key(a, "summary", {}) != cache_key(ModelSpec(name="cnn"), "summary", {})
    assert cache_key(a, "summary", {"x": 1}) != cache_key(a, "summary", {"x": 2})


@pytest.mark.parametrize("kwargs, message", [
    ({"source": "onnx"}, "unknown model source 'onnx'"),
    ({"source": "export"}, "needs a file path"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"batch_size": 0}, "batch size must be positive"),
])
def test_bad_specs_are_named(kwargs, message):
    with pytest.raises(SpecError, match=message):
        ModelSpec(**kwargs)


def test_bad_inputs_are_named():
    with pytest.raises(SpecError, match="dimension <= 0"):
        InputSpec((4, 0))
    with pytest.raises(SpecError, match="unknown dtype 'float8'"):
        InputSpec((4,), "float8")
    assert InputSpec((8, 3)).with_batch(2).shape == (2, 3)
