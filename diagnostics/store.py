"""SQLite run history plus an artifacts folder per run.

Every job is written as 'running' before it starts and finished with its status, result and error,
so a run is never lost and a worker that dies mid-job leaves a 'crashed' row with the reason; each
write is one statement, so a row is never half-written. WAL mode and a busy timeout let the
dashboard, the CLI and several sessions write at once. A row remembers the process that owns it
(``owner_pid``, the dashboard or CLI) and its worker (``pid``): when the owner is gone, nobody will
finish the row, and ``mark_interrupted()`` (called when a dashboard starts and by ``history``) marks
it 'interrupted' with the reason. A row is read defensively (``RunRecord.damaged``): a column that
cannot be read is shown empty with what is wrong, and the rest of History works.

The store belongs to the dashboard and CLI processes alone: a job's worker never opens it and its
sandbox cannot reach the data folder. A file that is not (or no longer) a database, cannot be
opened, or holds a ``runs`` table without the columns this version needs, is moved aside to
``runs.sqlite.corrupt-<time>`` (its -wal and -shm with it) and a fresh store is started; ``notices``
says so, for the dashboard and the CLI to show once. Artifacts are never touched. A store that
cannot be written (a read-only folder, file or file system) or a full disk is a ``StoreError``
whose one message says where, why and what to do; nothing stored is changed by it.
"""

from __future__ import annotations

import errno
import fcntl
import dataclasses
import json
import math
import os
import shutil
import sqlite3
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from diagnostics.errors import TorchScopeError
from diagnostics.results import to_plain
from diagnostics.units import human_bytes

DATA_DIR_ENV = "TORCHSCOPE_DATA_DIR"
#: History's listing loads a run's artifact list only up to this size (lists are bounded when
#: written: diagnostics.jobfiles.MAX_LISTED names).
LIST_ARTIFACTS_BYTES = 64 << 10

FINAL_STATUSES = ("ok", "error", "timeout", "crashed", "oom", "cancelled", "interrupted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    analysis TEXT NOT NULL,
    status TEXT NOT NULL,
    cache_key TEXT,
    model_label TEXT,
    spec_json TEXT,
    options_json TEXT,
    device TEXT,
    source TEXT,
    pid INTEGER,
    started REAL NOT NULL,
    finished REAL,
    duration_s REAL,
    metrics_json TEXT,
    result_json TEXT,
    error TEXT,
    artifacts_json TEXT
);
CREATE INDEX IF NOT EXISTS runs_cache ON runs(cache_key, status);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status);
CREATE INDEX IF NOT EXISTS runs_started ON runs(started);
"""


#: SQLite errors that mean the file is not a usable database (as opposed to busy, locked or full);
#: "no such column" and "has no column named": a ``runs`` table of another program or version.
_UNUSABLE = ("file is not a database", "database disk image is malformed", "unable to open database file",
             "no such column", "has no column named", "lacks the columns")
#: SQLite errors of a store that cannot be written, and of a full disk.
_READ_ONLY = ("attempt to write a readonly database", "readonly database", "read-only file system")
_FULL = ("database or disk is full", "no space left on device")
#: Space a write is said to need beyond its data: SQLite's journal pages and indexes.
WRITE_MARGIN = 1 << 20
#: Columns the store reads and writes (owner_pid is added to older stores).
COLUMNS = ("id", "analysis", "status", "cache_key", "model_label", "spec_json", "options_json", "device", "source",
           "pid", "started", "finished", "duration_s", "metrics_json", "result_json", "error", "artifacts_json")


class StoreError(TorchScopeError):
    """The run store cannot be written (read-only) or its disk is full: the message says where and what to do."""


def _check_columns(db) -> None:
    """A ``runs`` table of another program or version (columns missing) is not this store."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    missing = [c for c in COLUMNS if c not in columns]
    if columns and missing:
        raise sqlite3.DatabaseError(f"its runs table lacks the columns {', '.join(missing)}")


def _create_schema(db) -> None:
    _check_columns(db)
    db.executescript(_SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    if "owner_pid" not in columns:  # stores written before owner_pid existed
        try:
            db.execute("ALTER TABLE runs ADD COLUMN owner_pid INTEGER")
        except sqlite3.OperationalError as e:  # another process added it meanwhile
            if "duplicate column" not in str(e):
                raise


def default_data_dir() -> Path:
    """$TORCHSCOPE_DATA_DIR, else ~/.torchscope."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".torchscope"


@dataclass(frozen=True)
class RunRecord:
    id: str
    analysis: str
    status: str
    cache_key: str | None
    model_label: str | None
    spec: dict | None
    options: dict
    device: str | None
    source: str | None
    started: float
    finished: float | None
    duration_s: float | None
    metrics: dict
    result: dict | None
    error: str | None
    artifacts: dict
    #: What is wrong with the stored row (a column that could not be read), None when nothing is:
    #: that column reads as empty and the rest of the row, and of History, as usual.
    damaged: str | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _alive_since(pid: int | None, started: float) -> bool:
    """True when process ``pid`` exists and was already running at ``started`` (not a reused pid)."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).create_time() <= started + 1.0
    except psutil.Error:
        return False


#: Timestamps a stored run may have (epoch seconds): 1970 to the year 3000; anything else is damage.
LATEST_TIME = 32503680000.0
#: What each JSON column must hold (the type its readers take).
_KINDS = {"spec_json": (dict, type(None)), "options_json": (dict,), "metrics_json": (dict,),
          "result_json": (dict, type(None)), "artifacts_json": (dict,)}


def _loads(text, default, column: str, damage: list):
    """A JSON column of a row: its value, or ``default`` with what is wrong added to ``damage``."""
    if text is None:
        return default
    if not isinstance(text, (str, bytes)):
        damage.append(f"{column} holds a {type(text).__name__}, not JSON text")
        return default
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except RecursionError:
        damage.append(f"{column} is nested too deep to read")
        return default
    except ValueError as e:
        damage.append(f"{column} is not valid JSON ({str(e)[:80]})")
        return default
    kinds = _KINDS.get(column, (object,))
    if not isinstance(value, kinds):
        want = " or ".join("null" if k is type(None) else "an object" if k is dict else k.__name__ for k in kinds)
        damage.append(f"{column} holds {_what(value)}, not {want}")
        return default
    return value


def _what(value) -> str:
    return {list: "a list", str: "a string", dict: "an object", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _time(value, column: str, damage: list, default):
    """A stored timestamp or duration: a finite number of seconds in range, else ``default`` (damage noted)."""
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not (column == "duration_s" or 0 <= value <= LATEST_TIME) or value < 0):
        shown = repr(value)[:40]
        damage.append(f"{column} {shown} is not a " + ("duration" if column == "duration_s" else "time"))
        return default
    return float(value)


def _metrics(metrics: dict, damage: list) -> dict:
    """The metrics a reader can take: numbers, booleans, text, None; a nested value is dropped as damage."""
    bad = [k for k, v in metrics.items() if not (v is None or isinstance(v, (int, float, str, bool)))]
    if bad:
        damage.append(f"metrics_json: {', '.join(map(repr, bad[:5]))} not a number")
    return {str(k): v for k, v in metrics.items() if k not in bad}


def _text(value, column: str, damage: list) -> str | None:
    if value is None or isinstance(value, str):
        return value
    damage.append(f"{column} holds a {type(value).__name__}, not text")
    return str(value)


class Store:
    def __init__(self, data_dir: Path | str | None = None):
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        self.artifacts_root = self.data_dir / "artifacts"
        self.db_path = self.data_dir / "runs.sqlite"
        try:
            self.artifacts_root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._os_error(e, self.artifacts_root) from None
        #: What happened to the store that users should hear about (a file moved aside), oldest first.
        self.notices: list[str] = []
        self._ready = False
        with self._connect() as db:
            _create_schema(db)
        self._ready = True  # from now on a missing table means the file was emptied under us

    # -- what cannot be written ----------------------------------------------------------
    def _read_only(self) -> str | None:
        """Why the store cannot be written (the folder, the file, the file system), or None."""
        folder = self.data_dir  # or the nearest folder above it that exists (it is made there)
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        try:
            if os.statvfs(folder).f_flag & os.ST_RDONLY:
                return f"the data folder {self.data_dir} is on a read-only file system"
        except OSError:
            pass
        for path, what in ((folder, "folder"), (self.db_path, "file")):
            if os.path.exists(path) and not os.access(path, os.W_OK | (os.X_OK if what == "folder" else 0)):
                st = os.stat(path)
                return (f"the {what} {path} is not writable by this user (uid {os.geteuid()}): mode "
                        f"{st.st_mode & 0o777:03o}, owner uid {st.st_uid}")
        return None

    def _read_only_error(self, why: str) -> StoreError:
        return StoreError(f"the run store {self.db_path} cannot be written: {why}. Make it writable, or set "
                          f"{DATA_DIR_ENV} to a writable folder; nothing stored was changed")

    def _full_error(self, need: int) -> StoreError:
        try:
            free = shutil.disk_usage(self.data_dir).free
        except OSError:
            free = 0
        return StoreError(f"the disk holding the run store {self.data_dir} is full ({human_bytes(free)} free): "
                          f"storing this run needs about {human_bytes(need + WRITE_MARGIN)} more. Free some space "
                          f"there, or set {DATA_DIR_ENV} to a folder on another disk; nothing stored was lost")

    def _os_error(self, e: OSError, path: Path) -> TorchScopeError:
        if e.errno == errno.ENOSPC:
            return self._full_error(0)
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return self._read_only_error(self._read_only() or f"{path}: {e.strerror}")
        return StoreError(f"the run store's folder {path} could not be made: {e.strerror}; set {DATA_DIR_ENV} "
                          "to a writable folder")

    def _store_error(self, e: Exception, need: int = 0) -> StoreError | None:
        """The StoreError an SQLite error means (read-only store, full disk), or None."""
        text = str(e).lower()
        if any(m in text for m in _FULL):
            return self._full_error(need)
        if any(m in text for m in _READ_ONLY):
            return self._read_only_error(self._read_only() or "SQLite says it is read-only")
        if "unable to open database file" in text or "disk i/o error" in text:
            why = self._read_only()
            if why:
                return self._read_only_error(why)
            try:
                if shutil.disk_usage(self.data_dir).free < WRITE_MARGIN:
                    return self._full_error(need)
            except OSError:
                pass
        return None

    def _open(self):
        if not self.db_path.exists():
            why = self._read_only()
            if why:  # SQLite would say only "unable to open database file"
                raise self._read_only_error(why)
        db = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA busy_timeout=30000")
        except BaseException:
            db.close()
            raise
        return db

    @contextmanager
    def _connect(self, need: int = 0):
        """A connection; ``need``: bytes the caller's write adds (said when the disk is full)."""
        db = None
        try:
            db = self._open()
            if not self._ready:
                _check_columns(db)
        except sqlite3.DatabaseError as e:
            if db is not None:
                db.close()
            known = self._store_error(e, need)
            if known is not None:
                raise known from None
            if not self._unusable(e):
                raise
            self._set_aside(e)  # then carry on with a fresh store
            db = self._open()
            try:
                _create_schema(db)
            except BaseException:
                db.close()
                raise
        if self._ready:
            try:
                db.execute("SELECT 1 FROM runs LIMIT 0")
            except sqlite3.OperationalError as e:
                if "no such table" not in str(e):
                    db.close()
                    raise
                _create_schema(db)  # emptied (truncated or replaced by an empty database): start afresh
                self.notices.append(f"the run store {self.db_path} was emptied while in use; a fresh store was "
                                    "started. Runs stored before are lost from History; their artifacts are kept.")
        try:
            yield db
        except sqlite3.DatabaseError as e:
            known = self._store_error(e, need)
            if known is not None:
                raise known from None
            if self._unusable(e):  # damaged past its header: this call fails, the next starts afresh
                self._set_aside(e)
            raise
        finally:
            db.close()

    def _unusable(self, e: Exception) -> bool:
        return any(m in str(e) for m in _UNUSABLE) and os.path.lexists(self.db_path)

    def _set_aside(self, error: Exception) -> None:
        """Move an unusable runs.sqlite (with its -wal and -shm) to runs.sqlite.corrupt-<time>.

        Under a lock, and only if it is still unusable: another process may have done it already."""
        with open(self.data_dir / "runs.sqlite.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                db = self._open()
                try:
                    db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
                    _check_columns(db)
                finally:
                    db.close()
                return  # usable again (set aside and restarted by another process)
            except sqlite3.DatabaseError as e:
                if not self._unusable(e):
                    return
            stamp = time.strftime("%Y%m%d-%H%M%S")
            target, n = self.data_dir / f"runs.sqlite.corrupt-{stamp}", 1
            while os.path.lexists(target):
                n += 1
                target = self.data_dir / f"runs.sqlite.corrupt-{stamp}-{n}"
            try:
                os.replace(self.db_path, target)
                for suffix in ("-wal", "-shm"):  # a stale log must not be replayed into the fresh store
                    side = Path(f"{self.db_path}{suffix}")
                    if os.path.lexists(side):
                        os.replace(side, Path(f"{target}{suffix}"))
            except OSError as e:
                raise self._os_error(e, self.db_path) from None
        self.notices.append(f"the run store {self.db_path} could not be read ({error}); it was moved aside to "
                            f"{target.name} and a fresh store was started. Runs stored before are not listed; "
                            "their artifacts are kept.")

    # -- writing -------------------------------------------------------------------------
    def create_run(self, analysis: str, *, spec: dict | None, options: dict | None, cache_key: str | None,
                   model_label: str | None, device: str | None, source: str = "app", pid: int | None = None) -> str:
        """Write a 'running' row before the job starts; ``pid`` is the owning process (default: this one)."""
        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]
        owner = pid or os.getpid()
        with self._connect() as db:
            db.execute(
                "INSERT INTO runs (id, analysis, status, cache_key, model_label, spec_json, options_json, device,"
                " source, pid, owner_pid, started) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, analysis, "running", cache_key, model_label, json.dumps(spec),
                 json.dumps(options or {}, default=str), device, source, owner, owner, time.time()),
            )
        return run_id

    def set_pid(self, run_id: str, pid: int) -> None:
        """Record the worker process running this job."""
        with self._connect() as db:
            db.execute("UPDATE runs SET pid=? WHERE id=?", (pid, run_id))

    def finish_run(self, run_id: str, status: str, *, result: dict | None = None, error: str | None = None,
                   artifacts: dict | None = None) -> None:
        if status not in FINAL_STATUSES:
            raise ValueError(f"unknown final status {status!r}")
        # A typed result (diagnostics.results) is stored as its plain form, the JSON results.to_json writes;
        # RunRecord.result reads that plain dict back, and results.decode makes it typed again.
        result = to_plain(result)
        metrics = (result or {}).get("metrics") or {}
        now = time.time()
        values = (json.dumps(metrics, default=str), None if result is None else json.dumps(result, default=str),
                  error, json.dumps(artifacts or {}))
        try:
            with self._connect(need=sum(len(v) for v in values if v)) as db:
                db.execute(
                    "UPDATE runs SET status=?, finished=?, duration_s=?-started, metrics_json=?, result_json=?,"
                    " error=?, artifacts_json=? WHERE id=?",
                    (status, now, now, *values, run_id),
                )
        except StoreError as e:
            if result is not None or artifacts:
                self._end_without_result(run_id, status, e)
            raise

    def _end_without_result(self, run_id: str, status: str, e: StoreError) -> bool:
        """A run whose result could not be written (a full disk) still ends: 'error', with why and the
        status it ended with, in a row of a few hundred bytes (the space SQLite's freed pages often
        still have). True when that was written; the StoreError is raised either way."""
        why = (f"the run ended '{status}' but its result could not be stored: {e}")[:2000]
        try:
            with self._connect() as db:
                db.execute("UPDATE runs SET status='error', finished=?, duration_s=?-started, metrics_json=NULL,"
                           " result_json=NULL, error=?, artifacts_json='{}' WHERE id=? AND status='running'",
                           (time.time(), time.time(), why, run_id))
            return True
        except (StoreError, sqlite3.Error):
            return False

    def artifact_dir(self, run_id: str) -> Path:
        if not run_id or "/" in run_id or "\\" in run_id or run_id.startswith("."):
            raise ValueError(f"bad run id {run_id!r}")
        return self.artifacts_root / run_id

    def delete(self, run_id: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM runs WHERE id=?", (run_id,))
        shutil.rmtree(self.artifact_dir(run_id), ignore_errors=True)

    def mark_interrupted(self) -> int:
        """Mark 'running' rows whose owning process is gone as interrupted; returns how many.

        Rows owned by a live process (another dashboard, a CLI run) are left alone. A pid that
        was reused by a process started after the run began does not count as alive.
        """
        with self._connect() as db:
            rows = db.execute("SELECT id, COALESCE(owner_pid, pid), started FROM runs WHERE status='running'"
                              ).fetchall()
        stale = [(rid, pid) for rid, pid, started in rows
                 if not _alive_since(pid if isinstance(pid, int) else None, _time(started, "started", [], 0.0))]
        for rid, pid in stale:
            with self._connect() as db:  # only if still running: its owner may have just finished it
                db.execute(
                    "UPDATE runs SET status='interrupted', finished=?, duration_s=?-started, error=? "
                    "WHERE id=? AND status='running'",
                    (time.time(), time.time(), "interrupted: the process running this job (the dashboard or "
                     f"the CLI{f', pid {pid}' if isinstance(pid, int) else ''}) stopped before it finished "
                     "and stored no status (it was killed, or the machine stopped)", rid))
        return len(stale)

    # -- reading -------------------------------------------------------------------------
    _COLUMNS = ("id, analysis, status, cache_key, model_label, spec_json, options_json, device, source, started,"
                " finished, duration_s, metrics_json, {result}, error, artifacts_json")

    def _record(self, row) -> RunRecord:
        """A row read defensively: a column that cannot be read (JSON that is not, or not an object,
        or nested too deep to decode; a time that is not one) reads as empty, and ``damaged`` says
        what is wrong. The row is still listed; nothing stored is rewritten."""
        (rid, analysis, status, key, label, spec, options, device, source, started, finished, dur, metrics,
         result, error, artifacts) = row
        damage: list[str] = []
        record = RunRecord(
            str(rid), _text(analysis, "analysis", damage) or "?", _text(status, "status", damage) or "?",
            _text(key, "cache_key", damage), _text(label, "model_label", damage),
            _loads(spec, None, "spec_json", damage), _loads(options, {}, "options_json", damage),
            _text(device, "device", damage), _text(source, "source", damage),
            _time(started, "started", damage, 0.0), _time(finished, "finished", damage, None),
            _time(dur, "duration_s", damage, None),
            _metrics(_loads(metrics, {}, "metrics_json", damage), damage),
            _loads(result, None, "result_json", damage), _text(error, "error", damage),
            _loads(artifacts, {}, "artifacts_json", damage))
        if not damage:
            return record
        return dataclasses.replace(record, damaged="; ".join(damage))

    def get(self, run_id: str) -> RunRecord | None:
        with self._connect() as db:
            row = db.execute(f"SELECT {self._COLUMNS.format(result='result_json')} FROM runs WHERE id=?",
                             (run_id,)).fetchone()
        return None if row is None else self._record(row)

    def list(self, limit: int = 200, analysis: str | None = None) -> list[RunRecord]:
        """Newest first, without the (possibly large) result bodies, nor an artifact list past
        LIST_ARTIFACTS_BYTES (stores written before lists were bounded: ``get`` has it)."""
        columns = self._COLUMNS.format(result="NULL").replace(
            "artifacts_json", f"CASE WHEN length(artifacts_json) > {LIST_ARTIFACTS_BYTES} THEN NULL "
                              "ELSE artifacts_json END")
        sql = f"SELECT {columns} FROM runs"
        args: tuple = ()
        if analysis:
            sql += " WHERE analysis=?"
            args = (analysis,)
        sql += " ORDER BY started DESC LIMIT ?"
        with self._connect() as db:
            rows = db.execute(sql, args + (int(limit),)).fetchall()
        return [self._record(r) for r in rows]

    def find_cached(self, cache_key: str) -> RunRecord | None:
        """The newest successful run with this cache key, result included; a damaged row is no hit (the
        job runs again)."""
        with self._connect() as db:
            row = db.execute(
                f"SELECT {self._COLUMNS.format(result='result_json')} FROM runs WHERE cache_key=? AND status='ok'"
                " ORDER BY started DESC LIMIT 1", (cache_key,)).fetchone()
        rec = None if row is None else self._record(row)
        return None if rec is None or rec.damaged else rec

    def count(self) -> int:
        with self._connect() as db:
            return db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
