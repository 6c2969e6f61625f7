"""The kernel's confinement calls, over ctypes (Linux): Landlock rulesets (the file rights and TCP),
the seccomp socket filter, no-new-privileges and dropping capabilities. The sandbox (``diagnostics.sandbox``)
decides what a job may touch; this module only asks the kernel, and raises SandboxError when it refuses.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from pathlib import Path

from diagnostics.errors import TorchScopeError

# --- Landlock uapi (include/uapi/linux/landlock.h); syscall numbers are the same on every arch.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13       # ABI 2
FS_TRUNCATE = 1 << 14    # ABI 3
FS_IOCTL_DEV = 1 << 15   # ABI 5
NET_BIND_TCP = 1 << 0    # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1
#: Rights that apply to a file (the rest apply to directories only; a rule on a file may hold only these).
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ = FS_READ_FILE | FS_READ_DIR
READ_EXEC = READ | FS_EXECUTE
DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV
EVERYTHING = (1 << 16) - 1

# --- seccomp: refuse socket(2) / socketpair(2) for every family but AF_UNIX (without namespaces:
# socket(2) for every family, socketpair(2) but AF_UNIX), and io_uring (whose socket ops seccomp
# cannot see). Other architectures' syscalls (x32, i386's socketcall) are refused.
_ARCH = {"x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "io_uring_setup": 425}, True),
         "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "io_uring_setup": 425}, False)}
_AF_UNIX = 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_VERSION_3 = 0x20080522
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000

#: The machines the seccomp filter knows (their audit architecture and syscall numbers).
SECCOMP_MACHINES = tuple(_ARCH)


class SandboxError(TorchScopeError):
    """The sandbox was required (TORCHSCOPE_SANDBOX=1) or asked for and could not be applied."""


def load_libc():
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or -errno when it offers none (ENOSYS, EOPNOTSUPP...)."""
    libc = load_libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return int(abi) if abi >= 0 else -ctypes.get_errno()


def no_new_privs() -> None:
    """PR_SET_NO_NEW_PRIVS: what Landlock and seccomp need unprivileged (and no setuid gain after)."""
    check(load_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise SandboxError(f"the job sandbox could not be applied: {what} failed ({os.strerror(err)})")
    return ret


def restrict(rules: list[tuple[Path, int]], network: bool, abi: int) -> None:
    """Landlock this process (and all it starts) to ``rules`` ((path, rights) pairs); TCP and abstract
    Unix sockets are refused unless ``network``, signals to processes outside always (as the ABI allows)."""
    libc = load_libc()
    libc.syscall.restype = ctypes.c_long
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
        attr.handled_access_net = 0 if network else (NET_BIND_TCP | NET_CONNECT_TCP)
    if abi >= 6:
        size = 24
        attr.scoped = SCOPE_SIGNAL | (0 if network else SCOPE_ABSTRACT_UNIX)
    fd = check(libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                             ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        for path, rights in rules:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone since: nothing to grant
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_RIGHTS
                rule = _PathBeneath(rights & handled, pfd)
                check(libc.syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH),
                                    ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule({path})")
            finally:
                os.close(pfd)
        check(libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(fd)


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None, unix_sockets: bool = True) -> bytes:
    """The BPF filter: sockets other than AF_UNIX and io_uring get EACCES / EPERM; all else is allowed.
    ``unix_sockets=False`` (no namespaces: a Unix socket could reach any host service by its path):
    socket(2) is refused for every family, socketpair(2) still allowed for AF_UNIX."""
    arch, nr, has_x32 = _ARCH[machine or platform.machine()]
    ld_w_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    deny_sock = _RET_ERRNO | errno.EACCES
    prog = [
        _bpf(ld_w_abs, 0, 0, 4),                       # 0: A = arch
        _bpf(jeq, 1, 0, arch),                         # 1: native -> 3
        _bpf(ret, 0, 0, _RET_ERRNO | errno.EPERM),     # 2: another ABI's syscalls: refused
        _bpf(ld_w_abs, 0, 0, 0),                       # 3: A = syscall number
        _bpf(jge, 0, 1, 0x40000000) if has_x32 else _bpf(jeq, 0, 1, 0xFFFFFFFF),  # 4: x32 -> 5
        _bpf(ret, 0, 0, _RET_ERRNO | errno.EPERM),     # 5
        _bpf(jeq, 0, 1, nr["io_uring_setup"]),         # 6
        _bpf(ret, 0, 0, _RET_ERRNO | errno.EPERM),     # 7
        _bpf(jeq, 1 if unix_sockets else 3, 0, nr["socket"]),  # 8: socket -> 10 (without Unix sockets: -> 12)
        _bpf(jeq, 0, 3, nr["socketpair"]),             # 9: neither -> 13
        _bpf(ld_w_abs, 0, 0, 16),                      # 10: A = domain (args[0], low word)
        _bpf(jeq, 1, 0, _AF_UNIX),                     # 11: AF_UNIX -> 13
        _bpf(ret, 0, 0, deny_sock),                    # 12
        _bpf(ret, 0, 0, _RET_ALLOW),                   # 13
    ]
    return b"".join(prog)


def filter_sockets(unix_sockets: bool) -> None:
    """Install ``seccomp_program(unix_sockets=...)`` on this thread (and all it starts)."""
    libc = load_libc()
    prog = seccomp_program(unix_sockets=unix_sockets)
    buf = ctypes.create_string_buffer(prog, len(prog))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp filter")


def drop_capabilities() -> None:
    """Give up every capability (bounding, ambient, effective, permitted, inheritable). As root this
    takes CAP_SYS_PTRACE (reading another process' environment or memory), CAP_DAC_OVERRIDE and the
    rest; in a user namespace, what it gave. Landlock and seccomp still apply either way."""
    libc = load_libc()
    for cap in range(64):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class _Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class _Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    check(libc.capset(ctypes.byref(_Header(_CAP_VERSION_3, 0)), ctypes.byref((_Data * 2)())), "dropping capabilities")
