"""The job's own view of the system: user, mount, PID, IPC and network namespaces (Linux).

Where the kernel lets an unprivileged process create a user namespace (and mount /proc in it),
``isolate`` gives the job process, before any user code and while it has a single thread:

* a mount namespace whose root holds only what the sandbox policy lets the job read or write,
  each shown at its own path (bind mounts of the real folders and files, the links on their paths
  recreated), a /dev with the allowed device files only, a /tmp holding only the job's own
  folders, a private /dev/shm (a tmpfs of bounded size, gone with the job) and a /proc of its own
  PID namespace. A host Unix socket (an ssh agent, a desktop bus, a container runtime) is not in
  that view, so nothing can connect to it, whatever Landlock mediates;
* a PID namespace: /proc lists only the job's processes (no other process' environment or
  command line), and every process of the job ends with its init;
* an IPC namespace (System V shared memory and message queues of its own);
* a network namespace with no interface up: no TCP, UDP or abstract Unix socket reaches the host
  (a distributed job keeps the host's network for its ranks). A trace job, which runs no user code and
  keeps the host's view, gets a user and a network namespace alone when it runs a Dask LocalCluster
  (``private_network``: loopback up, its scheduler's 127.0.0.1 the job's own, out of other users' reach).

Below the guardian the job's processes are then P (the process that called ``isolate``: it waits,
then exits as the job did) -> C (made the namespaces) -> D (PID 1 of the new namespace: builds the
view, reaps orphans) -> J (the job: ``isolate`` returns there). PID 1 of a namespace ignores the
signals it sends itself, so the job is not PID 1 (``os.abort()`` must still end it by SIGABRT).
If a step fails (a kernel or container that forbids user namespaces or mounting /proc in them),
C or D says why and exits before anything of the job ran, and P carries on without namespaces:
``isolate`` returns (False, why) there.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE, MS_UNBINDABLE = 32, 4096, 16384, 1 << 18, 1 << 17
MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_PR_SET_PDEATHSIG = 1
#: The view's own root (a tmpfs holding only mount points): small, and read-only once built.
ROOT_TMPFS = "size=4m,nr_inodes=16384,mode=0755"
#: Paths given fresh file systems in the view instead of the host's.
FRESH = ("/proc", "/dev/shm")
#: Links in the view's /dev (as a devtmpfs has them).
DEV_LINKS = (("/dev/fd", "/proc/self/fd"), ("/dev/stdin", "/proc/self/fd/0"), ("/dev/stdout", "/proc/self/fd/1"),
             ("/dev/stderr", "/proc/self/fd/2"))
_OK, _FAILED = b"K", b"F"


@dataclass
class View:
    """What the job's mount namespace shows: ``binds`` (real paths, shown at the same place),
    ``links`` (symbolic links met on the way to them, recreated), a private /dev/shm of
    ``shm_bytes``, the host network or none, and the folder to start in."""

    binds: list[Path] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    shm_bytes: int = 1 << 30
    network: bool = False
    cwd: str = "/"
    #: An existing, empty folder of the runner's, covered by the view's root while it is built.
    build_at: str = "/tmp"

    def describe(self) -> str:
        net = "host network (distributed ranks)" if self.network else "no network"
        return (f"namespaces (user, mount, pid, ipc{'' if self.network else ', net'}): only the granted paths "
                f"visible, private /tmp, /dev/shm ({self.shm_bytes / 2**30:.1f} GiB) and /proc; {net}")


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed ({os.strerror(err)})")


def _b(s) -> bytes | None:
    return None if s is None else os.fsencode(str(s))


def _mount(libc, source, target, fstype, flags: int, data=None) -> None:
    _check(libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _die_with_parent(libc) -> None:
    import signal

    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def link_hops(path: str, depth: int = 0) -> list[tuple[str, str]]:
    """Every symbolic link met while resolving ``path`` (and the paths they point to), as
    (link, target): the view recreates them so that /lib -> usr/lib, say, still leads somewhere."""
    if depth > 20:
        return []
    hops: list[tuple[str, str]] = []
    parts = Path(os.path.abspath(path)).parts[1:]
    cur = "/"
    for i, name in enumerate(parts):
        nxt = os.path.join(cur, name)
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            hops.append((nxt, target))
            rest = os.path.join(os.path.normpath(os.path.join(cur, target)), *parts[i + 1:])
            return hops + link_hops(rest, depth + 1)
        cur = nxt
    return hops


#: ioctl requests on an interface's flags, and the flag that brings it up (linux/sockios.h, linux/if.h).
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Bring ``lo`` up in this (new) network namespace: 127.0.0.1 works, and is this namespace's alone."""
    import fcntl
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def private_network() -> tuple[bool, str]:
    """This (single-threaded) process into a user and a network namespace of its own, loopback up, and
    nothing else changed (its files, mounts and PIDs stay the host's: a trace job's cache links work).
    (True, what) or (False, why); on False this process may be half-moved: the caller refuses the job."""
    if sys.platform != "linux":
        return False, f"no network namespaces on {sys.platform}"
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    try:
        _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare (a user and a network namespace)")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        loopback_up()
    except OSError as e:
        return False, str(e.strerror if e.strerror and " failed" in e.strerror else e)
    return True, "a network of its own: loopback only (its Dask LocalCluster out of other users' reach)"


# ------------------------------------------------------------------------------------ building the view
def _build(view: View, libc) -> None:
    """In D (PID 1 of the new PID namespace, in the new mount namespace): the view's root, then pivot into it."""
    sources: dict[Path, int] = {}
    for p in view.binds:  # opened before anything is mounted over them
        try:
            sources[p] = os.open(p, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            pass
    root = view.build_at
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, ROOT_TMPFS)
    # Unbindable: a recursive bind of a folder above it (or of build_at itself, the job's temp folder)
    # must not copy the view's root into the view, where a rule granted on that path would land on it.
    _mount(libc, None, root, None, MS_UNBINDABLE)
    shown: list[Path] = []

    def covered(p: Path) -> bool:
        return any(p == s or s in p.parents for s in shown)

    try:
        for p in sorted(sources, key=lambda q: (len(q.parts), str(q))):
            if covered(p):
                continue
            target = root + str(p)
            if os.path.isdir(f"/proc/self/fd/{sources[p]}"):
                os.makedirs(target, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if not os.path.exists(target):
                    os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            _mount(libc, f"/proc/self/fd/{sources[p]}", target, None, MS_BIND | MS_REC)
            shown.append(p)
    finally:
        for fd in sources.values():
            os.close(fd)
    for link, target in list(view.links) + list(DEV_LINKS):
        p = Path(link)
        if covered(p) or os.path.lexists(root + link):
            continue
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        os.symlink(target, root + link)
    os.makedirs(root + "/tmp", exist_ok=True)
    os.chmod(root + "/tmp", 0o1777)
    os.makedirs(root + "/dev/shm", exist_ok=True)
    _mount(libc, "tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={max(int(view.shm_bytes), 1 << 20)},mode=1777")
    os.makedirs(root + "/proc", exist_ok=True)
    _mount(libc, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(root)
    _check(libc.syscall(ctypes.c_long(_PIVOT_ROOT[platform.machine()]), b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "detaching the old root")
    os.chdir("/")
    # The root itself holds only mount points: read-only (its mounts keep their own flags).
    _mount(libc, None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    try:
        os.chdir(view.cwd)
    except OSError:
        pass


# ------------------------------------------------------------------------------------ the process chain
def _read_exact(fd: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return out
        out += chunk


def _fail(w: int, what: str) -> None:
    try:
        os.write(w, _FAILED + what.encode(errors="replace")[:2000])
    finally:
        os._exit(3)


def isolate(view: View, close: tuple = (), exit_as=None) -> tuple[bool, str]:
    """Move the job into namespaces of its own (see the module's doc). Returns (True, what) in the
    job process J; returns (False, why) in this process when they could not be had (nothing was
    changed here, and nothing of the job ran). ``close``: connections only the job may hold (the
    waiting processes close theirs, so the runner sees EOF as soon as the job ends). ``exit_as``
    (the guardian's: exit the way a wait status says) ends this process once J has ended."""
    if sys.platform != "linux" or platform.machine() not in _PIVOT_ROOT:
        return False, f"namespaces are not set up on {sys.platform}/{platform.machine()}"
    libc = _libc()
    uid, gid, me = os.getuid(), os.getgid(), os.getpid()
    r, w = os.pipe()
    c_pid = os.fork()
    if c_pid == 0:  # C: makes the namespaces
        os.close(r)
        try:
            _die_with_parent(libc)
            if os.getppid() != me:
                os._exit(1)
            flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | (0 if view.network else CLONE_NEWNET)
            _check(libc.unshare(flags), "unshare (a user namespace)")
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
            _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
        except OSError as e:
            _fail(w, str(e.strerror if e.strerror and " failed" in e.strerror else e))
        except BaseException as e:  # never run the job from here
            _fail(w, f"{type(e).__name__}: {e}")
        d_pid = os.fork()
        if d_pid == 0:  # D: PID 1 of the new namespace
            try:
                _die_with_parent(libc)
                _build(view, libc)
            except OSError as e:
                _fail(w, str(e.strerror if e.strerror and " failed" in e.strerror else e))
            except BaseException as e:
                _fail(w, f"{type(e).__name__}: {e}")
            os.write(w, _OK)
            j_pid = os.fork()
            if j_pid == 0:  # J: the job
                os.close(w)
                _die_with_parent(libc)
                return True, view.describe()
            for c in close:  # only the job holds them now
                c.close()
            _init(j_pid, w)
        for c in close:
            c.close()
        os.close(w)
        try:
            os.waitpid(d_pid, 0)
        finally:
            os._exit(0)
    # P: wait for the word from C or D
    os.close(w)
    first = os.read(r, 1)
    if first != _OK:
        why = (first + _read_all(r))[1:].decode(errors="replace") or "the namespace setup ended without a word"
        os.close(r)
        try:
            os.waitpid(c_pid, 0)
        except ChildProcessError:
            pass
        return False, why
    for c in close:
        c.close()
    data = _read_exact(r, 4)
    _, c_status = os.waitpid(c_pid, 0)
    status = struct.unpack("<i", data)[0] if len(data) == 4 else c_status
    if exit_as is not None:
        exit_as(status)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _init(job_pid: int, w: int) -> None:
    """D's life once the job runs: reap every process re-parented here; when the job ends, pass its
    wait status up and exit (the kernel then kills whatever else is left in the namespace)."""
    status = 0
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == job_pid:
            status = st
            break
    try:
        os.write(w, struct.pack("<i", status))
    finally:
        os._exit(0)


# ------------------------------------------------------------------------------------ can this system do it?
_TRIAL = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("torchscope_namespaces", {path!r})
ns = sys.modules["torchscope_namespaces"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ns)
ok, why = ns.isolate(ns.View(binds=[], build_at={folder!r}, shm_bytes=1 << 20))
if ok:  # J: only its own processes in /proc (D is 1, J is 2)
    os._exit(0 if sorted(p for p in os.listdir("/proc") if p.isdigit()) == ["1", "2"] else 4)
sys.stdout.write(why)
sys.exit(3)
"""


@lru_cache(maxsize=1)
def probe() -> tuple[bool, str]:
    """(True, '') when jobs can get namespaces here, else (False, why). Tried once per process, in a
    short-lived child (a user namespace, a view's root, a /proc of its own)."""
    if sys.platform != "linux" or platform.machine() not in _PIVOT_ROOT:
        return False, f"namespaces are not set up on {sys.platform}/{platform.machine()}"
    import tempfile

    folder = tempfile.mkdtemp(prefix="torchscope-ns-probe-")
    try:
        done = subprocess.run([sys.executable, "-S", "-c", _TRIAL.format(path=__file__, folder=folder)],
                              capture_output=True, text=True, timeout=30, env={"PATH": os.environ.get("PATH", "")})
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"the namespace trial could not run ({e})"
    finally:
        try:
            os.rmdir(folder)
        except OSError:
            pass
    if done.returncode == 0:
        return True, ""
    why = done.stdout.strip() or done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
    return False, why if isinstance(why, str) else why[0]
