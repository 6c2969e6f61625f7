"""diagnostics.jobfiles: what a job wrote is read back only as regular files of bounded size, never
through a link, never waiting on a FIFO; its disk use is counted; its list stays bounded.

Each case builds the hostile entry itself (a symlink to a secret, a FIFO, a hard link, thousands of
files) and checks what the reader does with it, with a control that the same reader takes a plain file.
"""

import os
import stat
import threading
from pathlib import Path

import pytest

from diagnostics import jobfiles
from diagnostics.jobfiles import ArtifactError, Limits

SECRET = "root:$6$not-for-the-job$:19000:0:99999:7:::\n"


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "shadow"
    path.write_text(SECRET)
    return path


def test_a_regular_file_is_read_and_a_symlink_to_a_secret_is_refused(tmp_path, secret):
    (tmp_path / "plain.json").write_text("{}")
    assert jobfiles.read_bytes(tmp_path / "plain.json") == b"{}"  # control
    (tmp_path / "trace.json").symlink_to(secret)
    with pytest.raises(ArtifactError, match="trace.json is a symbolic link: not read"):
        jobfiles.read_bytes(tmp_path / "trace.json")


@pytest.mark.timeout(20)
def test_a_fifo_is_refused_at_once_instead_of_blocking(tmp_path):
    fifo = tmp_path / "worker.log"
    os.mkfifo(fifo)
    with pytest.raises(ArtifactError, match="worker.log is a FIFO: not read"):
        jobfiles.read_bytes(fifo)  # a plain open() would wait for a writer forever


def test_a_file_over_the_bound_and_a_path_outside_the_folder_are_refused(tmp_path, secret):
    big = tmp_path / "runs" / "big.bin"
    big.parent.mkdir()
    big.write_bytes(b"x" * 1000)
    assert jobfiles.size_of(big, within=tmp_path / "runs") == 1000
    with pytest.raises(ArtifactError, match="over the 100 B read here"):
        jobfiles.read_bytes(big, max_bytes=100)
    with pytest.raises(ArtifactError, match="is not in"):  # a result that names /etc/shadow, say
        jobfiles.read_bytes(secret, within=tmp_path / "runs")
    assert jobfiles.size_of(secret, within=tmp_path / "runs") is None
    (tmp_path / "runs" / "link").symlink_to(secret)
    assert jobfiles.size_of(tmp_path / "runs" / "link", within=tmp_path / "runs") is None


def make_job_folder(folder: Path, secret: Path) -> Path:
    job = folder / "run" / jobfiles.JOB_FOLDER
    (job / "distributed").mkdir(parents=True)
    (job / "trace.json").write_text('{"traceEvents": []}')
    (job / "distributed" / "rank0.pt.trace.json").write_text("{}")
    (job / "evil.json").symlink_to(secret)
    (job / "worker.log").write_text("forged by the job")  # the runner's name
    os.mkfifo(job / "pipe.json")
    os.link(secret, job / "hard.json")
    (job / "loop").symlink_to(job)  # a link to a folder: never walked into
    return job


def test_collect_keeps_regular_files_only_and_says_what_it_left(tmp_path, secret):
    job = make_job_folder(tmp_path, secret)
    run = job.parent
    (run / "worker.log").write_text("the runner's log")
    got = jobfiles.collect(job, run, Limits())
    assert set(got.kept) == {"trace.json", "distributed/rank0.pt.trace.json"}
    assert (run / "trace.json").read_text() == '{"traceEvents": []}' and not (run / "trace.json").is_symlink()
    assert (run / "distributed" / "rank0.pt.trace.json").is_file()
    assert (run / "worker.log").read_text() == "the runner's log"
    left = "; ".join(got.left)
    for name, why in (("evil.json", "a symbolic link"), ("pipe.json", "a FIFO"), ("worker.log", "the name is the runner's"),
                      ("hard.json", "a hard link to another file"), ("loop", "a symbolic link")):
        assert f"{name} ({why}" in left, left
    assert not got.over_limit
    assert SECRET not in "".join(p.read_text() for p in run.rglob("*") if p.is_file() and not p.is_symlink()
                                 and jobfiles.JOB_FOLDER not in p.parts)
    assert got.note().startswith("runner: not kept from the job's folder: ")


def test_a_hard_link_is_kept_only_when_its_other_link_is_in_the_trace_cache(tmp_path):
    cache = tmp_path / "trace_cache"
    (cache / "entry1").mkdir(parents=True)
    (cache / "entry1" / "events.feather").write_bytes(b"columns")
    job = tmp_path / "run" / jobfiles.JOB_FOLDER
    job.mkdir(parents=True)
    os.link(cache / "entry1" / "events.feather", job / "events.feather")
    got = jobfiles.collect(job, tmp_path / "run", Limits(), links_from=[cache])
    assert set(got.kept) == {"events.feather"} and not got.left
    assert (tmp_path / "run" / "events.feather").stat().st_ino == (cache / "entry1" / "events.feather").stat().st_ino
    os.link(tmp_path / "run" / "events.feather", job / "again.feather")
    got = jobfiles.collect(job, tmp_path / "run", Limits())  # no cache named: refused
    assert got.left == ["again.feather (a hard link to another file)"]


def test_collect_stops_at_the_limits_and_names_them(tmp_path):
    job = tmp_path / "run" / jobfiles.JOB_FOLDER
    job.mkdir(parents=True)
    for i in range(300):
        (job / f"f{i:04d}.txt").write_text("x")
    got = jobfiles.collect(job, tmp_path / "run", Limits(disk_bytes=1 << 30, files=100))
    assert len(got.kept) == 100
    assert got.over_limit == ("the job made more than 100 files and folders in its artifact and temp folders, over "
                              "its limit of 100 (set TORCHSCOPE_JOB_FILES)")
    job2 = tmp_path / "run2" / jobfiles.JOB_FOLDER
    job2.mkdir(parents=True)
    for i in range(4):
        (job2 / f"b{i}.bin").write_bytes(os.urandom(1 << 20))
    got = jobfiles.collect(job2, tmp_path / "run2", Limits(disk_bytes=(5 << 20) // 2, files=100))
    assert len(got.kept) == 2 and "over its disk quota of 2.50 MiB (set TORCHSCOPE_JOB_DISK_MB)" in got.over_limit


def test_usage_counts_blocks_and_entries_without_following_links(tmp_path, secret):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "data.bin").write_bytes(os.urandom(64 << 10))
    (tmp_path / "a" / "link").symlink_to("/usr")  # /usr's files are not this job's
    used = jobfiles.usage([tmp_path / "a"])
    assert used.files == 2 and 64 << 10 <= used.bytes < 1 << 20
    for i in range(50):
        (tmp_path / "a" / f"n{i}").touch()
    assert jobfiles.usage([tmp_path / "a"], stop_after=10).files == 11  # stops counting past the limit


def test_the_limits_are_declared_and_read_from_the_environment(monkeypatch):
    assert Limits() == Limits(jobfiles.DEFAULT_DISK_MB << 20, jobfiles.DEFAULT_FILES) == Limits.from_env()
    monkeypatch.setenv(jobfiles.DISK_ENV, "20")
    monkeypatch.setenv(jobfiles.FILES_ENV, "100")
    assert Limits.from_env() == Limits(20 << 20, 100)
    monkeypatch.setenv(jobfiles.FILES_ENV, "many")
    with pytest.raises(Exception, match="TORCHSCOPE_JOB_FILES='many' is not a number"):
        Limits.from_env()


def test_the_stored_listing_is_bounded_and_skips_links(tmp_path, secret):
    for i in range(jobfiles.MAX_LISTED + 50):
        (tmp_path / f"file{i:04d}.txt").touch()
    (tmp_path / "worker.log").touch()
    (tmp_path / "zz_link.json").symlink_to(secret)
    listed = jobfiles.listing(tmp_path)
    assert len(listed) == jobfiles.MAX_LISTED and "worker.log" in listed and "zz_link.json" not in listed


def test_relocate_points_the_results_paths_at_the_run_folder():
    result = {"artifacts": {"trace_json": "/d/run/.job/trace.json"}, "columns_dir": "/d/run/.job",
              "rows": [{"path": "/d/run/.job/x/y.pt", "other": "/d/run/.jobs/z"}], "n": 3}
    assert jobfiles.relocate(result, "/d/run/.job", "/d/run") == {
        "artifacts": {"trace_json": "/d/run/trace.json"}, "columns_dir": "/d/run",
        "rows": [{"path": "/d/run/x/y.pt", "other": "/d/run/.jobs/z"}], "n": 3}


def test_relocate_reaches_the_paths_inside_a_typed_result():
    """The runner decodes the worker's answer into its typed result before the paths are relocated."""
    from diagnostics.analyses.trace.result import CriticalPath, TraceCriticalPathResult

    typed = TraceCriticalPathResult(critical_path=CriticalPath(available=True, step=3,
                                                               trace_file="/d/run/.job/critical_path.json"))
    moved = jobfiles.relocate(typed, "/d/run/.job", "/d/run")
    assert moved.critical_path.trace_file == "/d/run/critical_path.json" and moved.critical_path.step == 3
    assert typed.critical_path.trace_file == "/d/run/.job/critical_path.json"  # a new record, the old one as it was


def test_remove_tree_removes_what_a_job_locked_and_never_follows_a_link(tmp_path, secret):
    tree = tmp_path / "tmp"
    (tree / "locked" / "deep").mkdir(parents=True)
    (tree / "locked" / "deep" / "f").write_text("x")
    (tree / "to_secret").symlink_to(secret)
    (tree / "to_outside").symlink_to(tmp_path)
    os.chmod(tree / "locked", 0)
    jobfiles.remove_tree(tree)
    assert not tree.exists()
    assert secret.read_text() == SECRET  # the link went, not what it named


def test_copy_regular_refuses_a_fifo_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "trace.json")
    done = []

    def copy():
        try:
            jobfiles.copy_regular(tmp_path / "trace.json", tmp_path / "out.json")
        except ArtifactError as e:
            done.append(str(e))

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    t.join(10)
    assert done and "is a FIFO" in done[0]
    assert not (tmp_path / "out.json").exists()
    assert stat.S_ISFIFO(os.stat(tmp_path / "trace.json").st_mode)
