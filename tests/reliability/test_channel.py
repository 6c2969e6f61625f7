"""Nothing a job sends is unpickled (issue 45, item 1): the worker's channel to the runner carries bytes
decoded against a schema (diagnostics/runner/channel.py).

The planted model is the attack of the issue: its build_model walks its stack frames up to the worker's
channel, sends ("progress", 0.5, Evil()) through it (Evil's __reduce__ writes a marker file when it is
unpickled) and writes a pickle of the same in the channel's framing straight to its descriptor. Before
the fix the runner unpickled it, in the unsandboxed CLI or dashboard process; now the marker never
appears and the job ends with an error saying what it sent. Through a cold worker and a spare.
"""

import pickle
import struct
import textwrap
from pathlib import Path

import pytest

from diagnostics import runner
from diagnostics.runner import WARM_LOG_LINE, Job, run_job
from diagnostics.runner import channel
from diagnostics.store import Store
from reliability_helpers import python_spec

pytestmark = pytest.mark.timeout(300)
READY_S = 180  # a spare imports torch: slow on a busy machine

ATTACK = textwrap.dedent('''
    import os
    import pickle
    import struct
    import sys

    import torch
    from torch import nn

    MARKER = {marker!r}


    class Evil:
        def __reduce__(self):
            return (exec, (f"open({{MARKER!r}}, 'w').write('pwned')",))


    def build_model():
        found = []
        frame = sys._getframe()
        while frame is not None:  # up to the worker's entry, whatever holds its channel
            for name, value in list(frame.f_locals.items()):
                if name == "conn" and hasattr(value, "fileno"):
                    found.append((frame.f_code.co_name, value))
            frame = frame.f_back
        print("ATTACK found", [f for f, _ in found], flush=True)
        for where, conn in found:
            try:  # a multiprocessing Connection pickles this; the runner unpickled it
                conn.send(("progress", 0.5, Evil()))
                print("ATTACK sent an object through", where, flush=True)
            except Exception as e:
                print("ATTACK send refused:", type(e).__name__, e, flush=True)
            try:  # the same pickle, framed as multiprocessing frames a message, written to the descriptor
                data = pickle.dumps(("progress", 0.5, Evil()))
                # said before the write: the runner may stop this process as soon as the bytes arrive
                print("ATTACK writing a pickle to fd", conn.fileno(), flush=True)
                os.write(conn.fileno(), struct.pack("!i", len(data)) + data)
            except Exception as e:
                print("ATTACK write refused:", type(e).__name__, e, flush=True)
        return nn.Linear(4, 3)


    def example_inputs():
        return (torch.ones(2, 4),)
''')


def attack_spec(folder: Path, marker: Path):
    path = folder / "frames.py"
    path.write_text(ATTACK.format(marker=str(marker)))
    return python_spec(path)


def worker_log(outcome) -> str:
    return (Path(outcome.artifact_dir) / "worker.log").read_text(errors="replace")


def test_the_planted_payload_runs_code_when_unpickled(tmp_path):
    """The control: the payload the model sends is live (unpickling it writes the marker)."""
    marker = tmp_path / "pwned"
    namespace: dict = {}
    exec(compile(ATTACK.format(marker=str(marker)).split("def build_model")[0], "frames.py", "exec"), namespace)
    pickle.loads(pickle.dumps(("progress", 0.5, namespace["Evil"]())))
    assert marker.read_text() == "pwned"


def _check(out, marker: Path, warm: bool) -> None:
    log = worker_log(out)
    assert (WARM_LOG_LINE in log) == warm, log[:300]
    assert "ATTACK found ['job_main'" in log, log[-2000:]  # the model did reach the channel
    assert "ATTACK writing a pickle to fd" in log, log[-2000:]
    assert not marker.exists(), "the runner ran the job's pickle"
    assert out.status == "error", (out.status, out.error)
    assert "not a message of the runner's" in out.error and "never objects" in out.error, out.error
    assert out.error.endswith("the worker was stopped"), out.error


def test_a_model_that_walks_its_frames_to_the_channel_runs_nothing_in_the_runner(tmp_path):
    marker = tmp_path / "pwned"
    store = Store(tmp_path / "data")
    out = run_job(Job("validate", attack_spec(tmp_path, marker)), store=store, timeout_s=120)
    _check(out, marker, warm=False)
    assert "ATTACK send refused: ChannelError" in worker_log(out)  # no object goes through its send either
    assert store.get(out.run_id).status == "error"  # the row is marked, not left running


def test_the_same_through_the_dashboards_spare_worker(tmp_path):
    marker = tmp_path / "pwned"
    try:
        assert runner.keep_spares(1) == 1
        assert runner.spares().wait_ready(READY_S), "the spare did not finish its imports"
        out = run_job(Job("validate", attack_spec(tmp_path, marker)), timeout_s=120)
    finally:
        runner.spares().close()
    _check(out, marker, warm=True)


# ---- the channel itself --------------------------------------------------------------------------

class _Pipe:
    """A runner's end for ``channel.receive``: the bytes of one message as recv_bytes gives them."""

    def __init__(self, data: bytes | None = None, error: Exception | None = None):
        self.data, self.error = data, error

    def recv_bytes(self, maxlength=None):
        if self.error is not None:
            raise self.error
        if maxlength is not None and len(self.data) > maxlength:
            raise OSError("bad message length")
        return self.data


def test_each_message_round_trips_as_its_type():
    msgs = [channel.Baseline(123), channel.Ready(1.5, 4), channel.Ready(0.2, None), channel.Progress(0.25, "step 1"),
            channel.Partial({"rows": [[1, 2.5, None]], "name": "x"}),
            channel.Ok({"metrics": {"nan": float("inf"), "big": 2**62}, "t": [1, 2]}),
            channel.Failed("oom", "MemoryError", "ran out of memory", "Traceback ...")]
    for m in msgs:
        assert channel.receive(_Pipe(channel.encode(m))) == m


@pytest.mark.parametrize("data, says", [
    (pickle.dumps(("progress", 0.5, "x")), "not a message of the runner's"),
    (pickle.dumps(("ok", {"a": 1})), "not a message of the runner's"),
    (b"", "not a message of the runner's"),
    (channel._encode(["progress", "half", "x"]), "Expected `float`"),
    (channel._encode(["shell", "rm -rf /"]), "Invalid value 'shell'"),
    (channel._encode(["failed", "segfault", "E", "e", ""]), "Invalid enum value 'segfault'"),
    (channel._encode(["progress", float("nan"), "x"]), "progress of nan"),
])
def test_what_is_not_a_message_is_refused_by_name(data, says):
    with pytest.raises(channel.ChannelError, match="the job sent|progress of") as e:
        channel.receive(_Pipe(data))
    assert says in str(e.value)


def test_a_message_over_the_limit_is_refused_before_it_is_read(monkeypatch):
    monkeypatch.setattr(channel, "MAX_MESSAGE_BYTES", 1000)
    with pytest.raises(channel.ChannelError, match="over the limit of 0 MiB"):
        channel.receive(_Pipe(b"x" * 1001))
    with pytest.raises(channel.ChannelError, match="is 0 MiB, over the limit"):
        channel.encode(channel.Ok("y" * 2000))
    with pytest.raises(EOFError):
        channel.receive(_Pipe(error=EOFError()))


def test_the_sender_sends_data_only_and_frames_it_as_multiprocessing_reads_it():
    import multiprocessing as mp

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    read, write = mp.Pipe(duplex=False)
    sender = channel.Sender(write)
    assert write.closed  # no Connection is left on the job's side
    with pytest.raises(channel.ChannelError, match="plain data"):
        sender.send(("progress", 0.5, Evil()))
    with pytest.raises(channel.ChannelError, match="plain data"):
        sender.send(channel.Ok({"x": Evil()}))
    sender.send(channel.Progress(0.5, "half"))
    assert channel.receive(read) == channel.Progress(0.5, "half")
    sender.close()
    sender.close()  # twice: the guardian and the job both close their copies
    with pytest.raises(EOFError):
        channel.receive(read)


def test_a_spares_job_goes_as_bytes_too():
    import multiprocessing as mp

    read, write = mp.Pipe(duplex=False)
    args = channel.JobArgs({"analysis": "summary", "spec": None, "options": {}}, "/a", None, "/t", ("/s",),
                           {"disk_bytes": 10, "shm_bytes": None})
    channel.send_job(write, args)
    assert channel.receive_job(read) == args


# ---- a flood of messages -------------------------------------------------------------------------

FLOOD = textwrap.dedent('''
    import sys

    from torch import nn


    def build_model():
        Progress = sys.modules["diagnostics.runner.channel"].Progress
        frame = sys._getframe()
        while frame is not None and "conn" not in frame.f_locals:  # up to the worker's entry and its channel
            frame = frame.f_back
        conn = frame.f_locals["conn"]
        print("FLOOD sending", flush=True)
        while True:  # well-formed messages, never an answer: the pipe is never empty
            conn.send(Progress(0.5, "flood"))
        return nn.Linear(4, 3)


    def example_inputs():
        import torch
        return (torch.ones(2, 4),)
''')


def test_a_job_that_floods_its_channel_still_times_out(tmp_path):
    """Each message the runner reads is followed by its checks: a job whose messages never stop (its own
    progress, sent as fast as it can) cannot hold off its timeout or a cancel by keeping the pipe full."""
    path = tmp_path / "flood.py"
    path.write_text(FLOOD)
    out = run_job(Job("validate", python_spec(path)), timeout_s=15)
    assert "FLOOD sending" in worker_log(out)  # the flood ran
    assert out.status == "timeout", (out.status, out.error)
    assert out.error == "timed out after 15 s: the worker was stopped"
    assert out.duration_s < 15 + 30  # stopped at its timeout, not whenever the flood ended
