"""The deployment trials (diagnostics/analyses/optimize/deploy.py): ONNX Runtime and static int8 (PT2E).

Each effect is checked against an independent computation: the saved .onnx file run by a fresh
ONNX Runtime session, its size read from disk, the quantize nodes and int8 weights counted in the
converted graph, and the int8 weights dequantized by hand.
"""

import dataclasses
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn

from diagnostics.analyses.optimize.deploy import OnnxRuntimeModule, brief_error
from diagnostics.analyses.optimize.fixes import FixNotApplicable, run_fix
from diagnostics.analyses.optimize.trials import fidelity, run_trials, serialized_bytes
from diagnostics.measure.environment import environment_facts
from diagnostics.measure.structure import static_facts
from diagnostics.runner import Job, execute
from diagnostics.spec import ModelSpec
from sample_models.convnets import SmallCNN

ort = pytest.importorskip("onnxruntime")
QPT = "quantized_decomposed.quantize_per_tensor.default"  # by name: torchao registers the ops on import
DQPC = "quantized_decomposed.dequantize_per_channel.default"


def sample_cnn():
    torch.manual_seed(0)
    m = SmallCNN()
    m.train()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so folding them has something to fold
        for _ in range(3):
            m(torch.randn(8, 3, 32, 32))
    return m.eval(), (torch.randn(8, 3, 32, 32),)


def encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval(), (torch.randn(2, 10, 32),)


def ref(model, inputs):
    with torch.no_grad():
        return model(*inputs)


def cosine(a, b) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def facts(model, device="cpu"):
    return {"static": static_facts(model), "env": environment_facts(device), "forward": None}


# ----------------------------------------------------------------------------- ONNX Runtime
@pytest.mark.parametrize("build", [sample_cnn, encoder], ids=["cnn", "transformer_encoder"])
def test_onnxruntime_matches_torch_and_saves_a_real_onnx_file(build, tmp_path):
    model, x = build()
    expected = ref(model, x)
    candidate, notes = run_fix("onnxruntime", model, x)
    assert isinstance(candidate, OnnxRuntimeModule)
    assert "dynamo=True" in notes[0] and f"intra_op_num_threads={torch.get_num_threads()}" in notes[1]
    got = ref(candidate, x)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    artifact = candidate.save_to(tmp_path, "m")
    path = tmp_path / "m.onnx"
    assert artifact == {"kind": "onnx", "path": str(path)}
    assert serialized_bytes(candidate) == (os.path.getsize(path), "ONNX file")
    # the file on disk, run by a session of our own: the same numbers as the model
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (direct,) = session.run(None, {session.get_inputs()[0].name: x[0].numpy()})
    assert cosine(torch.from_numpy(direct), expected) >= 0.9999
    assert np.abs(direct - expected.numpy()).max() < 1e-4
    np.testing.assert_array_equal(direct, got.numpy())  # the trial ran that graph
    # the trial's session runs with torch's thread count, so neither side gets more cores
    assert candidate.session.get_session_options().intra_op_num_threads == torch.get_num_threads()


def test_onnxruntime_keeps_a_dict_output_and_takes_torchscript():
    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 2)

        def forward(self, x):
            return {"logits": self.a(x), "aux": self.b(x).relu()}

    torch.manual_seed(0)
    m, x = DictOut().eval(), (torch.randn(3, 8),)
    c, _ = run_fix("onnxruntime", m, x)
    out, expected = ref(c, x), ref(m, x)
    assert list(out) == ["logits", "aux"]
    for k in out:
        torch.testing.assert_close(out[k], expected[k], atol=1e-5, rtol=1e-5)

    scripted = torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval())
    c, notes = run_fix("onnxruntime", scripted, x)
    assert "dynamo=False" in notes[0] and "ScriptModule" in notes[0]
    torch.testing.assert_close(ref(c, x), ref(scripted, x), atol=1e-5, rtol=1e-5)


class Branchy(nn.Module):
    """A Python branch on a tensor's value: torch.export refuses it (the legacy exporter would freeze one side)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x) if x.sum().item() > 0 else -self.lin(x)


@dataclasses.dataclass
class Out:
    logits: torch.Tensor


class DataclassOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return Out(self.lin(x))


@pytest.mark.parametrize("model, cause, remedy", [
    (Branchy(), "could not guard on data-dependent expression", "torch.where or torch.cond"),
    (DataclassOut(), "not a known type", "wrap the model so it returns a tensor"),
], ids=["data_dependent_branch", "dataclass_output"])
def test_onnxruntime_export_failure_is_a_row_naming_cause_and_remedy(model, cause, remedy):
    x = (torch.randn(2, 4),)
    rows, _, _ = run_trials(model, x, "cpu", ["onnxruntime"], facts(model), iters=1, warmup=0)
    row = rows[-1]
    assert row["fix"] == "onnxruntime" and row["status"] == "not_applicable"
    assert row["why"].startswith("torch.export could not capture the model (")
    assert cause in row["why"].lower() and remedy in row["why"]
    assert len(row["why"]) < 450 and "\n" not in row["why"] and "tensor(" not in row["why"]


def test_onnxruntime_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    with pytest.raises(FixNotApplicable, match=r"^onnxruntime is not installed \(pip install onnxruntime\)$"):
        run_fix("onnxruntime", nn.Linear(4, 3), (torch.randn(2, 4),))


def test_brief_error_keeps_the_cause_and_drops_tensor_dumps():
    try:
        try:
            raise ValueError("bad value tensor([[1., 2.],\n [3., 4.]])\nmore lines")
        except ValueError as inner:
            raise RuntimeError("wrapper " + "x" * 500) from inner
    except RuntimeError as e:
        assert brief_error(e) == "ValueError: bad value"
    assert len(brief_error(RuntimeError("y" * 1000))) == 200


# ----------------------------------------------------------------------------- static int8 (PT2E)
def test_static_int8_quantizes_the_cnn_and_stays_close(tmp_path):
    model, x = sample_cnn()
    q, notes = run_fix("static_int8", model, x)
    gm = q.graph_module
    nodes = list(gm.graph.nodes)
    n_qpt = sum(n.op == "call_function" and str(n.target) == QPT for n in nodes)
    weighted = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    # every conv and the linear take int8 weights, and their activations are quantized first
    int8 = {k: v for k, v in gm.state_dict().items() if v.dtype == torch.int8}
    assert len(int8) == len(weighted) == 4
    assert sum(v.numel() for v in int8.values()) == sum(m.weight.numel() for m in weighted)
    assert n_qpt >= len(weighted)
    assert f"quantized: 4 of 4 conv/linear ops (3 conv2d, 1 linear); {n_qpt} quantize_per_tensor" in notes[2]
    assert "calibration: 5 batches" in notes[1] and any("3 of 3 ops folded" in n for n in notes)
    # no float copy of a weight is left: the weights are 1 byte each, plus per-channel scales and zero points
    assert not any(v.dim() >= 2 and v.is_floating_point() for v in gm.state_dict().values())
    assert serialized_bytes(q)[0] < 0.35 * serialized_bytes(model)[0]
    # the linear head (no BatchNorm folded into it): dequantizing its int8 weight by hand gives the float
    # weight back to within half a quantization step per output channel
    (node,) = [n for n in nodes if n.op == "call_function" and str(n.target) == DQPC and n.args[0].target in int8
               and int8[n.args[0].target].dim() == 2]
    w_q, scale = int8[node.args[0].target].float(), gm.get_buffer(node.args[1].target)
    err = (w_q * scale[:, None] - model.classifier.weight).abs().amax(dim=1)
    assert torch.all(err <= scale / 2 + 1e-7)
    assert cosine(ref(q, x), ref(model, x)) > 0.99
    assert fidelity(ref(model, x), ref(q, x), classifier=True)["top1_agreement"] >= 0.875
    # the artifact is a torch.export program that loads back and runs the same graph
    artifact = q.save_to(tmp_path, "q")
    assert artifact == {"kind": "pt2", "path": str(tmp_path / "q.pt2")}
    reloaded = torch.export.load(artifact["path"]).module()
    torch.testing.assert_close(ref(reloaded, x), ref(q, x))


def test_static_int8_not_applicable_without_conv_or_linear():
    m = nn.Sequential(nn.LayerNorm(8), nn.GELU())
    x = (torch.randn(4, 8),)
    rows, _, _ = run_trials(m, x, "cpu", ["static_int8"], facts(m), iters=1, warmup=0)
    assert rows[-1]["status"] == "not_applicable"
    assert rows[-1]["why"] == "no Conv / Linear layers: static int8 quantizes convolutions and linear layers"

    class UnusedLinear(nn.Module):  # a Linear that the forward never calls: the quantizer finds nothing
        def __init__(self):
            super().__init__()
            self.norm, self.unused = nn.LayerNorm(8), nn.Linear(8, 8)

        def forward(self, x):
            return self.norm(x).tanh()

    with pytest.raises(FixNotApplicable, match=r"found no convolution or linear op to quantize in the captured "
                                                r"graph \(none is called in the forward\)"):
        run_fix("static_int8", UnusedLinear().eval(), x)


def test_static_int8_capture_failure_names_the_line():
    with pytest.raises(FixNotApplicable, match=r"could not capture the model \(GuardOnDataDependentSymNode: .*"
                                                r"test_deploy\.py:\d+ in forward\].*torch\.where or torch\.cond"):
        run_fix("static_int8", Branchy().eval(), (torch.randn(2, 4),))


# ----------------------------------------------------------------------------- the optimize analysis
def test_optimize_runs_both_deployment_trials_on_the_cnn(tmp_path):
    r = execute(Job("optimize", ModelSpec(name="cnn"), {"fixes": ["onnxruntime", "static_int8"], "iters": 3,
                                                        "warmup": 1}), tmp_path)
    rows = {row.fix: row for row in r.rows}
    assert list(rows) == ["baseline", "control", "onnxruntime", "static_int8"]
    assert all(row.status == "ok" for row in rows.values()), [row.why for row in rows.values()]
    onnx_row, q_row = rows["onnxruntime"], rows["static_int8"]
    assert onnx_row.cosine >= 0.9999 and onnx_row.max_abs_err < 1e-4 and onnx_row.top1_agreement == 1.0
    assert q_row.cosine > 0.99 and q_row.size_ratio < 0.35
    onnx_file = tmp_path / "optimized_onnxruntime.onnx"
    assert onnx_row.artifact.path == str(onnx_file)
    assert onnx_row.size_bytes == os.path.getsize(onnx_file) and onnx_row.size_kind == "ONNX file"
    assert q_row.artifact.kind == "pt2" and (tmp_path / "optimized_static_int8.pt2").exists()
    assert all(row.median_ms > 0 for row in rows.values())
    # ONNX Runtime allocates outside torch: its peak is "not counted" (None), never a silent 0
    assert onnx_row.peak_bytes is None and q_row.peak_bytes is not None
