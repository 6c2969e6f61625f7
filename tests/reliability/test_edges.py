"""The sandbox's edges (issue #30): what the unsandboxed side reads back, host sockets and secrets,
other processes' environment, limits that count everything.

Each attack is a Python-file model run through the real runner (spawned, sandboxed worker) with a
real store, in both confinement modes where this machine has them (namespaces of the job's own, and
Landlock + seccomp alone). Controls show the attack is real: the same probe succeeds with the
sandbox off, or the same file is read when it is a plain file.
"""

import ast
import os
import socket
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from diagnostics import jobfiles
from diagnostics.runner import Job, run_job
from diagnostics.store import Store
from reliability_helpers import FIND_FOLDER, MODES, model_file, python_spec, use_mode

pytestmark = pytest.mark.timeout(150)
MARKER = "SECRET-MARKER-" + uuid.uuid4().hex[:8]


@pytest.fixture
def world(tmp_path):
    secret = tmp_path / "id_ed25519"
    secret.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{MARKER}\n")
    return {"store": Store(tmp_path / "data"), "folder": tmp_path, "secret": secret}


def run(world, forward: str, imports: str = "", name: str = "attack.py", **kwargs):
    spec = python_spec(model_file(world["folder"], name, forward, imports))
    out = run_job(Job("validate", spec), store=world["store"], **{"timeout_s": 90, **kwargs})
    return out, (world["store"].get(out.run_id) if out.run_id else None)


def report(out) -> dict:
    assert "PROBE " in (out.error or ""), (out.status, out.error, out.log_tail[-1500:])
    return ast.literal_eval(out.error.split("PROBE ", 1)[1])


ATTEMPT = """
import errno
def attempt(fn):
    try:
        value = fn()
        return "allowed" if value is None else f"allowed:{value}"
    except OSError as e:
        return "refused:" + errno.errorcode.get(e.errno, str(e.errno))
"""


# ------------------------------------------------------------------------------ what the runner reads back
@pytest.mark.parametrize("mode", MODES)
def test_a_worker_log_replaced_by_a_symlink_leaks_nothing(world, monkeypatch, mode):
    use_mode(monkeypatch, mode)
    forward = FIND_FOLDER + f"""
for log in (folder / "worker.log", folder.parent / "worker.log"):  # wherever the runner keeps it
    try:
        os.unlink(log)
    except OSError:
        pass
    try:
        os.symlink({str(world["secret"])!r}, log)
    except OSError:
        pass
os.symlink({str(world["secret"])!r}, folder / "trace.json")
print("about to abort", flush=True)
os.abort()
"""
    out, rec = run(world, forward, "import os")
    assert out.status == "crashed" and "SIGABRT" in out.error, out.error
    assert "about to abort" in out.log_tail  # the tail is there, from the pipe
    assert MARKER not in out.log_tail + out.error
    log = Path(rec.artifacts["worker.log"])
    assert not log.is_symlink() and MARKER not in log.read_text(errors="replace")
    assert "trace.json" not in rec.artifacts
    run_folder = Path(out.artifact_dir)
    assert not [p for p in run_folder.rglob("*") if p.is_symlink()], "a link the job made is in the run's folder"
    assert "runner: not kept from the job's folder: trace.json (a symbolic link)" in out.log_tail


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_log_replaced_by_a_fifo_neither_blocks_the_runner_nor_the_next_job(world, monkeypatch, mode):
    use_mode(monkeypatch, mode)
    forward = FIND_FOLDER + """
for log in (folder / "worker.log", folder.parent / "worker.log"):
    try:
        os.unlink(log)
    except OSError:
        pass
    try:
        os.mkfifo(log)
    except OSError:
        pass
os.mkfifo(folder / "rank0.pt.trace.json")
print("fifo made", flush=True)
return self.lin(x)
"""
    out, rec = run(world, forward, "import os")  # before #30 this never returned (open() on the FIFO)
    assert out.ok, out.error
    assert "fifo made" in out.log_tail
    assert Path(rec.artifacts["worker.log"]).is_file() and "rank0.pt.trace.json" not in rec.artifacts
    # the device queue is free: an exclusive (timed) job runs right after
    nxt = run_job(Job("memory", python_spec(model_file(world["folder"], "ok.py", "return self.lin(x)"))),
                  store=world["store"], timeout_s=120)
    assert nxt.ok, nxt.error


# ------------------------------------------------------------------------------ host sockets and secrets
@pytest.fixture
def agent(monkeypatch):
    """A Unix-socket listener outside the sandbox (like an ssh agent), named in SSH_AUTH_SOCK, and
    secrets in the dashboard's environment."""
    folder = Path(tempfile.mkdtemp(prefix="ssh-agent-"))
    path = folder / "agent.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(4)
    listener.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    monkeypatch.setenv("SSH_AUTH_SOCK", str(path))
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={path}")
    monkeypatch.setenv("MY_API_TOKEN", MARKER)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MARKER)
    yield {"path": path, "accepted": accepted}
    stop.set()
    t.join(2)
    listener.close()
    for c in accepted:
        c.close()
    jobfiles.remove_tree(folder)


SOCKET_PROBE = ATTEMPT + """
def connect():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(AGENT)
    finally:
        s.close()
env = "".join(f"{k}={v}" for k, v in os.environ.items())
report = {
    "env_names": sorted(k for k in os.environ if k in ("SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "MY_API_TOKEN",
                                                        "AWS_SECRET_ACCESS_KEY")),
    "secret_in_env": MARKER in env,
    "secret_in_proc_environ": MARKER.encode() in open("/proc/self/environ", "rb").read(),
    "agent_in_proc_environ": b"SSH_AUTH_SOCK" in open("/proc/self/environ", "rb").read(),
    "connect_agent": attempt(connect),
    "socketpair": attempt(lambda: [s.close() for s in socket.socketpair()] and None),
}
raise RuntimeError("PROBE " + repr(report))
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_host_unix_socket_and_the_ssh_agent_are_out_of_reach(world, monkeypatch, agent, mode):
    use_mode(monkeypatch, mode)
    forward = SOCKET_PROBE.replace("AGENT", repr(str(agent["path"]))).replace("MARKER", repr(MARKER))
    r = report(run(world, forward, "import os, socket")[0])
    assert r["env_names"] == [] and not r["secret_in_env"]
    assert not r["secret_in_proc_environ"] and not r["agent_in_proc_environ"]
    # namespaces: the socket's folder is not in the job's view; without: no Unix socket can be made
    assert r["connect_agent"] == ("refused:ENOENT" if mode == "namespaces" else "refused:EACCES"), r
    assert r["socketpair"] == "allowed"
    assert agent["accepted"] == []


def test_control_unconfined_the_socket_is_reachable_but_the_environment_still_clean(world, monkeypatch, agent):
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "0")
    forward = SOCKET_PROBE.replace("AGENT", repr(str(agent["path"]))).replace("MARKER", repr(MARKER))
    r = report(run(world, forward, "import os, socket")[0])
    assert r["connect_agent"] == "allowed" and agent["accepted"]  # the attack is real
    assert r["env_names"] == [] and not r["secret_in_proc_environ"]  # the allow-listed environment: always


ENVIRON_PROBE = ATTEMPT + """
def read(pid):
    data = open(f"/proc/{pid}/environ", "rb").read()
    return "SECRET" if MARKER.encode() in data else "nothing secret"
report = {
    "bystander": attempt(lambda: read(BYSTANDER)),
    "runner": attempt(lambda: read(RUNNER)),
    "parent": attempt(lambda: read(os.getppid())),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}
raise RuntimeError("PROBE " + repr(report))
"""


def environ_report(world) -> dict:
    """The job's attempts at other processes' environment: an unrelated process holding a secret,
    the runner (this test, a secret in its environment too) and its own parent."""
    bystander = subprocess.Popen(["sleep", "120"], env={"PATH": os.environ["PATH"], "DB_PASSWORD": MARKER})
    try:
        forward = ENVIRON_PROBE.replace("MARKER", repr(MARKER)).replace("BYSTANDER", str(bystander.pid)) \
            .replace("RUNNER", str(os.getpid()))
        return report(run(world, forward, "import os")[0])
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("mode", MODES)
def test_other_processes_environment_is_out_of_reach(world, monkeypatch, mode):
    use_mode(monkeypatch, mode)
    monkeypatch.setenv("MY_API_TOKEN", MARKER)  # in the runner's own environment
    r = environ_report(world)
    assert r["bystander"].startswith("refused:") and r["runner"].startswith("refused:"), r
    assert "SECRET" not in repr(r)
    assert r["parent"] in ("allowed:nothing secret",) or r["parent"].startswith("refused:"), r
    if mode == "namespaces":  # a /proc of its own: the job's processes only
        assert r["processes"][:2] == [1, 2] and os.getpid() not in r["processes"] and len(r["processes"]) < 10, r


def test_control_unconfined_another_processes_environment_is_readable(world, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "0")
    r = environ_report(world)
    assert r["bystander"] == "allowed:SECRET"  # same user, unconfined: the attack is real
    assert r["runner"].startswith("allowed")  # (its file shows the environment it started with)


# ------------------------------------------------------------------------------ limits that count everything
SHM_HOG = """
path = "/dev/shm/torchscope-test-TOKEN"
written = 0
try:
    with open(path, "wb") as f:  # written, never mapped: in no process' resident memory
        while written < (600 << 20):
            f.write(b"\\1" * (8 << 20))
            f.flush()
            written += 8 << 20
except OSError as e:
    print(f"shm write stopped at {written >> 20} MiB: {e}", flush=True)
time.sleep(30)
return self.lin(x)
"""


@pytest.mark.parametrize("mode", MODES)
def test_dev_shm_counts_in_the_memory_cap(world, monkeypatch, mode):
    use_mode(monkeypatch, mode)
    token = uuid.uuid4().hex[:8]
    host_file = Path(f"/dev/shm/torchscope-test-{token}")
    try:
        out, _ = run(world, SHM_HOG.replace("TOKEN", token), "import time", memory_limit_mb=200)
        assert out.status == "oom", (out.status, out.error)
        assert "in /dev/shm" in out.error and "over its cap of 0.2 GiB" in out.error, out.error
        if mode == "namespaces":  # a private /dev/shm, gone with the job
            assert not host_file.exists()
    finally:
        if host_file.exists():  # without namespaces what a job leaves in /dev/shm stays (documented)
            host_file.unlink()


@pytest.mark.parametrize("limit", ["bytes", "one big file", "files"])
def test_a_job_over_its_disk_quota_or_file_count_is_stopped_naming_the_limit(world, monkeypatch, limit):
    monkeypatch.setenv(jobfiles.DISK_ENV, "16")
    monkeypatch.setenv(jobfiles.FILES_ENV, "200")
    forward = {
        "bytes": """
print("TMP", tempfile.gettempdir(), flush=True)
for i in range(16):
    with open(os.path.join(tempfile.gettempdir(), f"part{i}.bin"), "wb") as f:
        f.write(os.urandom(4 << 20))
time.sleep(30)
""",
        "one big file": """
print("TMP", tempfile.gettempdir(), flush=True)
with open(os.path.join(tempfile.gettempdir(), "big.bin"), "wb") as f:
    f.write(b"\\0" * (40 << 20))
""",
        "files": """
print("TMP", tempfile.gettempdir(), flush=True)
for i in range(1000):
    open(os.path.join(tempfile.gettempdir(), f"f{i}"), "w").close()
time.sleep(30)
""",
    }[limit] + "return self.lin(x)"
    out, rec = run(world, forward, "import os, tempfile, time")
    assert out.status == "error", (out.status, out.error)
    if limit == "files":
        assert out.error.startswith("the job made more than 200 files and folders in its artifact and temp folders, "
                                    "over its limit of 200 (set TORCHSCOPE_JOB_FILES)"), out.error
    elif limit == "bytes":
        assert "over its disk quota of 16.0 MiB (set TORCHSCOPE_JOB_DISK_MB)" in out.error, out.error
    else:  # the file-size limit stops the write at 16 MiB; the folder watcher may see those 16 MiB first
        assert (out.error.startswith("the job wrote a file past its disk quota of 16 MiB (set TORCHSCOPE_JOB_DISK_MB)")
                or out.error.startswith("the job wrote 16.0 MiB into its artifact and temp folders, over its disk "
                                        "quota of 16.0 MiB (set TORCHSCOPE_JOB_DISK_MB)")), out.error
    tmp = next(line.split(" ", 1)[1] for line in out.log_tail.splitlines() if line.startswith("TMP "))
    assert not Path(tmp).exists(), "the job's temporary files outlived it"
    assert not (Path(out.artifact_dir) / jobfiles.JOB_FOLDER).exists()


def test_the_artifact_list_history_loads_stays_bounded(world):
    forward = FIND_FOLDER + """
for i in range(300):
    (folder / f"part{i:03d}.txt").write_text("x")
return self.lin(x)
"""
    out, rec = run(world, forward)
    assert out.ok, out.error
    assert len(list(Path(out.artifact_dir).glob("part*.txt"))) == 300  # kept (under the file limit)
    assert len(rec.artifacts) == jobfiles.MAX_LISTED and "worker.log" in rec.artifacts
    listed = world["store"].list()[0]
    assert listed.id == out.run_id and len(listed.artifacts) == jobfiles.MAX_LISTED
