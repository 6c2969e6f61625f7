import json

from diagnostics.store import Store


def test_write_reopen_list_and_cache(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec={"name": "mlp"}, options={"a": 1}, cache_key="k1",
                           model_label="mlp (sample)", device="cpu")
    assert store.get(rid).status == "running"
    store.finish_run(rid, "ok", result={"metrics": {"params_total": 5}, "rows": [1, 2]})
    again = Store(tmp_path)  # a fresh handle on the same folder: nothing lost
    rec = again.get(rid)
    assert rec.status == "ok" and rec.result["rows"] == [1, 2] and rec.metrics == {"params_total": 5}
    assert rec.options == {"a": 1} and rec.duration_s >= 0
    assert [r.id for r in again.list()] == [rid]
    assert again.list()[0].result is None  # listing leaves bodies out
    assert again.find_cached("k1").id == rid
    assert again.find_cached("other") is None


def test_failed_runs_are_not_cache_hits(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec=None, options={}, cache_key="k", model_label=None, device="cpu")
    store.finish_run(rid, "error", error="the model rejected its inputs")
    assert store.find_cached("k") is None
    assert store.get(rid).error == "the model rejected its inputs"


def test_dead_running_rows_are_marked_interrupted(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec=None, options={}, cache_key=None, model_label=None, device="cpu",
                           pid=2**22 + 12345)
    assert store.mark_interrupted() == 1
    rec = store.get(rid)
    assert rec.status == "interrupted" and "stopped before it finished" in rec.error


def test_a_store_that_is_not_a_database_is_moved_aside_and_a_fresh_one_serves(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec=None, options={}, cache_key="k", model_label="m", device="cpu")
    art = store.artifact_dir(rid)
    art.mkdir(parents=True, exist_ok=True)
    (art / "result.bin").write_bytes(b"kept")
    store.finish_run(rid, "ok", result={"metrics": {}})
    (tmp_path / "runs.sqlite").write_bytes(b"this is not a database, it was overwritten by a job" * 100)
    for side in ("-wal", "-shm"):
        (tmp_path / f"runs.sqlite{side}").unlink(missing_ok=True)
    again = Store(tmp_path)
    aside = list(tmp_path.glob("runs.sqlite.corrupt-*"))
    assert [p.name for p in aside if "-wal" not in p.name and "-shm" not in p.name] and again.notices
    assert "moved aside to runs.sqlite.corrupt-" in again.notices[0] and "artifacts are kept" in again.notices[0]
    assert (art / "result.bin").read_bytes() == b"kept"  # stored artifacts are never deleted
    new = again.create_run("summary", spec=None, options={}, cache_key="k2", model_label="m", device="cpu")
    again.finish_run(new, "ok", result={"metrics": {}})
    assert [r.id for r in again.list()] == [new]


def test_a_store_damaged_while_in_use_is_set_aside_on_the_next_call(tmp_path):
    store = Store(tmp_path)
    (tmp_path / "runs.sqlite").write_bytes(b"\0garbage" * 1000)
    for side in ("-wal", "-shm"):
        (tmp_path / f"runs.sqlite{side}").unlink(missing_ok=True)
    try:
        store.list()
    except Exception:
        pass  # the call that finds the damage may fail; the next one starts afresh
    assert store.list() == [] and store.notices


# ------------------------------------------------------------------------------ store errors (issue #30)
import os  # noqa: E402
import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from diagnostics.store import StoreError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: Run a snippet in a user + mount namespace of its own, where it may mount a small tmpfs (a full or
#: read-only disk without touching the machine's) and drop its capabilities (root then obeys file modes).
ISOLATED = r'''
import ctypes, json, os, sys, traceback
sys.path.insert(0, ROOT)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
uid, gid = os.getuid(), os.getgid()
if libc.unshare(0x10000000 | 0x00020000) != 0:
    print(json.dumps({"skip": "no user namespace: " + os.strerror(ctypes.get_errno())}))
    sys.exit(0)
for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
    with open(f"/proc/self/{name}", "w") as f:
        f.write(text)
libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None)

def tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, f"size={size}".encode()) != 0:
        print(json.dumps({"skip": "no tmpfs here: " + os.strerror(ctypes.get_errno())}))
        sys.exit(0)

def read_only(path):
    assert libc.mount(None, path.encode(), None, 32 | 4096 | 1, None) == 0, os.strerror(ctypes.get_errno())

def drop_capabilities():
    from diagnostics.confine import drop_capabilities as drop
    drop()

def seeded(folder):
    """A store holding one finished run."""
    store = Store(folder)
    rid = store.create_run("summary", spec=None, options={}, cache_key="k", model_label="kept", device="cpu")
    store.finish_run(rid, "ok", result={"metrics": {"params_total": 5}})
    return store, rid

def attempt(fn):
    try:
        return {"ok": repr(fn())}
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e)}

from diagnostics.store import Store
out = {}
'''


def isolated(body: str, folder: Path) -> dict:
    import json
    import textwrap

    code = ISOLATED.replace("ROOT", repr(str(ROOT))) + f"D = {str(folder)!r}\n" + textwrap.dedent(body) + \
        "\nprint(json.dumps(out))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    return got


def test_a_read_only_data_folder_is_one_clear_message_and_nothing_changes(tmp_path):
    got = isolated('''
        tmpfs(D, "16m")
        store, rid = seeded(D + "/data")
        before = open(D + "/data/runs.sqlite", "rb").read()
        read_only(D)
        out["open"] = attempt(lambda: Store(D + "/data").create_run("summary", spec=None, options={}, cache_key="k",
                                                                     model_label=None, device="cpu"))
        out["fresh"] = attempt(lambda: Store(D + "/elsewhere"))
        out["unchanged"] = open(D + "/data/runs.sqlite", "rb").read() == before
    ''', tmp_path / "disk")
    disk = tmp_path / "disk"
    assert got["open"] == {"type": "StoreError", "message": (
        f"the run store {disk}/data/runs.sqlite cannot be written: the data folder {disk}/data is on a read-only "
        "file system. Make it writable, or set TORCHSCOPE_DATA_DIR to a writable folder; nothing stored was "
        "changed")}, got
    assert got["fresh"]["type"] == "StoreError" and "read-only file system" in got["fresh"]["message"], got
    assert got["unchanged"]


def test_a_store_this_user_may_not_write_names_the_file_and_its_permissions(tmp_path):
    got = isolated('''
        tmpfs(D, "16m")
        store, rid = seeded(D + "/data")
        os.chmod(D + "/data/runs.sqlite", 0o444)
        os.makedirs(D + "/locked")
        os.chmod(D + "/locked", 0o555)
        drop_capabilities()  # as root: obey the modes like any user
        out["file"] = attempt(lambda: Store(D + "/data").create_run("summary", spec=None, options={}, cache_key="k",
                                                                     model_label=None, device="cpu"))
        out["folder"] = attempt(lambda: Store(D + "/locked/data"))
        out["kept"] = Store(D + "/data").get(rid).model_label if out["file"].get("type") else None
    ''', tmp_path / "disk")
    disk, uid = tmp_path / "disk", os.geteuid()
    assert got["file"]["type"] == "StoreError", got
    assert got["file"]["message"].startswith(
        f"the run store {disk}/data/runs.sqlite cannot be written: the file {disk}/data/runs.sqlite is not writable "
        f"by this user (uid {uid}): mode 444, owner uid {uid}. Make it writable, or set TORCHSCOPE_DATA_DIR"), got
    assert got["folder"]["type"] == "StoreError", got
    assert f"the folder {disk}/locked is not writable by this user (uid {uid}): mode 555" in got["folder"]["message"]


def test_a_full_disk_says_how_much_is_needed_and_loses_nothing(tmp_path):
    got = isolated('''
        tmpfs(D, "4m")
        store, kept = seeded(D + "/data")
        rid = store.create_run("summary", spec=None, options={}, cache_key="k2", model_label="new", device="cpu")
        with open(D + "/filler", "wb") as f:  # the disk fills up meanwhile
            try:
                while True:
                    f.write(b"x" * 65536)
                    f.flush()
            except OSError:
                pass
        out["finish"] = attempt(lambda: store.finish_run(rid, "ok", result={"rows": ["y" * 1000] * 1000}))
        os.unlink(D + "/filler")
        again = Store(D + "/data")
        out["kept"] = [again.get(kept).status, again.get(kept).result]
    ''', tmp_path / "disk")
    assert got["finish"]["type"] == "StoreError", got
    message = got["finish"]["message"]
    assert message.startswith(f"the disk holding the run store {tmp_path}/disk/data is full (")
    assert "storing this run needs about 1.96 MiB more" in message and "TORCHSCOPE_DATA_DIR" in message, message
    assert message.endswith("nothing stored was lost")
    assert got["kept"] == ["ok", {"metrics": {"params_total": 5}}]


def test_a_full_disk_is_one_message_from_the_runner_too(tmp_path):
    """The runner turns the store's refusal into the job's error, without starting a worker (a
    simulated ENOSPC: no disk is filled here)."""
    from diagnostics import ModelSpec
    from diagnostics.runner import Job, run_job

    class Full(Store):
        def _open(self):
            db = super()._open()
            if not self._ready:
                return db

            class Refusing:
                def execute(self, sql, *args):
                    if sql.lstrip().upper().startswith(("INSERT", "UPDATE")):
                        raise sqlite3.OperationalError("database or disk is full")
                    return db.execute(sql, *args)

                def close(self):
                    db.close()

            return Refusing()

    store = Full(tmp_path)
    out = run_job(Job("summary", ModelSpec(name="mlp")), store=store, timeout_s=60)
    assert out.status == "error" and out.error_type == "StoreError"
    assert out.error.startswith(f"the disk holding the run store {tmp_path} is full (") and "more" in out.error
    assert out.run_id is None and Store(tmp_path).count() == 0


def test_a_database_with_a_foreign_runs_table_is_moved_aside_like_a_corrupt_one(tmp_path):
    db = sqlite3.connect(tmp_path / "runs.sqlite")
    db.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO runs VALUES ('r1', 'someone else''s data')")
    db.commit()
    db.close()
    store = Store(tmp_path)
    aside = list(tmp_path.glob("runs.sqlite.corrupt-*"))
    assert len(aside) == 1 and len(store.notices) == 1
    assert store.notices[0].startswith(f"the run store {tmp_path / 'runs.sqlite'} could not be read (its runs table "
                                       "lacks the columns analysis, status, cache_key")
    assert f"moved aside to {aside[0].name}" in store.notices[0]
    old = sqlite3.connect(aside[0])
    assert old.execute("SELECT name FROM runs").fetchall() == [("someone else's data",)]  # nothing lost
    old.close()
    rid = store.create_run("summary", spec=None, options={}, cache_key="k", model_label="m", device="cpu")
    store.finish_run(rid, "ok", result={"metrics": {}})
    assert Store(tmp_path).get(rid).status == "ok" and Store(tmp_path).notices == []


def test_history_does_not_load_a_huge_artifact_list(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("summary", spec=None, options={}, cache_key="k", model_label="m", device="cpu")
    huge = {f"file{i:05d}.txt": f"/x/{i}" for i in range(20_002)}  # written before lists were bounded
    store.finish_run(rid, "ok", result={"metrics": {}}, artifacts=huge)
    assert store.list()[0].artifacts == {}
    assert len(store.get(rid).artifacts) == 20_002  # the run itself still has it


def test_a_result_a_full_disk_refuses_still_ends_the_row_with_why(tmp_path):
    """ENOSPC while the result is written (simulated: writes of more than 4 KiB are refused): the row is
    not left 'running'; it ends 'error' saying the status the run ended with and why its result is missing."""
    import pytest

    from diagnostics.store import StoreError

    class Full(Store):
        def _open(self):
            db = super()._open()
            if not self._ready:
                return db

            class Refusing:
                def execute(self, sql, *args):
                    if sql.lstrip().upper().startswith("UPDATE") and sum(len(str(a)) for a in args[0]) > 4096:
                        raise sqlite3.OperationalError("database or disk is full")
                    return db.execute(sql, *args)

                def close(self):
                    db.close()

            return Refusing()

    store = Full(tmp_path)
    rid = store.create_run("summary", spec=None, options={}, cache_key=None, model_label=None, device="cpu")
    with pytest.raises(StoreError, match="is full"):
        store.finish_run(rid, "ok", result={"metrics": {"params_total": 5}, "rows": ["x" * 100] * 100})
    rec = Store(tmp_path).get(rid)
    assert rec.status == "error" and rec.result is None
    assert rec.error.startswith("the run ended 'ok' but its result could not be stored: the disk holding the run "
                                f"store {tmp_path} is full (")
