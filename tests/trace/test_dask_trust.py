"""A Dask scheduler the user names runs code as them (issue 45, item 2): used only with the trust flag
(--trust-dask-scheduler / option trust_dask_scheduler), refused without it before anything connects,
refused in server-safe mode, off until ticked on the Trace explorer; a LocalCluster listens on loopback,
which a sandboxed trace job (namespaces) has to itself."""

import socket
import threading

import pytest

from diagnostics import sandbox
from diagnostics.runner import Job, run_job
from diagnostics.trace import TraceError
from diagnostics.trace.ranks import analyse_ranks
from diagnostics.trace.ranks import executors
from tests.trace.rank_traces import write_rank


@pytest.fixture
def two(tmp_path):
    d = tmp_path / "job"
    for r in (0, 1):
        write_rank(d, f"rank{r}.pt.trace.json", r, 2, [1000.0, 1000.0])
    return d


class Listener:
    """A TCP port on loopback that counts the connections made to it (a stand-in scheduler)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


@pytest.mark.parametrize("spec, remote", [
    (None, False), ("", False), ("local", False), ("local:4", False), (" local:2 ", False),
    ("tcp://10.0.0.5:8786", True), ("10.0.0.5:8786", True), ("localhost:8786", True), ("local:x", True),
])
def test_a_scheduler_address_is_remote_and_a_local_cluster_is_not(spec, remote, tmp_path):
    assert executors.is_remote(spec) is remote
    # the sandbox reads the same grammar (it sits below the trace layer, so it keeps its own copy)
    job = Job("trace", None, {"path": str(tmp_path), "ranks": [str(tmp_path)], "dask": spec})
    assert sandbox.local_cluster_only(job) is (bool(spec) and not remote)


def test_a_scheduler_is_refused_without_the_trust_flag_before_anything_connects(two):
    listener = Listener()
    try:
        with pytest.raises(TraceError, match=r"--dask tcp://127.0.0.1:\d+: refused: a Dask scheduler runs code as you: "
                                             r"distributed exchanges pickles.*--trust-dask-scheduler"):
            analyse_ranks([two], dask=f"tcp://127.0.0.1:{listener.port}")
        with pytest.raises(TraceError, match="refused: a Dask scheduler runs code as you"):
            executors.executor_for(f"tcp://127.0.0.1:{listener.port}", [])
    finally:
        listener.close()
    assert listener.accepted == 0


def test_with_the_trust_flag_the_scheduler_is_used(two, monkeypatch):
    made = []

    class Executor:
        def __init__(self, spec, paths, memory_limit=None):
            made.append(spec)
            raise TraceError("stand-in: no cluster here")

    monkeypatch.setattr(executors, "DaskExecutor", Executor)
    with pytest.raises(TraceError, match="stand-in"):
        analyse_ranks([two], dask="tcp://10.0.0.5:8786", dask_trusted=True)
    assert made == ["tcp://10.0.0.5:8786"]


def test_a_local_cluster_needs_no_trust_and_listens_on_loopback(monkeypatch):
    distributed = pytest.importorskip("distributed")
    seen = {}

    class Cluster:
        def __init__(self, **kw):
            seen.update(kw)
            raise RuntimeError("stand-in: not started")

    import dask.distributed  # imported first: its `from distributed import *` would copy the stand-in for good

    monkeypatch.setattr(distributed, "LocalCluster", Cluster)
    monkeypatch.setattr(dask.distributed, "LocalCluster", Cluster)  # where executors takes it from
    with pytest.raises(RuntimeError, match="stand-in"):
        executors.executor_for("local:2", [], memory_limit="1GB")
    assert seen["host"] == "127.0.0.1" and seen["dashboard_address"] is None


def test_the_cli_flag_and_the_trace_job(tmp_path, two):
    from diagnostics.cli.main import build_parser
    from diagnostics.cli.trace import trace_job

    args = build_parser().parse_args(["trace", "analyze", str(two), "--dask", "tcp://10.0.0.5:8786",
                                      "--trust-dask-scheduler"])
    assert trace_job(args)[1]["trust_dask_scheduler"] is True
    args = build_parser().parse_args(["trace", "analyze", str(two), "--dask", "tcp://10.0.0.5:8786"])
    options = trace_job(args)[1]
    assert not options.get("trust_dask_scheduler")
    # the job itself (a worker, sandboxed) refuses it and says why; nothing was analysed
    out = run_job(Job("trace", None, {"path": str(two / "rank0.pt.trace.json"), "ranks": [str(two)],
                                      "dask": "tcp://10.0.0.5:8786"}), timeout_s=120, artifact_dir=tmp_path / "run")
    assert out.status == "error" and "refused: a Dask scheduler runs code as you" in out.error, out.error


def test_a_dask_job_is_refused_in_server_safe_mode_even_trusted(tmp_path, monkeypatch):
    from diagnostics.errors import TrustError
    from diagnostics.settings import SAFE_MODE_ENV

    monkeypatch.setenv(SAFE_MODE_ENV, "1")
    job = Job("trace", None, {"path": str(tmp_path), "ranks": [str(tmp_path)], "dask": "tcp://10.0.0.5:8786",
                              "trust_dask_scheduler": True})
    with pytest.raises(TrustError, match="used only outside server-safe mode"):
        sandbox.policy_for(job, tmp_path, tmp_path)


def _rank_job(folder, dask: str) -> Job:
    return Job("trace", None, {"path": str(folder / "rank0.pt.trace.json"), "ranks": [str(folder)], "dask": dask,
                               "dask_memory_limit": "1GB"})


@pytest.mark.slow  # a LocalCluster of one worker starts inside the job (10-20 s on the shared 2-core machine)
def test_a_local_cluster_job_listens_on_a_loopback_of_its_own(two, tmp_path, monkeypatch):
    """The trace job's LocalCluster runs in a network namespace of the job's own: the worker.log says so,
    the job's scheduler is not among this machine's listening sockets, and the ranks come out as in
    local processes."""
    pytest.importorskip("distributed")
    import psutil

    if not sandbox.probe().ok or not sandbox.namespace_support()[0]:
        pytest.skip("no user namespaces here")
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "1")
    seen: set = set()

    def look(elapsed):  # while the job runs: what its processes listen on, as this machine sees it
        mine = {p.pid for p in psutil.Process().children(recursive=True)}
        seen.update(c.laddr for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.pid in mine)

    out = run_job(_rank_job(two, "local:1"), timeout_s=240, artifact_dir=tmp_path / "run", on_tick=look)
    assert out.ok, (out.error, out.log_tail[-2000:])
    log = (tmp_path / "run" / "worker.log").read_text()
    assert "a network of its own: loopback only" in log.splitlines()[0], log[:500]
    assert out.result.ranks.mode.startswith("dask (a Dask LocalCluster of 1 worker processes")
    assert seen == set(), seen  # the scheduler and its worker listened, in the job's own network only
    local = run_job(Job("trace", None, {"path": str(two / "rank0.pt.trace.json"), "ranks": [str(two)]}),
                    timeout_s=240, artifact_dir=tmp_path / "local")
    assert local.ok and local.result.ranks.ranks == out.result.ranks.ranks


def test_without_a_network_of_its_own_a_local_cluster_job_is_refused(two, tmp_path, monkeypatch):
    if not sandbox.probe().ok:
        pytest.skip("no job sandbox here")
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "1")
    monkeypatch.setenv(sandbox.NAMESPACES_ENV, "0")
    out = run_job(_rank_job(two, "local:2"), timeout_s=120, artifact_dir=tmp_path / "run")
    assert out.status == "error"
    assert out.error.startswith("--dask local:2: a LocalCluster needs a network of the job's own, so that no other "
                                "user of this machine can reach its scheduler"), out.error
    assert f"turned off ({sandbox.NAMESPACES_ENV}=0)" in out.error


# ---- the Trace explorer: off until ticked ----------------------------------------------------------------

def _options_script():
    import streamlit as st

    from ui.views.trace_ranks import execution_options

    st.session_state["run_on"] = execution_options(False)


def test_the_page_uses_a_scheduler_only_once_it_is_ticked_as_trusted():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_options_script, default_timeout=60)
    at.run()
    at.text_input(key="trace_ranks_dask").set_value("local:2").run()
    assert at.session_state["run_on"] == {"dask": "local:2"} and not at.checkbox  # a local cluster: no question
    at.text_input(key="trace_ranks_dask").set_value("tcp://10.0.0.5:8786").run()
    box = at.checkbox(key="trace_ranks_dask_trust")
    assert box.value is False and at.session_state["run_on"] == {}
    assert any("is not used until you tick that you trust it" in w.value for w in at.warning)
    box.check().run()
    assert at.session_state["run_on"] == {"dask": "tcp://10.0.0.5:8786", "trust_dask_scheduler": True}
    assert not at.warning
