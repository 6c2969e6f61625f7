"""Confine a job's worker: namespaces where the kernel allows them, Landlock for files and TCP,
seccomp for every other socket, no capabilities, an allow-listed environment.

``scrub_environment()`` runs first in every worker (cold or spare): only the variables that Python,
torch, CUDA and the model need stay (``ENV_KEEP``...), in ``os.environ``, in the C library's
environment and in the process' initial environment block (what /proc/<pid>/environ shows).
``enter(job, artifact_dir, tmp_dir)`` is called once inside the worker, as soon as it knows its
job and before any user code runs (and before torch starts threads: every layer binds the calling
thread and what it starts later). Where user namespaces are allowed (``diagnostics.namespaces``) the
job first moves into namespaces of its own: a mount view holding only the paths below, a private
/tmp, /dev/shm and /proc, no network. Then, in every mode, the worker and everything it starts may
write only the job's artifact folder, a private temp folder and /dev/shm; read only what running
the job needs (Python and its packages, TorchScope's own code, the system's libraries and
compilers, the job's input files); open no TCP/UDP socket (a distributed job keeps TCP for its
ranks), and without namespaces no Unix socket either but a socketpair(); neither signal nor ptrace
a process outside the sandbox; and it holds no capability (as root, no CAP_SYS_PTRACE: no other
process' environment). The rules, and why each is there, are listed in docs/reliability.md.

Landlock (Linux 5.13+, unprivileged, stackable) was chosen over bubblewrap (a setuid or
user-namespace helper, not always installed or allowed in containers) and seccomp alone (it sees
syscall numbers, not paths). ``TORCHSCOPE_SANDBOX``: ``auto`` (default: confine where the kernel
allows it), ``1`` (a job fails rather than run unconfined), ``0`` (off). Without a sandbox, server-
safe mode refuses TorchScript and .pt2 uploads (their graphs can call file ops) instead of running
them unconfined: see ``graph_code_refusal``. ``TORCHSCOPE_SANDBOX_NAMESPACES=0`` keeps jobs out of
namespaces (the Landlock-only mode a kernel without user namespaces gets).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import diagnostics.namespaces as namespaces
from diagnostics.confine import (DEVICE, EVERYTHING, READ, READ_EXEC, SECCOMP_MACHINES, SandboxError,
                                 drop_capabilities, filter_sockets, landlock_abi, load_libc, no_new_privs, restrict)
from diagnostics.errors import TorchScopeError, TrustError
from diagnostics.settings import safe_mode, trace_cache_dir

#: A Dask LocalCluster spec (``local`` or ``local:N``), as trace/ranks/executors.py reads it.
_LOCAL_CLUSTER = re.compile(r"^local(?::(\d+))?$")

SANDBOX_ENV = "TORCHSCOPE_SANDBOX"
#: ``0`` keeps jobs out of namespaces even where the kernel allows them (Landlock and seccomp only).
NAMESPACES_ENV = "TORCHSCOPE_SANDBOX_NAMESPACES"
#: Landlock ABI needed to confine at all: 3 (Linux 6.2) is the first that can refuse truncate(2),
#: without which a job could still empty any file it may not write, the run store included.
MIN_LANDLOCK_ABI = 3

#: /etc files a job may read: the dynamic loader's, and name lookup for a distributed job's ranks.
#: Not /etc/passwd, /etc/shadow, /etc/group nor anything else there.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ld.so.preload", "localtime", "timezone",
             "hosts", "host.conf", "nsswitch.conf", "resolv.conf", "gai.conf")
#: System folders with libraries, compilers (torch.compile runs g++) and headers: read and execute.
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt")
#: Read only: process and hardware facts (torch, psutil, cpuinfo read them). In namespaces /proc is
#: the job's own (its processes only); without, Landlock keeps a non-root job from reading the
#: environment or memory of a process outside the sandbox, and the dropped capabilities a root one.
INFO_DIRS = ("/proc", "/sys")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: Device files of GPUs (CUDA, ROCm): read, write and ioctl, when present.
GPU_DEVICE_GLOBS = ("nvidia*", "nvidia-caps", "dri", "kfd")
#: Analyses that read trace files only (no user code) and may write the parsed-trace cache.
TRACE_CACHE_ANALYSES = ("trace", "trace_diff")
#: Job options that name files or folders the job reads.
INPUT_OPTIONS = ("path", "before", "after", "trace_dir", "columns_dir", "dataset_path")
#: Options whose value is a list of files or folders the job reads (the trace explorer's ranks).
INPUT_LIST_OPTIONS = ("ranks",)
#: Options whose value is a Python file that is imported: its folder is readable too.
PYTHON_OPTIONS = ("dataset_path",)
#: Where tools keep caches and scratch files: all pointed into the private temp folder, so nothing
#: lands outside it and no job reads another's compiled code (an inductor cache is code).
TEMP_ENV = {"TMPDIR": "", "TEMP": "", "TMP": "", "TORCHINDUCTOR_CACHE_DIR": "inductor",
            "TRITON_CACHE_DIR": "triton", "TRITON_HOME": "triton-home", "XDG_CACHE_HOME": "cache",
            "CUDA_CACHE_PATH": "cuda", "MPLCONFIGDIR": "matplotlib", "PYTHONPYCACHEPREFIX": "pycache"}


#: Environment variables a job keeps: these names, and names starting with ENV_KEEP_PREFIXES (what
#: Python, torch, CUDA / ROCm, the BLAS and OpenMP runtimes, compilers and TorchScope's own settings
#: read), unless the name holds one of ENV_SECRET_WORDS. Everything else (SSH_AUTH_SOCK, DBUS_*,
#: DISPLAY, tokens, cloud credentials...) never reaches the job.
ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "SHELL", "PWD", "VIRTUAL_ENV",
            "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD", "LIBRARY_PATH", "CPATH", "CC",
            "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES",
            "SOURCE_DATE_EPOCH", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
            "LOCAL_WORLD_SIZE", "GROUP_RANK", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
            "TOKENIZERS_PARALLELISM")
ENV_KEEP_PREFIXES = ("LC_", "PYTHON", "TORCHSCOPE_", "TORCH", "PYTORCH_", "CUDA", "CUDNN_", "CUBLAS", "NVIDIA_",
                     "NCCL_", "NVTE_", "HIP_", "ROCM_", "ROCR_", "HSA_", "MIOPEN_", "TRITON_", "OMP_", "KMP_",
                     "MKL_", "OPENBLAS_", "GOMP_", "BLIS_", "NUMEXPR_", "DNNL_", "ONEDNN_", "KINETO_", "GLOO_",
                     "XDG_CACHE_HOME", "MPLCONFIGDIR", "TMP", "TEMP")
ENV_SECRET_WORDS = ("TOKEN", "SECRET", "PASSW", "CREDENTIAL", "AUTH", "KEY", "COOKIE", "PRIVATE", "SESSION",
                    "SIGNATURE", "CERT")


def env_allowed(name: str) -> bool:
    """A variable the job keeps (see ENV_KEEP)."""
    upper = name.upper()
    if any(word in upper for word in ENV_SECRET_WORDS) and not upper.startswith("TORCHSCOPE_"):
        return False
    return name in ENV_KEEP or name.startswith(ENV_KEEP_PREFIXES)


def _wipe_initial_environment() -> bool:
    """Zero the environment block the process started with (what /proc/<pid>/environ shows, for this
    process and every process it forks). Call after clearenv(): nothing may point into it then."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51 of proc(5)
    except (OSError, IndexError, ValueError):
        return False
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)
        return True
    return False


def scrub_environment() -> list[str]:
    """Keep only the allowed variables (``env_allowed``) in this process: in os.environ, in the C
    library's environment (what children inherit) and in the initial environment block (zeroed).
    Returns the names dropped. The worker calls it first, before anything of a job is known."""
    keep = {k: v for k, v in os.environ.items() if env_allowed(k)}
    dropped = sorted(k for k in os.environ if k not in keep)
    if sys.platform == "linux":
        load_libc().clearenv()
        _wipe_initial_environment()
    os.environ.clear()
    os.environ.update(keep)
    return dropped


def setting() -> str:
    """TORCHSCOPE_SANDBOX as 'auto' (default), 'on' or 'off'; another value is an error naming it."""
    raw = os.environ.get(SANDBOX_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    if raw in ("1", "true", "yes", "on", "required"):
        return "on"
    if raw in ("0", "false", "no", "off"):
        return "off"
    raise TorchScopeError(f"the environment variable {SANDBOX_ENV}={raw!r} must be 0, 1 or auto")


@dataclass(frozen=True)
class Support:
    """What this kernel offers: the Landlock ABI (0: none), seccomp filters, and why not when missing."""

    landlock_abi: int
    seccomp: bool
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.landlock_abi >= MIN_LANDLOCK_ABI

    def describe(self) -> str:
        if not self.ok:
            return f"no sandbox: {self.reason}"
        extras = ["files"] + (["TCP"] if self.landlock_abi >= 4 else []) \
            + (["signals"] if self.landlock_abi >= 6 else [])
        return (f"Landlock ABI {self.landlock_abi} ({', '.join(extras)})"
                + (" + seccomp (sockets)" if self.seccomp else ""))


def namespaces_setting() -> bool:
    """TORCHSCOPE_SANDBOX_NAMESPACES: False for 0/false/no/off (jobs stay out of namespaces)."""
    return os.environ.get(NAMESPACES_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def namespace_support() -> tuple[bool, str]:
    """(True, '') when jobs will get namespaces of their own, else (False, why)."""
    if not namespaces_setting():
        return False, f"turned off ({NAMESPACES_ENV}=0)"
    return namespaces.probe()


@lru_cache(maxsize=1)
def probe() -> Support:
    """Ask the kernel (once per process) which sandbox layers it offers. Starts nothing."""
    if sys.platform != "linux":
        return Support(0, False, f"Landlock is Linux-only (this is {sys.platform})")
    abi = landlock_abi()
    seccomp = platform.machine() in SECCOMP_MACHINES and os.path.exists("/proc/self/status") and \
        "Seccomp:" in Path("/proc/self/status").read_text()
    if abi < 0:
        err = -abi
        why = {errno.ENOSYS: "this kernel has no Landlock (Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK)",
               errno.EOPNOTSUPP: "Landlock is built into this kernel but turned off (add landlock to the lsm= "
                                 "boot parameter)"}.get(err, f"Landlock is not usable here ({os.strerror(err)})")
        return Support(0, seccomp, why)
    if abi < MIN_LANDLOCK_ABI:
        return Support(int(abi), seccomp, f"this kernel's Landlock (ABI {abi}) cannot refuse truncate(2); "
                                          f"ABI {MIN_LANDLOCK_ABI} (Linux 6.2) is needed")
    return Support(int(abi), seccomp)


def will_confine() -> bool:
    """Jobs started from this process will run sandboxed (the setting allows it and the kernel can)."""
    try:
        return setting() != "off" and probe().ok
    except TorchScopeError:  # a malformed setting: each job fails naming it
        return False


def startup_notice() -> str | None:
    """What the dashboard and the CLI say at start-up when jobs will run unconfined, else None."""
    try:
        mode = setting()
    except TorchScopeError as e:
        return str(e)
    support = probe()
    if mode != "off" and support.ok:
        ok, why = namespace_support()
        if ok:
            return None
        return (f"jobs run in the Landlock sandbox without namespaces of their own ({why}): Unix sockets are "
                "refused except socketpair() (DataLoader workers that pass tensors need them), /proc shows other "
                "processes' command lines (not their environment), and /dev/shm is shared (what a job adds there "
                "counts in its memory cap, and what it leaves stays)")
    if mode == "off":
        why = f"the job sandbox is turned off ({SANDBOX_ENV}=0)"
    else:
        why = f"this system offers no job sandbox: {support.reason}"
    consequence = (" A job that fails to be confined is refused." if mode == "on" else
                   " Jobs run unconfined: a model can read and write whatever this user can.")
    if safe_mode():
        consequence += " In server-safe mode TorchScript and .pt2 uploads are refused (they can run file operations)."
    return why + "." + consequence


# ------------------------------------------------------------------------------------ state
_CONFINED: list[str] = []  # what enter() applied in this process, if anything
_NO_UNIX_SOCKETS: list[bool] = []  # applied without Unix sockets (no namespaces)
#: What a DataLoader with workers is told where it cannot work (they pass tensors over Unix sockets).
DATALOADER_WORKERS_REFUSED = ("DataLoader workers (num_workers > 0) pass tensors over Unix sockets, which the job "
                              "sandbox refuses on this system (jobs run without namespaces of their own); use "
                              "num_workers=0 here, or run where user namespaces are allowed")


def confined() -> bool:
    """This process entered the sandbox (so did everything it starts)."""
    return bool(_CONFINED)


def graph_code_refusal(what: str) -> None:
    """Server-safe mode runs graph code (TorchScript, .pt2) only inside the sandbox: raise TrustError outside it."""
    if safe_mode() and not confined():
        try:
            off = setting() == "off"
        except TorchScopeError:
            off = False
        why = (f"{SANDBOX_ENV}=0" if off else probe().reason if not probe().ok else
               "the model was not loaded by a job's worker")
        raise TrustError(f"{what} are refused on this server: server-safe mode runs their graph code only in a "
                         f"sandboxed worker, and there is no sandbox here ({why})")


# ------------------------------------------------------------------------------------ policy
@dataclass
class Policy:
    """Paths by the rights they get, and whether TCP is allowed (a distributed job's ranks)."""

    read: list[Path] = field(default_factory=list)          # read (and list)
    read_exec: list[Path] = field(default_factory=list)     # read and execute
    inputs: list[Path] = field(default_factory=list)        # read: the job's own files, wherever they are
    write: list[Path] = field(default_factory=list)         # everything beneath
    devices: list[Path] = field(default_factory=list)       # read, write, ioctl
    network: bool = False
    hidden: list[Path] = field(default_factory=list)        # never granted by a broad rule (the data folder)

    def rules(self) -> list[tuple[Path, int]]:
        """(path, rights) pairs, broad roots carved around the hidden folders; duplicates merged."""
        out: dict[Path, int] = {}

        def grant(p: Path, rights: int, explicit: bool) -> None:
            try:
                rp = Path(os.path.realpath(p))
            except (OSError, ValueError):
                return
            if not rp.exists():
                return
            if not explicit:
                for h in self.hidden:
                    if rp == h or h in rp.parents:
                        return  # a broad rule never reaches into a hidden folder
                    if rp in h.parents:  # the root holds a hidden folder: grant its other entries
                        try:
                            children = list(rp.iterdir())
                        except OSError:
                            return
                        for c in children:
                            grant(c, rights, explicit=False)
                        return
            out[rp] = out.get(rp, 0) | rights

        for paths, rights, explicit in ((self.read_exec, READ_EXEC, False), (self.read, READ, False),
                                        (self.inputs, READ, True), (self.devices, DEVICE, True),
                                        (self.write, EVERYTHING, True)):
            for p in paths:
                grant(Path(p), rights, explicit)
        return sorted(out.items())

    def view(self, shm_bytes: int, build_at: Path) -> namespaces.View:
        """What the job's mount namespace shows: every path of ``rules()`` at its own place (the
        links on the way to them recreated), a fresh /proc and a private /dev/shm of ``shm_bytes``;
        the view is built over ``build_at`` (an empty folder of the runner's)."""
        fresh = [Path(p) for p in namespaces.FRESH]
        binds = [p for p, _ in self.rules() if not any(p == f or f in p.parents for f in fresh) and not _ipc_file(p)]
        links: dict[str, str] = {}
        for p in [*self.read_exec, *self.read, *self.inputs, *self.write, *self.devices, *binds]:
            for link, target in namespaces.link_hops(str(p)):
                links.setdefault(link, target)
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = "/"
        return namespaces.View(binds=binds, links=sorted(links.items()), shm_bytes=int(shm_bytes),
                               network=self.network, cwd=cwd, build_at=str(build_at))


def _ipc_file(path: Path) -> bool:
    """A socket or a FIFO (a carved folder's entry, say): never shown in the job's view."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def _python_roots() -> list[Path]:
    import site
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), *sysconfig.get_paths().values()}
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site.py
        pass
    home = os.path.realpath(os.path.expanduser("~"))
    for entry in sys.path:  # PYTHONPATH, the dashboard's folder; never the filesystem root or the home folder
        if entry and os.path.isdir(entry) and os.path.realpath(entry) not in ("/", home):
            roots.add(entry)
    return [Path(r) for r in sorted(roots) if r]


def _job_inputs(job) -> tuple[list[Path], list[Path]]:
    """(files or folders the job reads, folders of imported Python files)."""
    reads, folders = [], []
    options = dict(job.options or {})  # a plain dict: the validated Options refuse undeclared keys
    spec = job.spec
    if spec is not None:
        for p in (spec.path, spec.weights_path):
            if p:
                reads.append(Path(p))
        if spec.source == "python" and spec.path:
            folders.append(Path(spec.path).parent)
    for key in INPUT_OPTIONS:
        value = options.get(key)
        if isinstance(value, str) and value:
            reads.append(Path(value).expanduser())
            if key in PYTHON_OPTIONS:
                folders.append(Path(value).expanduser().parent)
    for key in INPUT_LIST_OPTIONS:
        value = options.get(key)
        for item in value if isinstance(value, (list, tuple)) else ():
            if isinstance(item, str) and item:
                reads.append(Path(item).expanduser())
    for stamp in [options.get("stamp")] + list(options.get("stamps") or []):
        if isinstance(stamp, dict) and isinstance(stamp.get("path"), str):
            reads.append(Path(stamp["path"]))
    return reads, folders


def _is_store_file(path: Path, hidden: list[Path]) -> bool:
    """runs.sqlite (and its -wal, -shm and moved-aside copies) in a hidden folder: never an input."""
    rp = Path(os.path.realpath(path))
    return rp.name.startswith("runs.sqlite") and rp.parent in hidden


def _trace_cache_folder() -> Path:
    """The parsed-trace cache, created so that it can be granted (a rule needs an existing path)."""
    folder = trace_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # not granted then; the job opens its traces without the cache
    return folder


def needs_network(job) -> bool:
    """A distributed job's ranks talk over TCP (torchrun's rendezvous, gloo/NCCL); so does a trace job
    that analyses its ranks on a Dask cluster (its scheduler and workers, a LocalCluster's included)."""
    return job.analysis == "distributed" or (job.analysis == "trace" and bool((job.options or {}).get("dask")))


def local_cluster_only(job) -> bool:
    """A trace job on a Dask LocalCluster (``local[:N]``): its TCP stays on a loopback of its own
    (``_private_network``: no other local user can reach its scheduler). The grammar is the trace layer's
    (trace/ranks/executors.py ``_LOCAL_RE``, above this layer: tests/trace/test_dask_trust.py checks both agree)."""
    dask = (job.options or {}).get("dask") if job.analysis == "trace" else None
    return isinstance(dask, str) and _LOCAL_CLUSTER.match(dask.strip()) is not None


def policy_for(job, artifact_dir: Path, tmp_dir: Path, hidden: list | tuple = ()) -> Policy:
    """What ``job`` may touch. ``hidden`` (the data folder: run store, other runs, uploads, locks) is
    out of reach of every broad rule; the job's own upload, inputs and artifact folder inside it are
    granted one by one, the store's files never."""
    from diagnostics.store import default_data_dir

    if job.analysis == "trace" and needs_network(job) and safe_mode():
        raise TrustError("a Dask cluster (the option dask) is used only outside server-safe mode: the job would "
                         "open TCP connections the sandbox cannot limit")
    if needs_network(job) and safe_mode() and (job.spec is None or job.spec.source != "sample"):
        raise TrustError("the distributed analysis runs an uploaded model only outside server-safe mode: its ranks "
                         "need TCP sockets, which the sandbox cannot limit to this machine (the built-in samples "
                         "run)")
    hidden = sorted({Path(os.path.realpath(p)) for p in [default_data_dir(), *hidden]})
    reads, folders = _job_inputs(job)
    reads = [p for p in reads if not _is_store_file(p, hidden)]
    policy = Policy(network=needs_network(job), hidden=hidden)
    policy.read_exec += [Path(p) for p in SYSTEM_DIRS] + _python_roots() + [_repo_root()]
    policy.read += [Path(p) for p in INFO_DIRS] + [Path("/etc") / f for f in ETC_FILES]
    policy.read += folders
    policy.devices += [Path(d) for d in DEVICES]
    for pattern in GPU_DEVICE_GLOBS:
        policy.devices += sorted(Path("/dev").glob(pattern))
    policy.write += [Path(artifact_dir), Path(tmp_dir), Path("/dev/shm")]
    if job.analysis in TRACE_CACHE_ANALYSES:  # the parsed-trace cache in the data folder (no user code runs)
        policy.write.append(_trace_cache_folder())
    policy.inputs += reads  # granted one by one, even inside the data folder (its upload, a trace there)
    return policy


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def apply(policy: Policy, support: Support | None = None, unix_sockets: bool = True) -> str:
    """Confine this process (and all it starts) to ``policy``; returns what was applied.
    ``unix_sockets``: whether socket(AF_UNIX) stays allowed (only in namespaces, where no host
    socket is in view).

    Every layer binds the calling thread and its future children only, so this must run while the
    process has one thread (before ``import torch``, which starts one)."""
    support = support or probe()
    if not support.ok:
        raise SandboxError(f"the job sandbox is required ({SANDBOX_ENV}=1) but {support.reason}")
    if _threads() > 1:
        raise SandboxError("the job sandbox must be applied while the worker has a single thread")
    no_new_privs()
    restrict(policy.rules(), policy.network, support.landlock_abi)
    layers = [f"Landlock ABI {support.landlock_abi}"]
    if support.seccomp and not policy.network:
        filter_sockets(unix_sockets)
        layers.append("seccomp" + ("" if unix_sockets else " (no Unix sockets but socketpair)"))
    drop_capabilities()
    layers.append("no capabilities")
    if support.seccomp and not policy.network and not unix_sockets:
        _NO_UNIX_SOCKETS.append(True)
    what = " + ".join(layers) + ("; TCP allowed (distributed ranks)" if policy.network else "; no network")
    _CONFINED.append(what)
    return what


def torch_loaded() -> None:
    """Once the job has imported torch: where Unix sockets are refused, a DataLoader with workers
    fails at once naming why, instead of waiting forever for batches its workers cannot send."""
    if not _NO_UNIX_SOCKETS:
        return
    from torch.utils.data import dataloader

    def refuse(self, loader, *args, **kwargs):
        raise RuntimeError(DATALOADER_WORKERS_REFUSED)

    dataloader._MultiProcessingDataLoaderIter.__init__ = refuse


def prepare_temp(tmp_dir: Path) -> None:
    """Point every temp and cache location into the private ``tmp_dir`` (done with or without a sandbox)."""
    import tempfile

    for name, sub in TEMP_ENV.items():
        path = Path(tmp_dir) / sub if sub else Path(tmp_dir)
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    tempfile.tempdir = None  # re-read TMPDIR


def enter(job, artifact_dir: Path, tmp_dir: Path, hidden: list | tuple = (), *, shm_bytes: int | None = None,
          close: tuple = (), exit_as=None) -> str:
    """Called by the worker once it knows its job: private temp folders, namespaces where they can
    be had, then the sandbox the setting asks for. Returns a line for worker.log; raises SandboxError
    when the sandbox is required and cannot be applied, TrustError when the job is refused outright.
    ``shm_bytes``: the size of a private /dev/shm (the memory cap); ``close`` and ``exit_as``: see
    namespaces.isolate (this process may stay behind, waiting for the job's, and exit as it did)."""
    prepare_temp(tmp_dir)
    _remember_user_name()
    mode = setting()
    policy = policy_for(job, artifact_dir, tmp_dir, hidden)  # its refusals apply with the sandbox off too
    if mode == "off":
        return f"sandbox: off ({SANDBOX_ENV}=0)"
    net = _private_network(job)  # before seccomp, which refuses unshare
    support = probe()
    if not support.ok:
        if mode == "on":
            raise SandboxError(f"the job sandbox is required ({SANDBOX_ENV}=1) but {support.reason}")
        return f"sandbox: none ({support.reason})" + net
    if job.analysis in TRACE_CACHE_ANALYSES:
        # No user code runs: the host's view, so that the parsed columns are hard-linked from the
        # trace cache beside the run (a link cannot cross the view's separate bind mounts).
        inside, what = False, "not needed (a trace job runs no user code)"
    elif namespaces_setting():
        inside, what = namespaces.isolate(policy.view(shm_bytes or (1 << 30), Path(tmp_dir)), close, exit_as)
    else:
        inside, what = False, f"turned off ({NAMESPACES_ENV}=0)"
    applied = apply(policy, support, unix_sockets=inside)
    return f"sandbox: {applied}; " + (what if inside else f"no namespaces ({what})") + net


def _private_network(job) -> str:
    """A trace job on a Dask LocalCluster: a network namespace of its own with its loopback up, so that
    its scheduler and workers (which run whatever task reaches them, as this user) listen where no other
    user of the machine can connect. Refused (TrustError) where none can be had; '' for other jobs."""
    if not local_cluster_only(job):
        return ""
    ok, why = namespaces.private_network() if namespaces_setting() else (False, f"turned off ({NAMESPACES_ENV}=0)")
    if not ok:
        raise TrustError(f"--dask {job.options['dask'].strip()}: a LocalCluster needs a network of the job's own, "
                         f"so that no other user of this machine can reach its scheduler (whoever can runs code as "
                         f"you), and none could be had here ({why}); leave --dask out to analyse the ranks in local "
                         "processes")
    return f"; {why}"


def _remember_user_name() -> None:
    """getpass.getuser() falls back to /etc/passwd, which the sandbox hides: read the name first."""
    if any(os.environ.get(v) for v in ("LOGNAME", "USER", "LNAME", "USERNAME")):
        return
    try:
        import pwd

        os.environ["USER"] = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        pass
