"""Every model-source kind loads, and every bad input fails with a message naming the problem."""

import textwrap

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from diagnostics.errors import ModelLoadError, ModelRunError, SpecError, TrustError
from diagnostics.intake import load_model
from diagnostics.spec import InputSpec, ModelSpec
from sample_models import SAMPLES


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


def test_every_sample_loads_and_runs_forward_and_backward():
    for name in SAMPLES:
        loaded = load_model(ModelSpec(name=name))
        out = loaded.forward()
        loss = loaded.loss_fn(out)
        assert loss.ndim == 0 and torch.isfinite(loss) or name == "bad_init_mlp"
        loss.backward()


def test_batch_size_and_edited_inputs_apply():
    loaded = load_model(ModelSpec(name="mlp", batch_size=5))
    assert loaded.inputs[0].shape == (5, 64)
    loaded = load_model(ModelSpec(name="transformer", inputs=(InputSpec((2, 10), "int64", high=1000),)))
    assert loaded.inputs[0].shape == (2, 10) and loaded.inputs[0].dtype == torch.int64
    assert int(loaded.inputs[0].max()) < 1000


def test_unknown_sample():
    with pytest.raises(ModelLoadError, match="unknown sample model 'nope'"):
        load_model(ModelSpec(name="nope"))


def test_torchscript_archive(tmp_path):
    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(Tiny()), str(path))
    loaded = load_model(ModelSpec(source="torchscript", name="m.pt", path=str(path), inputs=(InputSpec((2, 4)),)))
    assert loaded.forward().shape == (2, 3)


def test_torchscript_needs_input_shapes(tmp_path):
    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(Tiny()), str(path))
    with pytest.raises(SpecError, match="declares no example inputs"):
        load_model(ModelSpec(source="torchscript", name="m.pt", path=str(path)))


def test_export_archive_uses_its_example_inputs(tmp_path):
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(Tiny(), (torch.randn(6, 4),)), str(path))
    loaded = load_model(ModelSpec(source="export", name="m.pt2", path=str(path)))
    assert loaded.inputs[0].shape == (6, 4)
    assert loaded.forward().shape == (6, 3)


@pytest.mark.parametrize("analysis,options", [
    ("validate", {}), ("summary", {}), ("gradients", {"steps": 2}),
    ("profile", {"mode": "train", "wait": 0, "warmup": 0, "active": 1, "latency_iters": 2, "latency_warmup": 0}),
    ("memory", {"timeline": False}),
])
def test_every_model_analysis_runs_on_an_export_archive(tmp_path, analysis, options):
    """ExportedProgram.module() refuses train()/eval(); the analyses call both."""
    from diagnostics.registry import ANALYSES
    from diagnostics.runner import Job, execute

    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(Tiny(), (torch.randn(6, 4),)), str(path))
    result = execute(Job(analysis, ModelSpec(source="export", name="m.pt2", path=str(path)), options),
                     tmp_path / "art")
    assert isinstance(result, ANALYSES[analysis].result or dict) and result
    if analysis == "validate":
        assert result.output_shape == [6, 3]
        assert any("keeps the train/eval mode it was exported in" in n for n in result.notes)
    if analysis == "memory":  # exported for batch 6 only: the estimate measures at that batch
        assert "measured at batch 6 itself (the model accepts no smaller batch)" in result.estimate.method


def test_an_export_archive_with_fixed_shapes_says_so(tmp_path):
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(Tiny(), (torch.randn(6, 4),)), str(path))
    loaded = load_model(ModelSpec(source="export", name="m.pt2", path=str(path), batch_size=2))
    with pytest.raises(ModelRunError, match="exported for fixed input shapes: keep the declared ones"):
        loaded.forward()


def test_an_archive_of_another_kind_is_named_with_the_kind_to_choose(tmp_path):
    ts, pt2, sd = tmp_path / "m.ts.pt", tmp_path / "m.pt2", tmp_path / "sd.pt"
    torch.jit.save(torch.jit.script(Tiny()), str(ts))
    torch.export.save(torch.export.export(Tiny(), (torch.randn(6, 4),)), str(pt2))
    torch.save(Tiny().state_dict(), sd)
    cases = [("torchscript", pt2, "m.pt2 is not a TorchScript archive (torch.jit.save): it is a torch.export archive: "
                                  "choose 'torch.export archive (.pt2)' as the file kind"),
             ("export", ts, "m.ts.pt is not a torch.export archive (.pt2): it is a TorchScript archive "
                            "(torch.jit.save): choose that file kind"),
             ("torchscript", sd, "sd.pt is not a TorchScript archive (torch.jit.save): it is a torch.save file")]
    for source, path, message in cases:
        with pytest.raises(ModelLoadError) as err:
            load_model(ModelSpec(source=source, name=path.name, path=str(path), inputs=(InputSpec((2, 4)),)))
        assert str(err.value).startswith(message)


def test_a_pickled_module_in_the_weights_slot_names_the_refused_class(tmp_path):
    from diagnostics.weights import load_state_dict_file

    path = tmp_path / "full.pt"
    torch.save(Tiny(), path)
    with pytest.raises(TrustError) as err:
        load_state_dict_file(path)
    assert "(WeightsUnpickler error: Unsupported global: GLOBAL test_intake.Tiny)" in str(err.value) or \
        "Unsupported global: GLOBAL tests.test_intake.Tiny)" in str(err.value), str(err.value)
    assert "\x1b[" not in str(err.value)


def test_truncated_and_corrupt_archives_are_named(tmp_path):
    good = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(Tiny(), (torch.randn(6, 4),)), str(good))
    cut = tmp_path / "cut.pt2"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="cut.pt2 is not a torch.export archive"):
        load_model(ModelSpec(source="export", name="cut.pt2", path=str(cut)))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"hello, not a model")
    with pytest.raises(ModelLoadError, match="junk.pt is not a TorchScript archive"):
        load_model(ModelSpec(source="torchscript", name="junk.pt", path=str(junk), inputs=(InputSpec((1, 4)),)))


PY_MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    def build_model():
        return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))

    def example_inputs():
        return (torch.randn(3, 8),)
""")


def test_python_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(PY_MODEL)
    loaded = load_model(ModelSpec(source="python", name="model.py", path=str(path)))
    assert loaded.forward().shape == (3, 2)
    assert "no loss declared" in loaded.loss_name


def test_python_file_without_build_model(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("x = 1\n")
    with pytest.raises(ModelLoadError, match="defines no build_model"):
        load_model(ModelSpec(source="python", name="model.py", path=str(path)))


def test_python_file_with_syntax_error(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("def build_model(:\n")
    with pytest.raises(ModelLoadError, match="syntax error at line 1"):
        load_model(ModelSpec(source="python", name="model.py", path=str(path)))


def test_safe_mode_refuses_python_and_pickles(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    path = tmp_path / "model.py"
    path.write_text(PY_MODEL)
    with pytest.raises(TrustError, match="server-safe mode"):
        load_model(ModelSpec(source="python", name="model.py", path=str(path)))
    with pytest.raises(TrustError, match="server-safe mode"):
        load_model(ModelSpec(source="pickle", name="m.pt", path=str(path), trust_pickle=True))


class Boom:
    """A pickle payload that writes a file when unpickled."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_pickle_needs_trust_and_never_runs_without_it(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save(Boom(str(marker)), str(path))
    with pytest.raises(TrustError, match="turn on 'I trust this file'"):
        load_model(ModelSpec(source="pickle", name="evil.pt", path=str(path)))
    assert not marker.exists()
    # As weights, the same file is read with weights_only=True: refused, payload not run.
    sd_model = tmp_path / "model.py"
    sd_model.write_text(PY_MODEL)
    with pytest.raises(TrustError, match="not a plain state_dict"):
        load_model(ModelSpec(source="python", name="model.py", path=str(sd_model), weights_path=str(path)))
    assert not marker.exists()


def test_trusted_pickle_loads(tmp_path):
    path = tmp_path / "m.pt"
    torch.save(Tiny(), str(path))
    loaded = load_model(ModelSpec(source="pickle", name="m.pt", path=str(path), trust_pickle=True,
                                  inputs=(InputSpec((2, 4)),)))
    assert loaded.forward().shape == (2, 3)


def test_weights_safetensors_and_state_dict(tmp_path):
    py = tmp_path / "model.py"
    py.write_text(PY_MODEL)
    torch.manual_seed(1)
    from torch import nn as _nn
    ref = _nn.Sequential(_nn.Linear(8, 4), _nn.ReLU(), _nn.Linear(4, 2))
    st_path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(st_path))
    loaded = load_model(ModelSpec(source="python", name="model.py", path=str(py), weights_path=str(st_path)))
    assert torch.equal(loaded.model[0].weight, ref[0].weight)
    pt_path = tmp_path / "w.pt"
    torch.save(ref.state_dict(), str(pt_path))
    loaded = load_model(ModelSpec(source="python", name="model.py", path=str(py), weights_path=str(pt_path)))
    assert torch.equal(loaded.model[2].bias, ref[2].bias)


def test_mismatched_state_dict_names_first_mismatches(tmp_path):
    py = tmp_path / "model.py"
    py.write_text(PY_MODEL)
    bad = {"0.weight": torch.zeros(5, 8), "0.bias": torch.zeros(4), "extra.weight": torch.zeros(1)}
    path = tmp_path / "w.pt"
    torch.save(bad, str(path))
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelSpec(source="python", name="model.py", path=str(py), weights_path=str(path)))
    msg = str(e.value)
    assert "missing keys (2): 2.weight, 2.bias" in msg
    assert "unexpected keys (1): extra.weight" in msg
    assert "0.weight: file [5, 8] vs model [4, 8]" in msg


def test_inputs_the_model_rejects_show_its_error():
    loaded = load_model(ModelSpec(name="mlp", inputs=(InputSpec((2, 7)),)))
    with pytest.raises(ModelRunError, match=r"rejected its inputs \(\[2, 7\] float32\).*mat1 and mat2"):
        loaded.forward()


TWO_INPUTS = """
    import torch
    from torch import nn

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 4), nn.Linear(6, 4)

        def forward(self, x, mask=None):
            return self.a(x) * mask.shape[-1] + self.b(mask)

    def build_model():
        return Two()

    def example_inputs():
        return (torch.randn(4, 8), torch.randn(4, 6))
"""


@pytest.mark.parametrize("analysis", ["summary", "profile"])
def test_a_multi_input_model_given_some_of_its_inputs_names_the_missing_one(tmp_path, analysis):
    """Only the first of two inputs entered: the model fails on the None it gets for the second
    ("'NoneType' object has no attribute 'shape'"); the error names the input that was not given."""
    from diagnostics.runner import Job, execute

    path = tmp_path / "two.py"
    path.write_text(textwrap.dedent(TWO_INPUTS))
    spec = ModelSpec(source="python", name="two.py", path=str(path), inputs=(InputSpec((4, 8)),))
    with pytest.raises(ModelRunError) as e:
        execute(Job(analysis, spec, {}), tmp_path / "out")
    msg = str(e.value)
    assert msg.startswith("the model was called without its input mask (forward's parameter 2; the model's "
                          "example_inputs() gives [4, 6] float32): 1 input entered, the model takes 2")
    assert "'NoneType' object has no attribute 'shape'" in msg  # its own error still follows


def test_a_tampered_torchscript_archive_is_refused_with_a_message(tmp_path):
    """TorchScript compile errors start with a blank line: the message must not end at 'RuntimeError: '."""
    import zipfile

    good = tmp_path / "good.ts.pt"
    torch.jit.save(torch.jit.script(Tiny()), str(good))
    bad = tmp_path / "tampered.ts.pt"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith(".py") and "code/" in item.filename:
                data = b"def forward(self, x):\n    return x +* 1\n"  # not TorchScript
            zout.writestr(item, data)
    with pytest.raises(ModelLoadError) as err:
        load_model(ModelSpec(source="torchscript", name="tampered.ts.pt", path=str(bad),
                             inputs=(InputSpec((1, 4)),)))
    msg = str(err.value)
    assert msg.startswith("tampered.ts.pt is not a loadable TorchScript archive: ")
    assert len(msg.split("RuntimeError: ", 1)[-1].strip()) > 10, msg  # the error itself, not an empty line


def test_errors_name_an_upload_as_the_user_named_it_not_as_it_is_stored(tmp_path):
    """An upload is stored as model.ts.pt / weights.pt (uploads.save_upload); errors use spec.name."""
    from diagnostics.uploads import save_upload

    path, _ = save_upload(b"not a zip at all" * 10, "torchscript", tmp_path, "my_net.pt")
    assert path.name == "model.ts.pt"
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelSpec(source="torchscript", name="my_net.pt", path=str(path), inputs=(InputSpec((2, 4)),)))
    assert str(e.value).startswith("my_net.pt is not a TorchScript archive") and "model.ts.pt" not in str(e.value)

    py, _ = save_upload(b"def build_model(:\n", "python", tmp_path, "net.py")
    with pytest.raises(ModelLoadError, match=r"^net\.py has a syntax error at line 1"):
        load_model(ModelSpec(source="python", name="net.py", path=str(py)))

    good, _ = save_upload(PY_MODEL.encode(), "python", tmp_path, "net.py")
    weights, _ = save_upload(b"\x00garbage" * 10, "weights", tmp_path, "w.safetensors")
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelSpec(source="python", name="net.py", path=str(good), weights_path=str(weights)))
    assert str(e.value).startswith("the weights file is not a valid .safetensors file")
    assert "weights.safetensors" not in str(e.value)


# ----------------------------------------------------------------------------- a .pt2 with a library's output type
EXPORT_WITH_OWN_OUTPUT = textwrap.dedent("""
    import dataclasses, sys
    import torch
    from torch import nn
    from torch.utils._pytree import register_dataclass

    @dataclasses.dataclass
    class LMOutput:  # registered here only, as transformers registers its ModelOutput classes on import
        logits: torch.Tensor

    register_dataclass(LMOutput, serialized_type_name="somelib.outputs.LMOutput")

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(50, 8), nn.Linear(8, 50)

        def forward(self, ids):
            return LMOutput(self.head(self.emb(ids)))

    torch.export.save(torch.export.export(LM(), (torch.randint(0, 50, (2, 5)),)), sys.argv[1])
""")


def _fails_to_load(path) -> str:
    with pytest.raises(ModelLoadError) as err:
        load_model(ModelSpec(source="export", name=path.name, path=str(path), inputs=(InputSpec((2, 5), "int64", high=50),)))
    return str(err.value)


def test_a_pt2_whose_output_type_is_not_registered_says_so_and_what_to_do(tmp_path):
    """torch.export.load logs the cause and raises 'check the warnings above', which a job never shows."""
    import subprocess
    import sys

    path = tmp_path / "lm.pt2"
    subprocess.run([sys.executable, "-c", EXPORT_WITH_OWN_OUTPUT, str(path)], check=True, capture_output=True)
    message = _fails_to_load(path)
    assert message.startswith("lm.pt2 is not a loadable torch.export archive (.pt2): NotImplementedError: "
                              "Deserializing somelib.outputs.LMOutput in pytree is not registered. -- what to do: "
                              "the model's inputs or outputs use a container type (here somelib.outputs.LMOutput)")
    assert "Export a wrapper whose forward returns the logits (a tensor or a tuple of tensors)" in message
    assert "warnings above" not in message


def test_a_pt2_returning_a_transformers_model_output_says_what_to_do(tmp_path):
    """Exported where transformers is imported (its ModelOutput classes registered); loaded in a fresh
    worker-like interpreter, which never imports transformers."""
    import json
    import subprocess
    import sys

    pytest.importorskip("transformers")
    from transformers.modeling_outputs import CausalLMOutput

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(50, 8), nn.Linear(8, 50)

        def forward(self, ids):
            return CausalLMOutput(logits=self.head(self.emb(ids)))

    path = tmp_path / "hf.pt2"
    torch.export.save(torch.export.export(LM(), (torch.randint(0, 50, (2, 5)),)), str(path))
    load = ("import json, sys\nfrom diagnostics.intake import load_model\nfrom diagnostics.spec import InputSpec, "
            "ModelSpec\ntry:\n    load_model(ModelSpec(source='export', name='hf.pt2', path=sys.argv[1], "
            "inputs=(InputSpec((2, 5), 'int64', high=50),)))\nexcept Exception as e:\n"
            "    print(json.dumps([type(e).__name__, str(e), 'transformers' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", load, str(path)], check=True, capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1])).stdout
    kind, message, imported = json.loads(out.strip().splitlines()[-1])
    assert kind == "ModelLoadError" and not imported
    assert ("NotImplementedError: Deserializing transformers.modeling_outputs.CausalLMOutput in pytree is not "
            "registered. -- what to do: ") in message
    assert "`return model(ids, use_cache=False).logits`" in message and "warnings above" not in message


# ----------------------------------------------------------------------------- weights named invalid at once (#30)
def sparse_safetensors(path, gib: float = 0.25):
    """A .safetensors whose header is valid and declares one F32 tensor of ``gib`` GiB, its data never
    written: a sparse file (it reads as zeros). Loading it materialised the whole tensor."""
    import json

    n = int(gib * 2**30) // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 4 * n)
    return path


def _py(folder):
    path = folder / "model.py"
    path.write_text(PY_MODEL)
    return path


@pytest.mark.timeout(60)
def test_a_sparse_weights_file_is_named_invalid_at_once(tmp_path):
    import time

    path = sparse_safetensors(tmp_path / "big.safetensors")
    spec = ModelSpec(source="python", name="net.py", path=str(_py(tmp_path)), weights_path=str(path))
    t0 = time.monotonic()
    with pytest.raises(ModelLoadError) as e:
        load_model(spec)
    assert time.monotonic() - t0 < 5  # nothing of the 256 MiB was read
    assert str(e.value) == ("big.safetensors is not a valid .safetensors file: it is sparse: 256.0 MiB long, but only "
                            "0.0 MiB of it was ever written (the rest are holes that read as zeros)")
    for name in ("zeros.pt", "zeros.safetensors"):  # `truncate -s 2G`: holes only
        with open(tmp_path / name, "wb") as f:
            f.truncate(2 << 30)
        with pytest.raises(ModelLoadError, match=rf"^{name} is not a valid .* it is sparse: 2,048.0 MiB long"):
            load_model(ModelSpec(source="python", name="net.py", path=spec.path, weights_path=str(tmp_path / name)))


def test_a_safetensors_header_that_does_not_describe_its_bytes_is_named(tmp_path):
    import json

    from diagnostics.weights import check_weights_file

    def write(name, header, data: bytes):
        raw = json.dumps(header).encode()
        (tmp_path / name).write_bytes(len(raw).to_bytes(8, "little") + raw + data)
        return tmp_path / name

    good = write("good.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
    check_weights_file(good, "good.safetensors")  # control
    cases = {
        "short.safetensors": ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8,
                              "tensor 'w' has no valid shape and data offsets within the file's 8 data bytes"),
        "shape.safetensors": ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8,
                              "tensor 'w' (F32 [3]) should take 12 bytes, its offsets give 8"),
        "tail.safetensors": ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 16,
                             "its tensors take 8 bytes but 16 follow the header"),
    }
    for name, (header, data, why) in cases.items():
        with pytest.raises(ModelLoadError) as e:
            check_weights_file(write(name, header, data), name)
        assert str(e.value) == f"{name} is not a valid .safetensors file: {why}"
    (tmp_path / "junk.pt").write_bytes(b"\0" * 64)
    with pytest.raises(ModelLoadError, match=r"^junk.pt is not a valid weights file: it is neither a torch.save "
                                             r"archive nor a safetensors file \(it starts with the bytes 00 00"):
        check_weights_file(tmp_path / "junk.pt", "junk.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    check_weights_file(tmp_path / "ok.pt", "ok.pt")  # control: torch.save's zip archive
