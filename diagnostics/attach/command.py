"""The command an attached run starts, checked before anything runs: ``python script.py ...``,
``python -m pkg.module ...``, ``torchrun [its args] script.py ...`` (or ``python -m
torch.distributed.run``), or any other executable, whose Python processes the bootstrap reaches
through the environment too. Each problem is a UsageError that names it (exit 2, nothing started).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from diagnostics.errors import TorchScopeError

#: Python options that take a value (``-W ignore``): the script comes after them.
PY_OPTS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")
#: Python options that would keep the bootstrap out: -E / -I ignore PYTHONPATH, -S skips site (sitecustomize).
PY_OPTS_NO_BOOTSTRAP = {"-E": "ignores PYTHON* variables (PYTHONPATH)", "-I": "isolates it from PYTHONPATH and "
                        "the user's site folder", "-S": "skips the site module (no sitecustomize)"}
PYTHON_NAME_RE = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?[mtd]?(?:\.exe)?$")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


class UsageError(TorchScopeError):
    """The command cannot be run as given (exit 2); the message says why."""


@dataclass(frozen=True)
class Command:
    """A checked command: what it is (``kind``: script, module, code, torchrun, other), the Python
    program it runs (script path or module; None for other), and torchrun's processes per node."""

    argv: tuple[str, ...]
    cwd: str
    kind: str
    executable: str
    target: str | None = None
    nproc: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        """What History shows for the run: the script or module (and ``torchrun`` x N)."""
        name = Path(self.target).name if self.kind in ("script", "torchrun") and self.target else (self.target or "")
        if self.kind == "torchrun":
            return f"torchrun x{self.nproc or '?'} {name}".strip()
        if self.kind == "module":
            return f"-m {name}"
        return name or Path(self.argv[0]).name

    def to_dict(self) -> dict:
        return {"argv": list(self.argv), "cwd": self.cwd, "kind": self.kind, "executable": self.executable,
                "target": self.target, "nproc": self.nproc, "notes": list(self.notes)}


def is_python(word: str) -> bool:
    return bool(PYTHON_NAME_RE.match(Path(word).name))


def _executable(word: str, cwd: str) -> str:
    """The program's path, as the shell would find it (a path with a slash is taken as is)."""
    if os.sep in word:
        path = Path(word) if os.path.isabs(word) else Path(cwd) / word
        if not path.exists():
            raise UsageError(f"command not found: {word} (no such file)")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise UsageError(f"cannot run {word}: it is not an executable file")
        return str(path)
    found = shutil.which(word)
    if found is None:
        raise UsageError(f"command not found: {word} (not on PATH)")
    return found


def _check_script(script: str, cwd: str) -> str:
    """A Python script that exists and is Python (a .py file, or text that compiles as Python)."""
    path = Path(script) if os.path.isabs(script) else Path(cwd) / script
    if not path.exists():
        raise UsageError(f"the script {script} does not exist (looked in {cwd})")
    if path.is_dir():
        if (path / "__main__.py").exists():
            return str(path)
        raise UsageError(f"the script {script} is a folder without __main__.py")
    if path.suffix in (".py", ".pyw"):
        return str(path)
    try:
        data = path.read_bytes()[: 1 << 20]
    except OSError as e:
        raise UsageError(f"cannot read the script {script}: {e.strerror}") from None
    if path.suffix in (".pyc", ".pyz") or data[:4] == b"PK\x03\x04":
        return str(path)  # compiled Python or a zip application: Python runs them
    try:
        compile(data.decode("utf-8"), str(path), "exec")
    except (UnicodeDecodeError, SyntaxError, ValueError) as e:
        kind = "a binary file" if b"\x00" in data[:4096] else f"not Python ({type(e).__name__}: {e})"
        raise UsageError(f"the script {script} is not a Python script: {kind}") from None
    return str(path)


def _module_found(python: str, module: str, cwd: str, env: dict) -> bool | None:
    """Whether ``python`` finds the top-level package of ``module`` from ``cwd`` (None: could not tell).

    Only the top-level name is looked up: finding ``pkg.sub`` would import ``pkg`` and run its code."""
    top = module.split(".", 1)[0]
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"
    try:
        p = subprocess.run([python, "-c", code, top], cwd=cwd, env=env, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 3: False}.get(p.returncode)


def _python_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(interpreter options, the rest) of a python command line after the interpreter's name."""
    opts, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-m", "-c") or a == "-" or not a.startswith("-"):
            break
        if a == "--":
            i += 1
            break
        opts.append(a)
        if a in PY_OPTS_WITH_VALUE:
            if i + 1 < len(argv):
                opts.append(argv[i + 1])
            i += 1
        i += 1
    return opts, argv[i:]


def _refuse_no_bootstrap(opts: list[str]) -> None:
    for o in opts:
        if o.startswith("-") and not o.startswith("--"):
            for flag, why in PY_OPTS_NO_BOOTSTRAP.items():
                if flag[1] in o[1:] and o not in PY_OPTS_WITH_VALUE:
                    raise UsageError(f"python {flag} {why}, which keeps TorchScope's bootstrap out of the process: "
                                     f"run the command without {flag}")


def _torchrun(args: list[str], cwd: str) -> tuple[str, str | None, tuple[str, ...]]:
    """(training script or module, --nproc-per-node, notes), read with torchrun's own argument parser;
    a training script must exist and be Python."""
    try:
        from torch.distributed.run import get_args_parser
    except Exception as e:  # torch without torch.distributed: torchrun cannot run either
        raise UsageError(f"torchrun's arguments cannot be read here: {type(e).__name__}: {e}") from None
    parser = get_args_parser()
    errors: list[str] = []

    def error(message):
        errors.append(message)
        raise SystemExit(2)

    parser.error = error
    try:
        parsed = parser.parse_args(args)
    except SystemExit:
        raise UsageError(f"torchrun's arguments are not valid: {errors[0] if errors else ' '.join(args)}") from None
    script, notes = parsed.training_script, []
    if getattr(parsed, "no_python", False):
        notes.append("torchrun --no-python: the training program is not run by Python itself; the bootstrap "
                     "reaches the Python processes it starts")
    elif getattr(parsed, "module", False):
        notes.append(f"torchrun -m: the training program is the module {script}")
    else:
        script = _check_script(script, cwd)
    return script, str(parsed.nproc_per_node), tuple(notes)


def check_command(argv: list[str], cwd: str | None = None, env: dict | None = None) -> Command:
    """The command, checked: it exists, its script exists and is Python, its interpreter options keep
    the bootstrap in. Raises UsageError naming the problem."""
    if not argv:
        raise UsageError("no command given: put it after --, e.g. `python -m diagnostics run -- python train.py`")
    cwd = str(Path(cwd or os.getcwd()).resolve())
    if not Path(cwd).is_dir():
        raise UsageError(f"the working folder {cwd} does not exist")
    env = dict(os.environ if env is None else env)
    exe = _executable(argv[0], cwd)
    name = Path(argv[0]).name
    if name == "torchrun":
        target, nproc, notes = _torchrun(argv[1:], cwd)
        return Command(tuple(argv), cwd, "torchrun", exe, target, nproc, notes)
    if not is_python(argv[0]):
        return Command(tuple(argv), cwd, "other", exe, None, None,
                       (f"{name} is not python or torchrun: the bootstrap reaches every Python process it starts "
                        "(through PYTHONPATH), as long as the environment is passed on",))
    opts, rest = _python_args(list(argv[1:]))
    _refuse_no_bootstrap(opts)
    if not rest:
        raise UsageError(f"{name} without a script would start an interactive interpreter: give the script, e.g. "
                         f"`{name} train.py`")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise UsageError(f"{name} -m needs a module name")
        module = rest[1]
        if module in TORCHRUN_MODULES:
            target, nproc, notes = _torchrun(rest[2:], cwd)
            return Command(tuple(argv), cwd, "torchrun", exe, target, nproc, notes)
        found = _module_found(exe, module, cwd, env)
        if found is False:
            raise UsageError(f"no module named {module.split('.', 1)[0]} for {name} in {cwd} (nor on its sys.path)")
        return Command(tuple(argv), cwd, "module", exe, module)
    if rest[0] == "-c":
        return Command(tuple(argv), cwd, "code", exe, "-c")
    if rest[0] == "-":
        raise UsageError(f"{name} - reads the program from stdin: give a script file instead")
    return Command(tuple(argv), cwd, "script", exe, _check_script(rest[0], cwd))


def child_environment(run_dir: str, base: dict | None = None) -> dict:
    """The job's environment: the caller's, with the bootstrap first on PYTHONPATH and the run folder."""
    from diagnostics.analyses.attach.protocol import RUN_DIR_ENV

    env = dict(os.environ if base is None else base)
    boot = str(Path(__file__).resolve().parent / "bootstrap")
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = boot + (os.pathsep + old if old else "")
    env[RUN_DIR_ENV] = str(run_dir)
    return env
