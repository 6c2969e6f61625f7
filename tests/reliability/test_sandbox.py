"""The job sandbox and the graph-op check: what an uploaded model may and may not touch.

Models run through the real runner (spawned, sandboxed worker) with a real store. TorchScript
models are scripted here from classes whose target path is an attribute; Python-file models probe
the sandbox from their forward and report what each attempt gave. Each refusal has a control run
with the sandbox off (TORCHSCOPE_SANDBOX=0), where the same attempt succeeds.
"""

import re
import socket
import threading
from pathlib import Path
from typing import Tuple

import pytest
import torch
from torch import nn

from diagnostics import ModelSpec, sandbox
from diagnostics.errors import TrustError
from diagnostics.graph_ops import check_exported, check_torchscript, exported_ops, torchscript_ops
from diagnostics.runner import Job, run_job
from diagnostics.store import Store
from reliability_helpers import MODES, assert_intact, good_spec, model_file, python_spec, snapshot, use_mode

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not sandbox.probe().ok, reason=f"no job sandbox here: {sandbox.probe().reason}")]


class SaveTo(nn.Module):
    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def forward(self, x):
        torch.save(x, self.path)
        return x * 2


class ReadFrom(nn.Module):
    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def forward(self, x):
        t = torch.from_file(self.path, False, 16, dtype=torch.uint8)
        return x + t.sum().float()


class Nested(nn.Module):
    """aten::save only inside a loop inside a branch, in an exported (non-forward) method of a submodule."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def forward(self, x):
        return x + 1

    @torch.jit.export
    def dump(self, x):
        if bool(x.sum() > 0):
            for _ in range(2):
                torch.save(x, self.path)
        return x


class Outer(nn.Module):
    def __init__(self, path: str):
        super().__init__()
        self.inner = Nested(path)

    def forward(self, x):
        return self.inner(x)


def ts_spec(folder, module, name="model.ts.pt") -> ModelSpec:
    """A TorchScript archive of ``module`` taking one [2, 4] input (TorchScript declares no inputs)."""
    from diagnostics.spec import InputSpec

    path = folder / name
    torch.jit.save(torch.jit.script(module), str(path))
    return ModelSpec(source="torchscript", name=name, path=str(path), inputs=(InputSpec((2, 4)),))


def make_world(folder) -> dict:
    """A store holding one successful and one failed run, and a folder for models and targets."""
    store = Store(folder / "data")
    first = run_job(Job("validate", good_spec(folder)), store=store, timeout_s=120)
    assert first.ok, first.error
    rid = store.create_run("summary", spec=None, options={}, cache_key="k", model_label="old", device="cpu")
    store.finish_run(rid, "error", error="an old failure")
    return {"store": store, "folder": folder}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One world for the module (its first run is a worker start: ~6 s a test under load). Each test compares
    the store with its own snapshot taken before its job, and clears the targets it checks; a test that
    breaks the store on purpose makes a world of its own (make_world)."""
    return make_world(tmp_path_factory.mktemp("world"))


def validate(world, spec, **kwargs):
    return run_job(Job("validate", spec), store=world["store"], timeout_s=120, **kwargs)


# ------------------------------------------------------------------------------ safe mode: the op check
def test_safe_mode_torchscript_that_saves_to_a_path_writes_nothing_and_names_the_op(world, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    target = world["folder"] / "pwned.pt"
    target.unlink(missing_ok=True)
    before = snapshot(world["store"])
    out = validate(world, ts_spec(world["folder"], SaveTo(str(target))))
    assert out.status == "error"
    assert out.error.startswith("model.ts.pt calls aten::save (writes a file) in SaveTo.forward; server-safe mode "
                                "refuses"), out.error
    assert not target.exists()
    assert_intact(world["store"], before)


def test_safe_mode_torchscript_that_reads_etc_passwd_fails(world, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    out = validate(world, ts_spec(world["folder"], ReadFrom("/etc/passwd")))
    assert out.status == "error"
    assert "calls aten::from_file (reads a file) in ReadFrom.forward" in out.error
    assert "root:" not in out.error + out.log_tail


def test_safe_mode_torchscript_aimed_at_the_store_leaves_every_run_intact(world, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    store = world["store"]
    before = snapshot(store)
    digest = store.db_path.read_bytes()
    out = validate(world, ts_spec(world["folder"], SaveTo(str(store.db_path))))
    assert out.status == "error" and "aten::save" in out.error
    assert_intact(store, before)
    fresh = Store(store.data_dir)
    assert fresh.notices == [] and fresh.count() == len(before) + 1  # + the refused run itself
    assert store.db_path.read_bytes()[:16] == digest[:16] == b"SQLite format 3\x00"


def test_the_op_check_looks_into_submodules_other_methods_and_nested_blocks(tmp_path):
    module = torch.jit.script(Outer(str(tmp_path / "x")))
    ops = torchscript_ops(module)
    assert ops["aten::save"] == "Nested (inner).dump"
    with pytest.raises(TrustError, match=r"m.pt calls aten::save \(writes a file\) in Nested \(inner\).dump"):
        check_torchscript(module, "m.pt")
    check_torchscript(torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.ReLU())), "clean.pt")  # no error

    @torch.jit.script
    def reader(x):
        return torch.from_file("/etc/passwd", False, 4, dtype=torch.uint8).float().sum() + x

    class Forks(nn.Module):  # the read sits in a function called from a fork's subgraph
        def forward(self, x):
            fut = torch.jit.fork(reader, x)
            return torch.jit.wait(fut)

    with pytest.raises(TrustError, match=r"calls aten::from_file \(reads a file\) in Forks.forward"):
        check_torchscript(torch.jit.script(Forks()), "f.pt")


def crafted_pt2(folder, path: str):
    """A .pt2 whose graph reads ``path`` with aten::from_file (torch.export refuses to trace that op,
    so the node is rewritten after export, as a crafted upload would be)."""

    class Full(nn.Module):
        def forward(self, x):
            return x + torch.ops.aten.full.default([16], 1, dtype=torch.uint8).sum().float()

    ep = torch.export.export(Full(), (torch.ones(2, 4),))
    for node in ep.graph.nodes:
        if node.target is torch.ops.aten.full.default:
            node.target, node.args, node.kwargs = torch.ops.aten.from_file.default, (path, False, 16), {
                "dtype": torch.uint8}
    ep.graph_module.recompile()
    out = folder / "crafted.pt2"
    torch.export.save(ep, str(out))
    return out


def test_a_crafted_pt2_that_reads_a_file_is_refused_in_safe_mode(world, monkeypatch):
    pt2 = crafted_pt2(world["folder"], "/etc/passwd")
    loaded = torch.export.load(str(pt2))
    assert "aten::from_file" in exported_ops(loaded)
    control = loaded.module()(torch.ones(2, 4))  # control: unchecked, it really reads the file
    assert control[0, 0].item() == 1 + sum(open("/etc/passwd", "rb").read(16))
    with pytest.raises(TrustError, match=r"crafted.pt2 calls aten::from_file \(reads a file\) in graph main"):
        check_exported(loaded, "crafted.pt2")
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    out = validate(world, ModelSpec(source="export", name="crafted.pt2", path=str(pt2)))
    assert out.status == "error" and "crafted.pt2 calls aten::from_file (reads a file)" in out.error


# ------------------------------------------------------------------------------ the sandbox itself
@pytest.mark.parametrize("confined", [True, False], ids=["sandboxed", "control-unconfined"])
def test_the_sandbox_alone_keeps_torchscript_file_ops_off_the_server(world, monkeypatch, confined, tmp_path):
    """No safe mode (so no op check): the sandbox is all that stands between the graph and the disk."""
    if not confined:
        world = make_world(tmp_path)  # the control overwrites the store: not the module's
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "1" if confined else "0")
    store = world["store"]
    target = world["folder"] / "written.pt"
    target.unlink(missing_ok=True)
    before = snapshot(store)
    validate(world, ts_spec(world["folder"], SaveTo(str(target)), "save.ts.pt"))
    read = validate(world, ts_spec(world["folder"], ReadFrom("/etc/passwd"), "read.ts.pt"))
    at_store = validate(world, ts_spec(world["folder"], SaveTo(str(store.db_path)), "store.ts.pt"))
    if confined:
        assert not target.exists()
        assert read.status == "error", "reading /etc/passwd must fail in the sandbox"
        assert_intact(store, before)
        assert Store(store.data_dir).notices == []
    else:  # the same models really do it when nothing confines them
        assert target.exists() and read.ok
        # ... it overwrote the store, which the runner then found unreadable and moved aside
        assert at_store.ok and list(store.data_dir.glob("runs.sqlite.corrupt-*")) and store.notices


PROBES = """
import errno, os, socket, subprocess, tempfile
import psutil

def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as e:
        return "refused:" + errno.errorcode.get(e.errno, str(e.errno))

def write(path):
    with open(path, "w") as f:
        f.write("pwned")

def tcp():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=3)
    s.close()

guardian = os.getppid()
runner = RUNNER  # the test's process (in a PID namespace, not a pid the job can see)
report = {
    "read_passwd": attempt(lambda: open("/etc/passwd").read()),
    "write_outside": attempt(lambda: write(TARGET)),
    "read_store": attempt(lambda: open(STORE, "rb").read()),
    "write_store": attempt(lambda: open(STORE, "r+b").write(b"pwned")),
    "truncate_store": attempt(lambda: os.truncate(STORE, 0)),
    "list_data_dir": attempt(lambda: os.listdir(DATA)),
    "tcp_connect": attempt(tcp),
    "udp_socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()),
    "signal_runner": attempt(lambda: os.kill(runner, 0)),
    "signal_guardian": attempt(lambda: os.kill(guardian, 0)),
    "child_reads_passwd": "allowed" if subprocess.run(["cat", "/etc/passwd"], capture_output=True).returncode == 0
                          else "refused",
    "temp_file": attempt(lambda: tempfile.NamedTemporaryFile(dir=None).close()),
    "read_torch": attempt(lambda: open(torch.__file__).read()),
    "unix_socketpair": attempt(lambda: [s.close() for s in socket.socketpair()]),
    "unix_socket": attempt(lambda: socket.socket(socket.AF_UNIX).close()),
    "write_code": attempt(lambda: write(os.path.join(os.path.dirname(torch.__file__), "pwned.txt"))),
    "list_root": attempt(lambda: os.listdir("/")),
}
raise RuntimeError("PROBE " + repr(report))
"""


def probe(world, monkeypatch, confined: bool, mode: str = "namespaces") -> dict:
    import ast
    import os

    if confined:
        use_mode(monkeypatch, mode)
    else:
        monkeypatch.setenv("TORCHSCOPE_SANDBOX", "0")
    store = world["store"]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    accepted = []
    listener.settimeout(30)

    def accept():
        try:
            conn, _ = listener.accept()
            accepted.append(conn)
        except OSError:
            pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    target = world["folder"] / "outside.txt"
    target.unlink(missing_ok=True)  # the control probe writes it
    forward = PROBES.replace("PORT", str(listener.getsockname()[1])).replace("TARGET", repr(str(target))) \
        .replace("STORE", repr(str(store.db_path))).replace("DATA", repr(str(store.data_dir))) \
        .replace("RUNNER", str(os.getpid()))
    before = snapshot(store)
    out = validate(world, python_spec(model_file(world["folder"], "probe.py", forward)))
    listener.close()
    t.join(5)
    assert out.status == "error" and "PROBE " in out.error, out.error
    report = ast.literal_eval(out.error.split("PROBE ", 1)[1])
    report["tcp_accepted"] = bool(accepted)
    report["target_written"] = target.exists()
    if confined:
        assert_intact(store, before)
    return report


@pytest.mark.parametrize("mode", MODES)
def test_what_a_sandboxed_model_may_and_may_not_do(world, monkeypatch, mode):
    r = probe(world, monkeypatch, confined=True, mode=mode)
    hidden = "refused:ENOENT" if mode == "namespaces" else "refused:EACCES"  # not in the job's view / refused
    assert r["read_passwd"] == hidden
    # namespaces: the model's folder holds the hidden data folder, so it is a read-only folder of the view
    assert r["write_outside"] == ("refused:EROFS" if mode == "namespaces" else "refused:EACCES")
    assert not r["target_written"]
    store = ("read_store", "write_store", "truncate_store")
    assert {k: r[k] for k in store} == dict.fromkeys(store, hidden)
    assert r["list_data_dir"] == "refused:EACCES"  # in view, it leads to the job's own folder: not listable
    assert r["tcp_connect"] == "refused:EACCES" and not r["tcp_accepted"]
    assert r["udp_socket"] == "refused:EACCES"  # seccomp: Landlock alone governs TCP only
    assert r["signal_runner"] == ("refused:ESRCH" if mode == "namespaces" else "refused:EPERM")
    assert r["signal_guardian"] == "refused:EPERM"
    assert r["child_reads_passwd"] == "refused"  # what it starts is confined too
    assert r["temp_file"] == r["read_torch"] == r["unix_socketpair"] == "allowed"
    # what is in view is still Landlock's: read-only code, no listing of the root
    assert r["write_code"] == r["list_root"] == "refused:EACCES"
    # a Unix socket could reach any host service by its path: only where no host socket is in view
    assert r["unix_socket"] == ("allowed" if mode == "namespaces" else "refused:EACCES")


def test_control_the_same_probes_succeed_without_the_sandbox(world, monkeypatch):
    r = probe(world, monkeypatch, confined=False)
    assert r["read_passwd"] == r["write_outside"] == r["read_store"] == r["tcp_connect"] == "allowed"
    assert r["udp_socket"] == r["signal_runner"] == r["child_reads_passwd"] == "allowed"
    assert r["target_written"] and r["tcp_accepted"]


@pytest.mark.parametrize("mode", MODES)
def test_a_sandboxed_model_can_use_dataloader_workers_and_temp_files(world, monkeypatch, mode):
    use_mode(monkeypatch, mode)
    forward = """
        ds = torch.utils.data.TensorDataset(torch.arange(64, dtype=torch.float32).reshape(16, 4))
        total = sum(float(b[0].sum()) for b in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2))
        assert total == float(sum(range(64))), total
        with tempfile.TemporaryDirectory() as d:
            torch.save(x, os.path.join(d, "x.pt"))
            assert torch.equal(torch.load(os.path.join(d, "x.pt")), x)
        return self.lin(x)
    """
    out = validate(world, python_spec(model_file(world["folder"], "loader.py", forward, "import os, tempfile")))
    if mode == "namespaces":
        assert out.ok, (out.error, out.log_tail)
    else:  # no Unix sockets to pass tensors: said at once (it waited for the job's timeout before)
        assert out.status == "error" and sandbox.DATALOADER_WORKERS_REFUSED in out.error, out.error
        assert out.duration_s < 60


# ------------------------------------------------------------------------------ no sandbox
def test_safe_mode_without_a_sandbox_refuses_graph_code_instead_of_running_it(world, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "0")
    target = world["folder"] / "pwned.pt"
    target.unlink(missing_ok=True)
    out = validate(world, ts_spec(world["folder"], SaveTo(str(target))))
    assert out.status == "error"
    assert out.error == ("TorchScript models are refused on this server: server-safe mode runs their graph code only "
                         "in a sandboxed worker, and there is no sandbox here (TORCHSCOPE_SANDBOX=0)")
    assert not target.exists()
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "1")
    assert validate(world, ts_spec(world["folder"], nn.Linear(4, 3), "ok.ts.pt")).ok


NO_LANDLOCK = sandbox.Support(0, False, "this kernel has no Landlock (Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK)")


def test_the_cli_says_at_start_up_when_the_kernel_offers_no_sandbox(monkeypatch, capsys):
    from diagnostics.cli.main import main

    assert main(["list"]) == 0
    assert "no job sandbox" not in capsys.readouterr().err  # control: this kernel has one
    monkeypatch.setattr(sandbox, "probe", lambda: NO_LANDLOCK)
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    assert main(["list"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: this system offers no job sandbox: this kernel has no Landlock")
    assert "In server-safe mode TorchScript and .pt2 uploads are refused" in err


def test_the_dashboard_says_so_and_offers_no_graph_uploads_in_safe_mode_without_a_sandbox(new_app, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")

    def upload_kinds():
        at = new_app()
        at.run()
        warnings = [w.value for w in at.sidebar.warning]  # said once, on the session's first run
        at.sidebar.radio(key="sb_source").set_value("Upload a file").run()
        assert not at.exception, at.exception
        box = [s for s in at.sidebar.selectbox if s.key == "sb_upload_kind"]
        assert not any("sandbox" in w.value for w in at.sidebar.warning), "said more than once"
        return (list(box[0].options) if box else []), warnings, [c.value for c in at.sidebar.caption]

    kinds, warnings, _ = upload_kinds()
    assert any("TorchScript" in k for k in kinds) and any(".pt2" in k for k in kinds)  # control
    assert not any("sandbox" in w for w in warnings)
    monkeypatch.setattr(sandbox, "probe", lambda: NO_LANDLOCK)
    kinds, warnings, captions = upload_kinds()
    assert kinds == []
    assert any(w.startswith("this system offers no job sandbox: this kernel has no Landlock") for w in warnings)
    assert any("model uploads are disabled" in c for c in captions)


def test_a_required_sandbox_that_cannot_be_had_is_an_error():
    with pytest.raises(sandbox.SandboxError, match="the job sandbox is required .* but this kernel has no Landlock"):
        sandbox.apply(sandbox.Policy(), NO_LANDLOCK)


# ------------------------------------------------------------------------------ the policy
def test_the_policy_hides_the_data_folder_but_grants_the_jobs_own_files(tmp_path):
    data = tmp_path / "data"
    upload = data / "uploads" / "abc" / "model.ts.pt"
    upload.parent.mkdir(parents=True)
    upload.write_bytes(b"x")
    (data / "runs.sqlite").write_bytes(b"x")
    art = data / "artifacts" / "run1"
    art.mkdir(parents=True)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    job = Job("trace", None, {"path": str(data / "runs.sqlite")})
    rules = dict(sandbox.policy_for(job, art, tmp, hidden=[data]).rules())
    assert Path("/etc/passwd") not in rules and Path("/etc") not in rules
    assert not any(p == data or data in p.parents for p in rules if p not in (art,)), \
        "a rule reaches into the data folder"
    assert rules[art.resolve()] == sandbox.EVERYTHING and rules[tmp.resolve()] == sandbox.EVERYTHING
    job = Job("validate", ModelSpec(source="torchscript", name="m", path=str(upload)))
    rules = dict(sandbox.policy_for(job, art, tmp, hidden=[data]).rules())
    assert rules[upload.resolve()] == sandbox.READ  # the job's own upload, inside the hidden folder


def test_trace_jobs_alone_may_write_the_trace_cache_in_the_data_folder(tmp_path, monkeypatch):
    from diagnostics.settings import trace_cache_dir

    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))
    art, tmp = tmp_path / "art", tmp_path / "tmp"
    art.mkdir(), tmp.mkdir()
    cache = trace_cache_dir().resolve()
    for analysis in ("trace", "trace_diff"):
        rules = dict(sandbox.policy_for(Job(analysis, None, {}), art, tmp).rules())
        assert rules[cache] == sandbox.EVERYTHING
        assert not any(p == cache.parent for p in rules)  # the data folder itself stays hidden
    rules = dict(sandbox.policy_for(Job("validate", ModelSpec(name="mlp")), art, tmp).rules())
    assert not any(p == cache or cache in p.parents for p in rules)  # user code never reaches it


def test_the_policy_carves_the_data_folder_out_of_a_broad_root(tmp_path):
    root = tmp_path / "app"
    (root / "pkg").mkdir(parents=True)
    (root / "data" / "artifacts").mkdir(parents=True)
    (root / "notes.txt").write_text("x")
    policy = sandbox.Policy(read_exec=[root], hidden=[(root / "data").resolve()])
    rules = dict(policy.rules())
    assert (root / "pkg").resolve() in rules and (root / "notes.txt").resolve() in rules
    assert root.resolve() not in rules and (root / "data").resolve() not in rules


def test_distributed_jobs_on_uploads_are_refused_in_safe_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    upload = Job("distributed", ModelSpec(source="torchscript", name="m", path=str(tmp_path / "m.pt")))
    with pytest.raises(TrustError, match="the distributed analysis runs an uploaded model only outside server-safe"):
        sandbox.policy_for(upload, tmp_path, tmp_path)
    policy = sandbox.policy_for(Job("distributed", ModelSpec(name="mlp")), tmp_path, tmp_path)
    assert policy.network  # the built-in samples keep TCP for their ranks
    assert not sandbox.policy_for(Job("validate", ModelSpec(name="mlp")), tmp_path, tmp_path).network



# ------------------------------------------------------------------------------ safe mode: before anything runs (#30)
class SetState(nn.Module):
    """Its __setstate__ (which torch.jit.load runs) saves a tensor to ``path``: code that runs on load."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def forward(self, x):
        return x * 2

    @torch.jit.export
    def __getstate__(self):
        return (self.path, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, bool]):
        self.path = state[0]
        torch.save(torch.ones(1), state[0])
        self.training = state[1]


@pytest.fixture
def in_a_worker(monkeypatch):
    """load_model in safe mode as a sandboxed worker runs it (graph code is loaded only there)."""
    monkeypatch.setattr(sandbox, "confined", lambda: True)
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")


def test_safe_mode_refuses_a_torchscript_setstate_before_it_runs(tmp_path, in_a_worker):
    from diagnostics.intake import load_model

    target = tmp_path / "written_on_load.pt"
    spec = ts_spec(tmp_path, SetState(str(target)))
    target.unlink(missing_ok=True)
    torch.jit.load(spec.path)  # control: loading alone runs the code
    assert target.exists()
    target.unlink()
    with pytest.raises(TrustError) as e:
        load_model(spec)
    assert str(e.value).startswith("model.ts.pt calls aten::save (writes a file) in SetState.__setstate__; server-safe "
                                   "mode refuses"), e.value
    assert re.search(r"\(code/__torch__/\w+\.py, line \d+: checked before anything in the archive ran\)", str(e.value))
    assert not target.exists()


def test_safe_mode_torchscript_setstate_through_the_runner(world, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    target = world["folder"] / "setstate.pt"
    spec = ts_spec(world["folder"], SetState(str(target)))
    target.unlink(missing_ok=True)
    out = validate(world, spec)
    assert out.status == "error" and out.error.startswith("model.ts.pt calls aten::save (writes a file) in "
                                                          "SetState.__setstate__"), out.error
    assert not target.exists()


def test_every_samples_archive_passes_the_check_before_loading(tmp_path):
    """The allow-list refuses none of the built-in models, scripted, traced or exported."""
    from diagnostics.graph_ops import inspect_export_archive, inspect_torchscript_archive
    from sample_models import SAMPLES

    checked = 0
    for name in ("mlp", "cnn", "transformer", "lstm"):
        sample = SAMPLES[name]
        model = sample.build().eval()
        args = tuple(torch.randn(*s.shape) if s.dtype.startswith("float") else torch.randint(0, 8, s.shape)
                     for s in sample.inputs)
        for made in (lambda: torch.jit.script(model), lambda: torch.jit.trace(model, args, check_trace=False)):
            path = tmp_path / f"{name}.ts.pt"
            torch.jit.save(made(), str(path))
            inspect_torchscript_archive(path, path.name)
            checked += 1
        ep = torch.export.export(model, args)
        torch.export.save(ep, str(tmp_path / f"{name}.pt2"))
        inspect_export_archive(tmp_path / f"{name}.pt2", f"{name}.pt2")
        check_exported(torch.export.load(str(tmp_path / f"{name}.pt2")), f"{name}.pt2")
        checked += 2
    assert checked == 16


VICTIM = '''
class Writer:
    """What a crafted program names by import path: anything with an .apply runs."""

    @staticmethod
    def apply(op, x, path):
        with open(path, "w") as f:
            f.write("ran")
        return x
'''


def crafted_callable_pt2(folder, target: str):
    """A .pt2 whose node calls torch.export.custom_ops._call_custom_autograd_function_in_pre_dispatch
    (it imports a module by name and calls .apply) with an operator passed as an argument."""
    from torch.export.custom_ops import _call_custom_autograd_function_in_pre_dispatch as call

    class M(nn.Module):
        def forward(self, x):
            return x.relu() + 1

    ep = torch.export.export(M(), (torch.ones(2, 4),))
    for node in ep.graph.nodes:
        if node.target is torch.ops.aten.relu.default:
            node.target, node.args = call, ("torchscope_victim.Writer", torch.ops.aten.save.default, node.args[0],
                                            target)
    ep.graph_module.recompile()
    torch.export.save(ep, str(folder / "crafted.pt2"))
    return ModelSpec(source="export", name="crafted.pt2", path=str(folder / "crafted.pt2"))


def test_safe_mode_refuses_an_exported_program_calling_a_callable_by_import_path(tmp_path, monkeypatch, in_a_worker):
    from diagnostics.intake import load_model

    (tmp_path / "torchscope_victim.py").write_text(VICTIM)
    monkeypatch.syspath_prepend(str(tmp_path))
    target = tmp_path / "ran.txt"
    spec = crafted_callable_pt2(tmp_path, str(target))
    torch.export.load(spec.path).module()(torch.ones(2, 4))  # control: the program really runs it
    assert target.read_text() == "ran"
    target.unlink()
    with pytest.raises(TrustError) as e:
        load_model(spec)
    assert str(e.value).startswith("crafted.pt2 calls torch.export.custom_ops._call_custom_autograd_function_in_pre_"
                                   "dispatch (a Python callable, not an operator) in graph main;"), e.value
    assert "(models/model.json, node relu: checked before anything in the archive ran)" in str(e.value)
    assert not target.exists()


def test_safe_mode_refuses_an_operator_passed_as_an_argument_of_an_allowed_target(tmp_path, in_a_worker):
    from diagnostics.intake import load_model

    class M(nn.Module):
        def forward(self, x):
            return x.relu() + 1

    ep = torch.export.export(M(), (torch.ones(2, 4),))
    for node in ep.graph.nodes:
        if node.target is torch.ops.aten.relu.default:  # an allowed higher-order op, a file op as its argument
            node.target = torch.ops.higher_order.wrap_with_set_grad_enabled
            node.args = (True, torch.ops.aten.from_file.default, node.args[0])
    ep.graph_module.recompile()
    torch.export.save(ep, str(tmp_path / "arg.pt2"))
    loaded = torch.export.load(str(tmp_path / "arg.pt2"))
    assert "aten::from_file" not in exported_ops(loaded)  # control: a check of node targets alone misses it
    with pytest.raises(TrustError, match=r"arg.pt2 calls aten::from_file \(reads a file\) in graph main, an argument "
                                         r"of node relu"):
        check_exported(loaded, "arg.pt2")  # after loading, as defence in depth
    with pytest.raises(TrustError) as e:
        load_model(ModelSpec(source="export", name="arg.pt2", path=str(tmp_path / "arg.pt2")))
    assert str(e.value).startswith("arg.pt2 calls aten::from_file (reads a file) in graph main, an argument of node "
                                   "relu;"), e.value


def test_the_cli_says_at_start_up_when_jobs_run_without_namespaces(monkeypatch, capsys):
    from diagnostics.cli.main import main

    monkeypatch.setattr(sandbox, "namespace_support", lambda: (True, ""))
    assert main(["list"]) == 0
    assert "namespaces" not in capsys.readouterr().err  # control: the full sandbox says nothing
    monkeypatch.setattr(sandbox, "namespace_support",
                        lambda: (False, "unshare (a user namespace) failed (Operation not permitted)"))
    assert main(["list"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: jobs run in the Landlock sandbox without namespaces of their own (unshare (a user "
                          "namespace) failed (Operation not permitted)): Unix sockets are refused except socketpair()")
    assert "/dev/shm is shared" in err


def test_a_trace_answered_in_the_cli_process_starts_no_namespace_check_and_a_worker_job_says_it(
        monkeypatch, capsys, tmp_path):
    """`trace analyze` of one file reads it in the CLI's own process (data, no model: nothing to confine), so it
    says nothing of the sandbox and starts no namespace check (a process, ~50 ms of a first answer); the same
    command through a worker (--timeout) says it before the worker starts."""
    from diagnostics.cli.main import main

    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / "gpu_small.json"
    asked = []

    def support():
        asked.append(True)
        return False, "unshare (a user namespace) failed (Operation not permitted)"

    monkeypatch.setattr(sandbox, "namespace_support", support)
    argv = ["trace", "analyze", str(trace), "-q", "--no-report", "--data-dir", str(tmp_path / "data")]
    assert main(argv) == 0
    assert "namespaces" not in capsys.readouterr().err and not asked
    if sandbox.setting() == "off" or not sandbox.probe().ok:
        pytest.skip("no Landlock here: the notice is about the sandbox itself, not namespaces")
    copy = tmp_path / "copy.json"   # (a file not read before: a reopen is answered here too)
    copy.write_bytes(trace.read_bytes())
    assert main(["trace", "analyze", str(copy), "--timeout", "120"] + argv[3:]) == 0
    err = capsys.readouterr().err
    assert asked and err.startswith("warning: jobs run in the Landlock sandbox without namespaces of their own")
