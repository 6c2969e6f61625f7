"""What a job wrote, read back without trusting it; its disk use counted; its folders removed.

A job writes its own folder while it runs, and its code is the user's: a name there can become a
symbolic link to a secret, a FIFO that blocks whoever opens it, a hard link, or a million files.
So the unsandboxed side (the runner, the report writer, the dashboard) never opens a job's file by
path while the job can change it:

* the job writes a staging folder (``JOB_FOLDER`` inside the run's folder, the only part of it
  the sandbox grants); the runner's own files (worker.log) sit beside it, out of the job's reach;
* while it runs, ``usage`` counts what it has put on disk (never following a link) against the
  declared ``Limits``;
* once the job is gone, ``collect`` opens each entry relative to a folder handle with
  O_NOFOLLOW | O_NONBLOCK, keeps only regular files (one link, bounded size, within the limits)
  and moves them into the run's folder, saying what it left behind and why; then the staging
  folder is removed (``remove_tree``);
* later readers of an artifact path (``open_regular``, ``read_bytes``, ``copy_regular``) apply the
  same checks, so a link or a FIFO is refused by name, never followed or waited on.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from diagnostics.errors import TorchScopeError
from diagnostics.settings import env_number
from diagnostics.units import human_bytes

#: The job's staging folder inside the run's folder (the sandbox grants this one, not its parent).
JOB_FOLDER = ".job"
#: Names in the run's folder that belong to the runner: a job's file of that name is not kept.
RESERVED_NAMES = ("worker.log", JOB_FOLDER)
DISK_ENV = "TORCHSCOPE_JOB_DISK_MB"
FILES_ENV = "TORCHSCOPE_JOB_FILES"
#: Declared defaults: what one job may leave on disk (its artifact and temp folders together).
DEFAULT_DISK_MB = 8192
DEFAULT_FILES = 10_000
#: A run's artifact list as stored (History loads it with every row): at most this many names.
MAX_LISTED = 200
#: Largest artifact a reader takes by default (a trace or a saved model): the disk quota's default.
DEFAULT_READ_LIMIT = DEFAULT_DISK_MB << 20

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ArtifactError(TorchScopeError):
    """A job's file that is not read back: a link, a FIFO, a device, too big, or gone."""


@dataclass(frozen=True)
class Limits:
    """What a job may put on disk: bytes (blocks really used) and entries (files, folders, links)."""

    disk_bytes: int = DEFAULT_DISK_MB << 20
    files: int = DEFAULT_FILES

    @classmethod
    def from_env(cls) -> "Limits":
        mb = env_number(DISK_ENV, DEFAULT_DISK_MB)
        files = env_number(FILES_ENV, DEFAULT_FILES)
        return cls(int(mb * 2**20), int(files))

    def exceeded(self, used: "Usage") -> str | None:
        """The message for a job over a limit (naming the limit and its variable), else None."""
        if used.files > self.files:
            return (f"the job made more than {self.files:,} files and folders in its artifact and temp folders, "
                    f"over its limit of {self.files:,} (set {FILES_ENV})")
        if used.bytes > self.disk_bytes:
            return (f"the job wrote {human_bytes(used.bytes)} into its artifact and temp folders, over its disk "
                    f"quota of {human_bytes(self.disk_bytes)} (set {DISK_ENV})")
        return None


@dataclass
class Usage:
    bytes: int = 0
    files: int = 0


def usage(folders, stop_after: int | None = None) -> Usage:
    """Disk blocks used and entries under ``folders``, links not followed; counting stops once
    ``stop_after`` entries are seen (the limit is passed: no need to walk a million files)."""
    used = Usage()
    stack = [str(f) for f in folders]
    while stack:
        top = stack.pop()
        try:
            it = os.scandir(top)
        except OSError:
            continue
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used.files += 1
                used.bytes += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                if stop_after is not None and used.files > stop_after:
                    return used
    return used


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _open_at(name: str, dir_fd: int | None, shown: str, max_bytes: int | None) -> tuple[int, os.stat_result]:
    """A regular file opened without following a link or waiting on a FIFO, with its fstat."""
    try:
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ArtifactError(f"{shown} is a symbolic link: not read") from None
        if e.errno == errno.ENXIO:
            raise ArtifactError(f"{shown} is a socket: not read") from None
        raise ArtifactError(f"{shown} could not be opened ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(f"{shown} is {_kind(st.st_mode)}: not read")
        if max_bytes is not None and st.st_size > max_bytes:
            raise ArtifactError(f"{shown} is {human_bytes(st.st_size)}, over the {human_bytes(max_bytes)} read here")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _outside(path: Path, within) -> bool:
    if within is None:
        return False
    root = os.path.realpath(within)
    return os.path.commonpath([os.path.realpath(path.parent), root]) != root


def open_regular(path, max_bytes: int | None = DEFAULT_READ_LIMIT, within=None) -> int:
    """A file descriptor of the regular file at ``path``: its last component is never followed
    (O_NOFOLLOW), a FIFO is never waited on (O_NONBLOCK), anything else is refused by ArtifactError.
    ``within``: the folder it must be in (a path a job's result names could point anywhere)."""
    path = Path(path)
    if _outside(path, within):
        raise ArtifactError(f"{path} is not in {within}: not read")
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise ArtifactError(f"{path} could not be opened ({e.strerror})") from None
    try:
        return _open_at(path.name, dfd, str(path), max_bytes)[0]
    finally:
        os.close(dfd)


def read_bytes(path, max_bytes: int | None = DEFAULT_READ_LIMIT, within=None) -> bytes:
    """The content of the regular file at ``path`` (see open_regular)."""
    fd = open_regular(path, max_bytes, within)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def size_of(path, within=None) -> int | None:
    """The size of the regular file at ``path`` (not followed if a link), or None when there is none."""
    path = Path(path)
    if _outside(path, within):
        return None
    try:
        st = os.stat(path, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _copy_fd(src: int, dst: int) -> None:
    while True:
        try:
            n = os.copy_file_range(src, dst, 1 << 30)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            n = os.sendfile(dst, src, None, 1 << 30)
        if n == 0:
            return


def copy_regular(src, dst, max_bytes: int | None = DEFAULT_READ_LIMIT, within=None) -> int:
    """Copy the regular file ``src`` (checked as open_regular does) to ``dst`` (replaced if it is a
    regular file, never written through a link); returns the bytes copied."""
    fd = open_regular(src, max_bytes, within)
    try:
        dst = Path(dst)
        if os.path.lexists(dst) and not dst.is_symlink() and dst.is_file():
            os.unlink(dst)
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            _copy_fd(fd, out)
            return os.fstat(out).st_size
        finally:
            os.close(out)
    finally:
        os.close(fd)


@dataclass
class Collected:
    """What ``collect`` kept (path relative to the run's folder -> where it is now), what it left
    behind and why, and whether a limit was passed (its message)."""

    kept: dict[str, str] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    over_limit: str | None = None
    used: Usage = field(default_factory=Usage)
    #: folders whose files a kept hard link may share (collect's ``links_from``), and their
    #: (st_dev, st_ino) once looked up
    links_from: tuple = ()
    linkable: set | None = None

    def note(self) -> str:
        """A line for worker.log and the log tail, or '' when everything was kept."""
        if not self.left:
            return ""
        shown = "; ".join(self.left[:10]) + (f"; and {len(self.left) - 10:,} more" if len(self.left) > 10 else "")
        return f"runner: not kept from the job's folder: {shown}"


def collect(job_dir, run_dir, limits: Limits, reserved=RESERVED_NAMES, links_from=()) -> Collected:
    """Move the regular files the job left in ``job_dir`` into ``run_dir`` (folders kept), once the
    job is gone. Each entry is opened relative to its folder's handle with O_NOFOLLOW | O_NONBLOCK
    and checked with fstat: links, FIFOs, sockets, devices, files past ``limits`` and files with
    another hard link (unless it is in one of the ``links_from`` folders: the trace cache's columns,
    linked beside a run) are left behind (and named in ``left``)."""
    out = Collected(links_from=tuple(links_from))
    try:
        src = os.open(job_dir, _DIR)
    except OSError:
        return out  # the job never had a folder (or it was removed): nothing to keep
    try:
        os.makedirs(run_dir, exist_ok=True)
        dst = os.open(run_dir, _DIR)
    except OSError as e:
        os.close(src)
        out.left.append(f"everything (the run's folder could not be opened: {e.strerror})")
        return out
    try:
        _collect(src, dst, "", Path(run_dir), limits, set(reserved), out)
    finally:
        os.close(src)
        os.close(dst)
    return out


def _collect(src: int, dst: int, prefix: str, dst_path: Path, limits: Limits, reserved: set, out: Collected) -> None:
    try:
        names = sorted(os.listdir(src))
    except OSError as e:
        out.left.append(f"{prefix or '.'}/ (could not be listed: {e.strerror})")
        return
    for name in names:
        rel = prefix + name
        if not prefix and name in reserved:
            out.left.append(f"{rel} (the name is the runner's)")
            continue
        try:
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
        except OSError:
            continue
        if out.over_limit:
            out.left.append(f"{rel} (past the limit)")
            continue
        out.used.files += 1
        if out.used.files > limits.files:
            out.over_limit = limits.exceeded(out.used)
            out.left.append(f"{rel} (past the limit)")
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, _DIR, dir_fd=src)
            except OSError as e:
                out.left.append(f"{rel}/ ({e.strerror})")
                continue
            try:
                try:
                    os.mkdir(name, 0o755, dir_fd=dst)
                except FileExistsError:
                    pass
                sub_dst = os.open(name, _DIR, dir_fd=dst)
            except OSError as e:
                os.close(sub)
                out.left.append(f"{rel}/ ({e.strerror})")
                continue
            try:
                _collect(sub, sub_dst, rel + "/", dst_path / name, limits, reserved, out)
            finally:
                os.close(sub)
                os.close(sub_dst)
            continue
        if not stat.S_ISREG(st.st_mode):
            out.left.append(f"{rel} ({_kind(st.st_mode)})")
            continue
        try:
            fd, fst = _open_at(name, src, rel, None)
        except ArtifactError as e:
            out.left.append(str(e))
            continue
        try:
            if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                out.left.append(f"{rel} (replaced)")
                continue
            if fst.st_nlink != 1 and (fst.st_dev, fst.st_ino) not in _linkable(out):
                out.left.append(f"{rel} (a hard link to another file)")
                continue
            out.used.bytes += fst.st_blocks * 512
            if out.used.bytes > limits.disk_bytes:
                out.over_limit = limits.exceeded(out.used)
                out.left.append(f"{rel} (past the limit)")
                continue
            _place(name, fd, src, dst)
            out.kept[rel] = str(dst_path / name)
        except OSError as e:
            out.left.append(f"{rel} ({e.strerror})")
        finally:
            os.close(fd)


def _linkable(out: Collected) -> set:
    """(st_dev, st_ino) of the regular files two levels down the ``links_from`` folders (looked up
    once, the first time a file with another link is met)."""
    if out.linkable is None:
        out.linkable = set()
        for folder in out.links_from:
            for path in Path(folder).glob("*/*"):
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.linkable.add((st.st_dev, st.st_ino))
    return out.linkable


def _place(name: str, fd: int, src: int, dst: int) -> None:
    """Move the checked entry ``name`` (open as ``fd``) into ``dst``: a rename on one filesystem, else a copy."""
    try:
        existing = os.stat(name, dir_fd=dst, follow_symlinks=False)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise OSError(errno.EEXIST, "something that is not a file has its name in the run's folder")
    try:
        os.rename(name, name, src_dir_fd=src, dst_dir_fd=dst)
        return
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    if existing is not None:
        os.unlink(name, dir_fd=dst)
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dst)
    try:
        _copy_fd(fd, out)
    finally:
        os.close(out)


def listing(run_dir, limit: int = MAX_LISTED) -> dict[str, str]:
    """The run's artifact list as stored: its top-level regular files (links not followed), the
    runner's worker.log and traces first, at most ``limit`` names."""
    try:
        with os.scandir(run_dir) as it:
            files = sorted(e.name for e in it if e.is_file(follow_symlinks=False))
    except OSError:
        return {}
    first = [n for n in files if n == "worker.log" or ".json" in n]
    ordered = first + [n for n in files if n not in first]
    return {n: str(Path(run_dir) / n) for n in ordered[:limit]}


def relocate(value, old: str, new: str):
    """``value`` (a job's result: plain data or a typed record, diagnostics.results) with every string naming
    ``old`` or a path below it pointing at the same place under ``new`` (the job's staging folder -> the
    run's folder)."""
    if isinstance(value, msgspec.Struct):
        return msgspec.structs.replace(value, **{f: relocate(getattr(value, f), old, new)
                                                 for f in value.__struct_fields__})
    if isinstance(value, str):
        if value == old:
            return new
        return new + value[len(old):] if value.startswith(old + os.sep) else value
    if isinstance(value, dict):
        return {k: relocate(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [relocate(v, old, new) for v in value]
    if isinstance(value, tuple):
        return tuple(relocate(v, old, new) for v in value)
    return value


def remove_tree(path) -> None:
    """Remove ``path`` and everything below it, links never followed, folders a job made
    unreadable (mode 000) opened up first; whatever cannot be removed is left."""
    import shutil

    def opened_up(func, p, _exc):
        parent = os.path.dirname(p)
        for target in (parent, p):
            try:
                if not os.path.islink(target):
                    os.chmod(target, 0o700)
            except OSError:
                pass
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                func(p)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=opened_up)

