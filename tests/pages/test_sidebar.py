"""AppTest of the shared sidebar: uploads' input descriptions, the inputs editor, and failed runs
that stay failed (shown again, not re-run) until the user asks for another try."""

import textwrap

import pytest

from diagnostics import ModelSpec
from diagnostics.analyses.validate import ValidateMetrics, ValidateResult
from diagnostics.errors import TorchScopeError
from diagnostics.results import ModelInput
from diagnostics.runner import Job, run_job
from diagnostics.spec import InputSpec
from diagnostics.store import Store
from ui import state
from ui.background import manager as ui_manager
from ui.sidebar import parse_inputs

PACKED = textwrap.dedent("""
    import torch
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence

    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(4, 8, batch_first=True)

        def forward(self, x, lengths):  # lengths must be sorted, longest first
            _, (h, _) = self.rnn(pack_padded_sequence(x, lengths.cpu(), batch_first=True))
            return h[-1]

    def build_model():
        return Packed()

    def example_inputs():
        return (torch.randn(4, 5, 4), torch.tensor([5, 4, 3, 2]))
""")


def test_upload_shapes_take_a_dtype_each_and_an_integer_range():
    assert parse_inputs("8,3,32,32 ; 8,16:int64", "float32", 100) == (
        InputSpec((8, 3, 32, 32), "float32"), InputSpec((8, 16), "int64", 100))
    assert parse_inputs("  ", "float32", 100) is None
    with pytest.raises(TorchScopeError, match=r"^input dtype 'int8' in '8,16:int8': choose one of float32"):
        parse_inputs("8,16:int8", "float32", 100)
    with pytest.raises(TorchScopeError, match=r"^input shape '8,a': dimensions must be positive integers separated"):
        parse_inputs("8,a", "float32", 100)
    # the CLI's --input grammar, HIGH included: one grammar wherever inputs are typed
    assert parse_inputs("8x16:int32:7", "float32", 100) == (InputSpec((8, 16), "int32", 7),)


def _uploaded(at, spec: ModelSpec, check):
    """What a successful 'Load model' leaves in the session (AppTest cannot drive a file uploader): the spec
    and the load check's typed result."""
    at.session_state["sb_source"] = "Upload a file"
    at.session_state[state.MODEL_INFO] = {"spec": spec.to_dict(), "check": check}
    return at


def test_an_upload_left_as_declared_runs_on_its_own_example_values(new_app, tmp_path):
    py = tmp_path / "packed.py"
    py.write_text(PACKED)
    spec = ModelSpec(source="python", name="packed.py", path=str(py), file_sha256="packed")
    validated = run_job(Job("validate", spec), artifact_dir=tmp_path / "v")
    assert validated.ok, validated.error
    at = _uploaded(new_app(), spec, validated.result).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert at.session_state[state.SPEC].inputs is None  # the file's own example inputs
    assert at.metric[0].label == "Parameters"
    # Random lengths would not be sorted: the model's error shows once the user asks for them.
    at.sidebar.text_input(key="sb_shape_python-packed.py-packed_0").set_value("6,4").run()
    assert at.session_state[state.SPEC].inputs[0].shape == (4, 6, 4)
    assert any("sorted in decreasing order" in e.value for e in at.error)


def test_a_scalar_first_input_has_no_batch_size(new_app, tmp_path):
    spec = ModelSpec(source="python", name="scalar.py", path=str(tmp_path / "scalar.py"), file_sha256="s")
    check = ValidateResult(model="scalar.py", model_type="Scalar", output_shape=[], loss="mse", notes=(),
                           inputs=(ModelInput(shape=(), dtype="float32", high=None),),
                           metrics=ValidateMetrics(output_nan=0, output_inf=0, output_elements=1))
    at = _uploaded(new_app(), spec, check).run(timeout=30)
    assert not at.exception, [e.value for e in at.exception]
    assert any("scalar, so there is no batch size" in c.value for c in at.sidebar.caption)
    assert not [n for n in at.sidebar.number_input if n.label == "Batch size"]


def test_integer_inputs_have_an_editable_range(new_app):
    at = new_app().run()
    at.sidebar.selectbox(key="sb_sample").set_value("transformer").run()
    high = at.sidebar.number_input(key="sb_high_sample-transformer-_0")
    declared = high.value
    assert declared > 1 and at.session_state[state.SPEC].inputs is None
    high.set_value(7).run()
    assert at.session_state[state.SPEC].inputs[0].high == 7


def test_a_failed_run_is_shown_again_not_rerun_until_asked(new_app):
    store = Store()

    def failures() -> int:
        return sum(1 for r in store.list(limit=10_000) if r.analysis == "summary" and r.status == "error"
                   and r.model_label == "mlp (sample)")

    before = failures()
    at = new_app().run()
    at.sidebar.selectbox(key="sb_sample").set_value("mlp").run()
    at.sidebar.selectbox(key="sb_dtype_sample-mlp-_0").set_value("bool").run()
    assert any("the model rejected its inputs" in e.value for e in at.error)
    assert failures() == before + 1
    at.run()
    at.run()
    assert failures() == before + 1  # reruns show the stored error
    assert any("the model rejected its inputs" in e.value for e in at.error)
    assert any("last attempt's error" in c.value for c in at.caption)
    at.button[0].click().run()  # Recompute: one more try
    assert failures() == before + 2


def test_a_failed_upload_names_the_users_file_and_leaves_no_progress_panel(new_app):
    at = new_app(follow_jobs=False).run()
    at.sidebar.radio(key="sb_source").set_value("Upload a file").run()
    at.sidebar.selectbox(key="sb_upload_kind").set_value("torchscript")
    at.sidebar.text_input(key="sb_upload_shapes").set_value("2,4")
    at.sidebar.file_uploader(key="sb_upload_model").upload("my_net.pt", b"not a TorchScript archive" * 4).run()
    at.sidebar.button(key="sb_load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    # While the worker checks it: a panel in the sidebar, and the previous model stays.
    assert [s.label.split(": ")[0] for s in at.sidebar.status] == ["Loading my_net.pt"]
    assert ui_manager().wait(at.session_state[state.SESSION_ID], 120)
    at.run()  # the panel's refresh once the job ended
    errors = [e.value for e in at.sidebar.error]
    assert errors == ["my_net.pt is not a TorchScript archive (torch.jit.save): it is not a zip archive (corrupt or "
                      "wrong kind of file)"], errors
    assert "model.ts.pt" not in errors[0]
    assert not at.sidebar.status and not [b for b in at.sidebar.button if b.label == "Cancel"]
    assert at.session_state[state.SPEC].source == "sample"  # the previous model stays


NET_PY = textwrap.dedent("""
    import torch
    from torch import nn

    def build_model():
        return nn.Linear(4, 2)

    def example_inputs():
        return (torch.randn(3, 4),)
""").encode()


def _load(at, name: str, data: bytes, kind: str | None = None):
    at.sidebar.radio(key="sb_source").set_value("Upload a file").run()
    if kind is None:
        assert at.sidebar.selectbox(key="sb_upload_kind").value == "auto"  # the default: detect from the file
    else:
        at.sidebar.selectbox(key="sb_upload_kind").set_value(kind)
    at.sidebar.file_uploader(key="sb_upload_model").upload(name, data).run()
    at.sidebar.button(key="sb_load").click().run()
    assert ui_manager().wait(at.session_state[state.SESSION_ID], 120)
    return at.run()


def test_a_python_upload_loads_by_default_and_a_failed_one_never_reads_as_loaded(new_app):
    """The file kind defaulted to TorchScript and refused a .py upload; it is detected from the file now.
    A later upload that fails shows its error and no green 'Loaded': the pages keep the earlier model."""
    at = new_app(follow_jobs=False).run()
    at = _load(at, "net.py", NET_PY)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.sidebar.error, [e.value for e in at.sidebar.error]
    assert [s.value for s in at.sidebar.success] == ["Loaded net.py (Linear)"]
    assert at.session_state[state.SPEC].source == "python"

    at = _load(at, "broken.py", b"import torch\ndef build_model(:\n")
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1 and errors[0].startswith("broken.py has a syntax error at line 2"), errors
    assert not at.sidebar.success  # no "Loaded ..." beside the failure
    assert any(i.value == "Not loaded; the pages keep using net.py (Linear), loaded before." for i in at.sidebar.info)
    assert at.session_state[state.SPEC].name == "net.py"


def test_a_wrong_explicit_file_kind_is_named(new_app):
    at = _load(new_app(follow_jobs=False).run(), "net.py", NET_PY, kind="torchscript")
    assert [e.value for e in at.sidebar.error] == [
        "net.py is a Python file, not a TorchScript archive (torch.jit.save): choose the file kind 'Python file with "
        "build_model() and example_inputs()' (or 'Detect from the file')"]
