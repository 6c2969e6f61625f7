"""Hostile input: code-running pickles, server-safe mode, upload sizes and names, broken traces."""

import gzip
import json
import tomllib
from pathlib import Path

import pytest
import torch

from diagnostics import ModelSpec
from diagnostics.errors import ModelLoadError, TorchScopeError, TrustError
from diagnostics.intake import load_model
from diagnostics.weights import load_state_dict_file
from diagnostics.runner import Job, run_job
from diagnostics.store import Store
from diagnostics.uploads import DEFAULT_MAX_UPLOAD_MB, save_upload
from reliability_helpers import GOOD_MODEL

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling this writes a file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def evil_file(folder: Path, marker: Path) -> Path:
    path = folder / "evil.pt"
    torch.save(Payload(marker), path)
    return path


# ------------------------------------------------------------------------------------ pickles
def test_the_payload_really_runs_code_when_trusted(tmp_path):
    """Control: without this, 'no marker file' below would prove nothing."""
    marker = tmp_path / "pwned"
    with pytest.raises(ModelLoadError, match="holds a NoneType, not an nn.Module"):
        load_model(ModelSpec(source="pickle", name="evil.pt", path=str(evil_file(tmp_path, marker)),
                             trust_pickle=True))
    assert marker.read_text() == "pwned"


@pytest.mark.parametrize("source", ["pickle", "torchscript", "export"])
def test_a_crafted_pickle_never_runs_without_the_trust_switch(tmp_path, source):
    marker = tmp_path / "pwned"
    with pytest.raises(ModelLoadError) as err:
        load_model(ModelSpec(source=source, name="evil.pt", path=str(evil_file(tmp_path, marker))))
    if source == "pickle":
        assert isinstance(err.value, TrustError)
        assert "can run arbitrary code" in str(err.value) and "I trust this file" in str(err.value)
    else:  # recognised as a torch.save file before any reader touches it
        what = "TorchScript archive (torch.jit.save)" if source == "torchscript" else "torch.export archive (.pt2)"
        assert str(err.value).startswith(f"evil.pt is not a {what}: it is a torch.save file: a state_dict goes "
                                         "in the weights slot")
    assert not marker.exists()


def evil_pt2(folder: Path, marker: Path) -> Path:
    """A real torch.export archive whose sample inputs are a code-running pickle (weights-only
    loading rejects it, and torch.export.load then retries with weights_only=False)."""
    import io
    import zipfile

    good = folder / "good.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),)), good)
    payload = io.BytesIO()
    torch.save(((Payload(marker),), {}), payload)
    evil = folder / "evil.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(evil, "w") as out:
        for info in src.infolist():
            data = src.read(info.filename)
            out.writestr(info.filename, payload.getvalue() if info.filename.endswith("sample_inputs/model.pt") else data)
    return evil


def test_a_pt2_archive_with_a_code_running_pickle_never_runs_it(tmp_path):
    control = tmp_path / "control"
    try:  # control: torch's own loader runs the payload, so the check below means something
        torch.export.load(evil_pt2(tmp_path, control))
    except Exception:
        pass
    assert control.read_text() == "pwned"
    marker = tmp_path / "pwned"
    with pytest.raises(TrustError, match="evil.pt2 carries pickled objects .* that a weights-only load refuses"):
        load_model(ModelSpec(source="export", name="evil.pt2", path=str(evil_pt2(tmp_path, marker))))
    assert not marker.exists()
    # The guard is lifted afterwards: a clean archive still loads, with its example inputs.
    loaded = load_model(ModelSpec(source="export", name="good.pt2", path=str(tmp_path / "good.pt2")))
    assert loaded.inputs[0].shape == (3, 4)
    import os
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ


def test_pt2_opaque_objects_are_refused_while_loading():
    """torch.export's reader unpickles opaque constants with plain pickle.loads: refused under the guard."""
    import pickle

    from torch.export.pt2_archive import _package

    from diagnostics.intake import _no_code_in_pickles

    if not hasattr(_package, "pickle"):
        pytest.skip("this torch's .pt2 reader does not unpickle opaque objects with plain pickle")
    with _no_code_in_pickles(), pytest.raises(Exception, match="opaque pickled object"):
        _package.pickle.loads(pickle.dumps(1))
    assert _package.pickle is pickle


def test_a_crafted_pickle_in_the_weights_slot_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(TrustError, match="not a plain state_dict: loading it would run pickled code"):
        load_state_dict_file(evil_file(tmp_path, marker))
    assert not marker.exists()


def test_a_crafted_pickle_uploaded_through_the_dashboard_path_never_runs(tmp_path):
    """What the sidebar does: save_upload, then a validate job in a worker, trust switch off."""
    marker = tmp_path / "pwned"
    store = Store(tmp_path / "data")
    data = evil_file(tmp_path, marker).read_bytes()
    path, digest = save_upload(data, "pickle", store.data_dir, "evil.pt")
    (tmp_path / "evil.pt").unlink()
    spec = ModelSpec(source="pickle", name="evil.pt", path=str(path), file_sha256=digest, trust_pickle=False)
    out = run_job(Job("validate", spec), store=store, timeout_s=60)
    assert out.status == "error" and out.error_type == "TrustError"
    assert "can run arbitrary code when loaded" in out.error
    assert not marker.exists()
    assert store.get(out.run_id).status == "error"


# ------------------------------------------------------------------------------ server-safe mode
def test_safe_mode_refuses_python_files_and_pickles_even_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    marker = tmp_path / "pwned"
    py = tmp_path / "model.py"
    py.write_text(GOOD_MODEL + f"\nopen({str(marker)!r}, 'w').write('imported')\n")
    with pytest.raises(TrustError, match="Python-file models are disabled on this server"):
        load_model(ModelSpec(source="python", name="model.py", path=str(py)))
    with pytest.raises(TrustError, match="pickled modules are disabled on this server"):
        load_model(ModelSpec(source="pickle", name="evil.pt", path=str(evil_file(tmp_path, marker)),
                             trust_pickle=True))
    assert not marker.exists()


def _upload_kinds(new_app, monkeypatch, safe: bool) -> tuple[list, list]:
    if safe:
        monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    else:
        monkeypatch.delenv("TORCHSCOPE_SAFE_MODE", raising=False)
    at = new_app()
    at.run()
    at.sidebar.radio(key="sb_source").set_value("Upload a file").run()
    assert not at.exception
    return list(at.sidebar.selectbox(key="sb_upload_kind").options), [c.value for c in at.sidebar.caption]


def test_safe_mode_hides_python_and_pickle_uploads_in_the_sidebar(new_app, monkeypatch):
    kinds, captions = _upload_kinds(new_app, monkeypatch, safe=False)
    # 'Detect from the file' and the four kinds
    assert len(kinds) == 5 and any("Python file" in k for k in kinds) and any("Pickled" in k for k in kinds)
    kinds, captions = _upload_kinds(new_app, monkeypatch, safe=True)
    assert len(kinds) == 3 and kinds[0] == "Detect from the file"
    assert not any("Python" in k or "ickle" in k for k in kinds), kinds
    assert any("Server-safe mode" in c for c in captions)


def test_safe_mode_reads_no_server_path_outside_the_data_folder(tmp_path, monkeypatch):
    """Trace and per-rank-folder jobs take a path; in safe mode only the data folder is readable,
    and the Distributed page stops offering a folder at all."""
    data = tmp_path / "data"
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(data))
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "t.json").write_text('{"traceEvents": []}')
    refused = "reading a {} from a path on the server is disabled in server-safe mode; upload it instead"
    out = run_job(Job("trace", None, {"path": str(outside / "t.json")}), artifact_dir=tmp_path / "a")
    assert out.status == "error" and out.error == refused.format("trace")
    out = run_job(Job("distributed_traces", None, {"trace_dir": str(outside)}), artifact_dir=tmp_path / "b")
    assert out.status == "error" and out.error == refused.format("trace folder")
    # A path that climbs out of the data folder is resolved first, so it is refused too.
    sneaky = data / ".." / "elsewhere" / "t.json"
    out = run_job(Job("trace", None, {"path": str(sneaky)}), artifact_dir=tmp_path / "c")
    assert out.error == refused.format("trace")
    # Inside the data folder (uploads, stored runs) the same job reads the file.
    (data / "uploads").mkdir(parents=True)
    inside = data / "uploads" / "t.json"
    inside.write_text((ROOT / "tests/data/traces/gpu_small.json").read_text())
    out = run_job(Job("trace", None, {"path": str(inside)}), artifact_dir=tmp_path / "d")
    assert out.ok, out.error


def test_safe_mode_distributed_page_offers_no_folder(new_app, monkeypatch):
    monkeypatch.delenv("TORCHSCOPE_SAFE_MODE", raising=False)
    for safe, expected in ((False, 2), (True, 1)):
        if safe:
            monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
        at = new_app().run()
        at.switch_page("pages/distributed.py").run()
        assert not at.exception
        assert len(at.radio(key="dist_mode").options) == expected


@pytest.mark.parametrize("name,value,message", [
    ("TORCHSCOPE_WORKER_MEMORY_MB", "lots", "the environment variable TORCHSCOPE_WORKER_MEMORY_MB='lots' is not a number"),
    ("TORCHSCOPE_JOB_TIMEOUT_S", "-5", "the environment variable TORCHSCOPE_JOB_TIMEOUT_S='-5' must be above 0"),
])
def test_a_malformed_setting_fails_the_job_with_its_name(tmp_path, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    store = Store(tmp_path)
    out = run_job(Job("summary", ModelSpec(name="mlp")), store=store)
    assert out.status == "error" and out.error == message
    assert store.list() == []  # nothing half-written


def test_a_malformed_upload_limit_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_MAX_UPLOAD_MB", "1 GB")
    with pytest.raises(TorchScopeError, match="TORCHSCOPE_MAX_UPLOAD_MB='1 GB' is not a number"):
        save_upload(b"x", "torchscript", tmp_path, "m.pt")


# ------------------------------------------------------------------------------------- uploads
def test_upload_size_limit_has_a_clear_message_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_MAX_UPLOAD_MB", "1")
    with pytest.raises(ModelLoadError) as err:
        save_upload(b"x" * (2 * 2**20 + 1), "torchscript", tmp_path, "big.pt")
    assert str(err.value) == ("the file 'big.pt' is 2.0 MiB, over the upload limit of 1 MiB "
                              "(set TORCHSCOPE_MAX_UPLOAD_MB to change it)")
    with pytest.raises(ModelLoadError, match=r"the file 'empty.pt' is empty \(0 bytes\)"):
        save_upload(b"", "torchscript", tmp_path, "empty.pt")
    assert not (tmp_path / "uploads").exists() or not any((tmp_path / "uploads").rglob("*.pt"))
    path, _ = save_upload(b"x" * 2**20, "torchscript", tmp_path, "fits.pt")  # exactly the limit
    assert path.stat().st_size == 2**20


def test_streamlit_upload_limit_matches_ours():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["maxUploadSize"] == DEFAULT_MAX_UPLOAD_MB


@pytest.mark.parametrize("name", ["../../etc/passwd.py", "/etc/passwd.py", "..\\..\\evil.py", "a/../../../b.py",
                                  "evil\x00.py", "x" * 5000 + ".py", "~/.bashrc.py", ".py", ""])
def test_uploaded_file_names_never_become_paths(tmp_path, name):
    data_dir = tmp_path / "data"
    path, digest = save_upload(b"print('hi')\n", "python", data_dir, name)
    uploads = (data_dir / "uploads").resolve()
    assert path.resolve().parent.parent == uploads
    assert path.name == "model.py" and path.parent.name == digest[:32]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["model.py"]


def test_upload_kind_and_extension_are_checked(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown upload kind '../x'"):
        save_upload(b"x", "../x", tmp_path, "m.py")
    with pytest.raises(ModelLoadError, match=r"run\.sh does not look like a Python file \(no import, def or class"):
        save_upload(b"x", "python", tmp_path, "run.sh")
    with pytest.raises(ModelLoadError, match="weights must be .safetensors or a state_dict"):
        save_upload(b"x", "weights", tmp_path, "w.pkl")


# -------------------------------------------------------------------------------------- traces
def _event(i: int) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5}


def _trace_bytes(n: int = 2000) -> bytes:
    return json.dumps({"traceEvents": [_event(i) for i in range(n)]}).encode()


def _load(tmp_path, name: str, data: bytes, **kwargs):
    from diagnostics.trace import load_trace

    path = tmp_path / name
    path.write_bytes(data)
    return load_trace(path, **kwargs)


@pytest.mark.timeout(30)
def test_truncated_traces_are_refused_clearly_or_kept_up_to_the_cut(tmp_path):
    from diagnostics.trace import TraceError

    data = _trace_bytes()
    with pytest.raises(TraceError, match="truncated"):
        _load(tmp_path, "cut.json", data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated"):
        gz = gzip.compress(data)
        _load(tmp_path, "cut.json.gz", gz[: len(gz) // 2])
    kept = _load(tmp_path, "cut.json", data[: len(data) // 2], allow_truncated=True)
    assert 0 < len(kept.events) < 2000 and kept.warnings


@pytest.mark.timeout(30)
def test_huge_numbers_are_skipped_and_counted(tmp_path):
    good = json.dumps([_event(1), _event(2)]).encode()[1:-1]
    data = (b'{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":' + b"9" * 100_000 + b',"dur":1},'
            b'{"ph":"X","name":"b","pid":1,"tid":1,"ts":1e999,"dur":-1e999},' + good + b"]}")
    trace = _load(tmp_path, "huge.json", data)
    assert len(trace.events) == 2 and trace.skipped_events == 2
    assert any("out of range" in w for w in trace.warnings)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("data", [bytes(range(256)) * 100, _trace_bytes().decode().encode("utf-16")],
                         ids=["binary", "utf16"])
def test_binary_and_utf16_files_are_refused_clearly(tmp_path, data):
    from diagnostics.trace import TraceError

    with pytest.raises(TraceError, match="not a JSON trace"):
        _load(tmp_path, "bad.json", data)


@pytest.mark.timeout(30)
def test_deeply_nested_json_is_an_error_or_a_skipped_event(tmp_path):
    from diagnostics.trace import TraceError

    good = json.dumps([_event(1), _event(2)]).encode()[1:-1]
    nested = b'{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1,"args":{"x":' + b"[" * 5000 + b"]" * 5000 + b"}}"
    try:
        trace = _load(tmp_path, "deep.json", b'{"traceEvents":[' + nested + b"," + good + b"]}")
    except TraceError as e:
        assert "nested" in str(e) or "deep" in str(e)
    else:
        if trace.skipped_events:  # too deep for the decoder: skipped, and said so
            assert len(trace.events) == 2 and trace.skipped_events == 1
            assert any("nested deeper" in w for w in trace.warnings)
        else:  # Python 3.12's decoder reads 5000 levels: the event is kept whole
            assert len(trace.events) == 3 and "a" in set(trace.events["name"].astype(str))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("decoder", ["installed", "raises UnicodeDecodeError", "raises DecodeError"])
def test_names_that_are_not_utf8_are_kept_with_their_bad_bytes_replaced(tmp_path, monkeypatch, decoder):
    """The event is kept, its bad byte replaced by U+FFFD, and a warning says so, whichever way the
    installed msgspec reports bad UTF-8 (the msgspec this test was written with raised UnicodeDecodeError;
    0.23, which a fresh install resolved, raises DecodeError("Invalid UTF-8 encoded string")): a fresh
    install resolved a newer msgspec and the event was skipped instead (issue 45, item 8)."""
    import msgspec

    import diagnostics.trace._chunks as chunks

    if decoder != "installed":
        strict = chunks._decode_event

        def old_or_new(raw):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if decoder == "raises UnicodeDecodeError":
                    raise e
                raise msgspec.DecodeError("Invalid UTF-8 encoded string") from None
            return strict(raw)

        monkeypatch.setattr(chunks, "_decode_event", old_or_new)
    data = (b'{"traceEvents":[' + json.dumps(_event(1)).encode()
            + b',{"ph":"X","name":"caf\xe9","pid":1,"tid":1,"ts":30,"dur":1}]}')
    trace = _load(tmp_path, "latin1.json", data)
    assert sorted(trace.events["name"].astype(str)) == ["caf\ufffd", "op1"]
    assert any("not UTF-8" in w and "replaced" in w for w in trace.warnings), trace.warnings
