"""What an attached script leaves in its run folder never stalls the tool (issue 45, item 3): the
folder's files are read as regular files of bounded size only, never by waiting on a FIFO or following
a link, and the run ends with a note and a final status in History."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from diagnostics.analyses.attach import protocol
from diagnostics.analyses.attach.protocol import AttachConfig
from diagnostics.attach.command import check_command
from diagnostics.attach.session import Session, read_live
from diagnostics.cli.main import main
from diagnostics.store import Store
from tests.attach.harness import SCRIPTS, env_for, run_attached

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="FIFOs and /dev/zero: Linux")


def test_the_protocols_reader_refuses_fifos_devices_links_and_big_files_by_name(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    os.symlink("/dev/zero", tmp_path / "zero.json")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "ok.json").write_text('{"step": 3}')
    os.symlink(tmp_path / "real", tmp_path / "linked")
    (tmp_path / "big.jsonl").write_text('{"n": 1}\n' * 200)
    refused: list = []
    t0 = time.monotonic()
    assert protocol.read_json(str(tmp_path / "fifo.json"), "default", refused) == "default"
    assert protocol.read_json(str(tmp_path / "zero.json"), "default", refused) == "default"
    assert protocol.read_json("/dev/zero", "default", refused) == "default"
    assert protocol.read_json(str(tmp_path / "linked" / "ok.json"), "default", refused) == "default"
    assert protocol.read_jsonl(str(tmp_path / "big.jsonl"), refused, max_bytes=1000) == []
    assert protocol.read_json(str(tmp_path / "missing.json"), "default", refused) == "default"
    assert time.monotonic() - t0 < 1.0  # nothing waited on
    assert refused == [f"{tmp_path}/fifo.json is a FIFO: not read",
                       f"{tmp_path}/zero.json is a symbolic link: not read",
                       "/dev/zero is a character device: not read",
                       f"{tmp_path}/linked is not a folder of the run (Not a directory): ok.json not read",
                       f"{tmp_path}/big.jsonl is 1,800 bytes, over the 1,000 read back: not read"]
    assert protocol.read_json(str(tmp_path / "real" / "ok.json")) == {"step": 3}
    assert len(protocol.read_jsonl(str(tmp_path / "big.jsonl"))) == 200


def test_a_status_file_made_a_fifo_never_blocks_the_live_view_nor_the_analysis(tmp_path):
    store = Store(tmp_path / "store")
    cmd = check_command([sys.executable, str(SCRIPTS / "fifo_status.py"), "1.5"], cwd=str(tmp_path))
    seen = []
    session = Session(cmd, AttachConfig(), store=store, on_live=seen.append, timeout_s=60)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", session.run()), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(60)
    assert not t.is_alive(), "the tool blocked on the script's FIFO"
    out = box["out"]
    assert out.exit_code == 0 and time.monotonic() - t0 < 30
    note = next(n for n in out.result.notes if n.startswith("not read from the run folder"))
    for what in ("proc-4242/status.json (a FIFO)", "proc-4242/steps.jsonl (a FIFO)",
                 "proc-4242/meta.json (a symbolic link)", "window.json (a symbolic link)", "trace.json.gz (a FIFO)"):
        assert what in note, note
    rec = store.get(out.run_id)
    assert rec.status == "ok" and rec.result["notes"] and "trace.json.gz" not in rec.artifacts
    assert read_live(out.run_dir).processes == 0  # the planted status is never read


def test_the_run_cli_ends_promptly_with_a_note_and_a_final_row(tmp_path):
    ran = run_attached(tmp_path, "fifo_status.py", "1", timeout=90)
    assert ran.code == 0, ran.stderr[-3000:]
    assert any("proc-4242/status.json (a FIFO)" in n for n in ran.result["notes"])
    assert "\x1b" not in ran.stderr and "\x07" not in ran.stderr  # the planted name is printed escaped
    assert "proc-4242/x\\x1b[2J\\x1b]0;owned\\x07 (a FIFO)" in ran.stderr
    rows = Store(tmp_path / "store").list()
    assert [(r.analysis, r.status) for r in rows] == [("attach", "ok")]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_kill_9_of_the_run_cli_ends_the_script_its_helper_and_its_daemon_and_history_marks_the_row(tmp_path):
    """issue 45, item 4: the tool killed by SIGKILL (no handler runs) leaves nothing running."""
    proc = subprocess.Popen([sys.executable, "-m", "diagnostics", "run", "--json", "--no-report", "--",
                             sys.executable, str(SCRIPTS / "helpers.py")], cwd=tmp_path, env=env_for(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line, deadline = "", time.monotonic() + 60
        while not line.startswith("pids") and time.monotonic() < deadline:
            line = proc.stdout.readline()
        pids = [int(x) for x in line.split()[1:]]
        assert len(pids) == 3 and all(_alive(p) for p in pids), (line, proc.stderr.read() if proc.poll() else "")
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if _alive(p)] == []
    finally:
        for p in ([proc.pid] + locals().get("pids", [])):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    rec = Store(tmp_path / "store").list()[0]
    assert rec.status == "running"  # nobody finished it: the tool was killed
    assert main(["history", "list", "--data-dir", str(tmp_path / "store")]) == 0
    rec = Store(tmp_path / "store").get(rec.id)
    assert rec.status == "interrupted" and f"pid {proc.pid}) stopped before it finished" in rec.error


def test_a_stop_reaches_the_script_through_its_guardian_and_the_exit_code_is_the_scripts(tmp_path):
    store = Store(tmp_path / "store")
    cmd = check_command([sys.executable, "-c", "import time\ntry:\n time.sleep(60)\nexcept KeyboardInterrupt:\n"
                         " raise SystemExit(7)"], cwd=str(tmp_path))
    out = Session(cmd, AttachConfig(), store=store, timeout_s=1.0).run()
    assert out.exit_code == 7 and out.stop_reason == "stopped after the --timeout of 1 s"
    assert store.get(out.run_id).status == "cancelled"
