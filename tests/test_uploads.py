"""What an uploaded model file is, told from its contents (diagnostics.uploads.detect_kind), and an
explicit kind the contents contradict named in the error: real files written by torch, not guesses."""

import io
import json

import pytest
import torch
from torch import nn

from diagnostics.errors import ModelLoadError
from diagnostics.uploads import check_kind, detect_kind, save_upload

PY = b"import torch\nfrom torch import nn\n\ndef build_model():\n    return nn.Linear(4, 2)\n"


def _bytes(write) -> bytes:
    buf = io.BytesIO()
    write(buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def files():
    m, x = nn.Linear(4, 2).eval(), torch.randn(1, 4)
    from safetensors.torch import save

    return {
        "torchscript": _bytes(lambda f: torch.jit.save(torch.jit.script(m), f)),
        "export": _bytes(lambda f: torch.export.save(torch.export.export(m, (x,)), f)),
        "pickle": _bytes(lambda f: torch.save(m, f)),  # the zip format torch.save writes
        "legacy": _bytes(lambda f: torch.save(m, f, _use_new_zipfile_serialization=False)),
        "python": PY,
        "safetensors": save(m.state_dict()),
        "config": json.dumps({"model_type": "gpt2", "n_layer": 2}).encode(),
    }


@pytest.mark.parametrize("kind", ["torchscript", "export", "pickle", "python"])
def test_each_kind_is_told_from_its_contents_whatever_its_name(files, kind):
    for name in (f"model.{ {'torchscript': 'pt', 'export': 'pt2', 'pickle': 'pt', 'python': 'py'}[kind]}", "upload.bin"):
        assert detect_kind(files[kind], name) == kind, name
    assert detect_kind(files["legacy"], "old.pt") == "pickle"  # the pre-zip torch.save format


def test_detection_reads_a_path_too(files, tmp_path):
    path = tmp_path / "net.pt"
    path.write_bytes(files["torchscript"])
    assert detect_kind(path, "net.pt") == "torchscript"


@pytest.mark.parametrize("what, message", [
    ("safetensors", "w.safetensors is a safetensors weights file, not a model: it goes in the weights slot"),
    ("config", "w.json is a JSON file, not a model: a transformers config.json is built under Source → Hugging "
               "Face config"),
])
def test_files_that_are_not_models_say_where_they_go(files, what, message):
    name = "w.safetensors" if what == "safetensors" else "w.json"
    with pytest.raises(ModelLoadError) as e:
        detect_kind(files[what], name)
    assert str(e.value).startswith(message)


def test_a_file_of_no_kind_says_so():
    with pytest.raises(ModelLoadError, match=r"^cannot tell what kind of model blob\.pt is"):
        detect_kind(bytes(range(256)) * 4, "blob.pt")


def test_a_wrong_explicit_kind_names_what_the_file_is(files, tmp_path):
    """The old default (TorchScript) refused a .py upload with 'a torchscript model file should end in .pt';
    now the error says what the file is and which kind to choose."""
    with pytest.raises(ModelLoadError) as e:
        save_upload(files["python"], "torchscript", tmp_path, "net.py")
    assert str(e.value) == ("net.py is a Python file, not a TorchScript archive (torch.jit.save): choose the file "
                            "kind 'Python file with build_model() and example_inputs()' (or 'Detect from the file')")
    with pytest.raises(ModelLoadError, match=r"^net\.pt is a torch\.export archive \(\.pt2\), not a TorchScript"):
        check_kind(files["export"], "net.pt", "torchscript")
    # the right kind, whatever the extension: stored under our own name for that kind
    path, _ = save_upload(files["export"], "export", tmp_path, "net.pt")
    assert path.name == "model.pt2"
