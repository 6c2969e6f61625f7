"""What a fix trial's run folder holds, and the fixes a trial knows. Standard library only: the trial
guest (diagnostics/attach/fixes.py) loads this file by its path inside the user's process, and the
orchestrator (diagnostics/attach/trials.py) and the analysis import it as a module.

One run of the user's script under one candidate (the baseline, the A/A control or a set of fixes) is
one run folder::

    trial.json          TrialConfig: the fixes to apply, warm-up and timed steps (the orchestrator writes it;
                        its presence makes the bootstrap load the trial guest instead of the attach agent)
    trial-<pid>.json    what the guest saw in the process that stepped: per fix applicable / reason / the
                        change to make, step times, losses and gradient norms of the warm-up steps, peak memory
    output.log          the script's stdout and stderr (its traceback when a candidate crashes)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields

TRIAL = "trial.json"
OUTCOME_PREFIX = "trial-"
OUTPUT = "output.log"

#: name -> (what its value is: None for a plain switch, "int" for NAME=N), what it does.
FIXES: dict[str, tuple[str | None, str]] = {
    "amp_bf16": (None, "autocast to bfloat16 around the top-level module's forward (outputs back to float32)"),
    "amp_fp16": (None, "autocast to float16 around the top-level module's forward, with a GradScaler"),
    "compile": (None, "torch.compile of the top-level module (Module.compile)"),
    "channels_last": (None, "the model and its 4-D inputs in channels_last memory format"),
    "loader_workers": ("int", "DataLoader(num_workers=N)"),
    "pin_memory": (None, "DataLoader(pin_memory=True)"),
    "persistent_workers": (None, "DataLoader(persistent_workers=True)"),
    "prefetch": ("int", "DataLoader(prefetch_factor=N)"),
    "fused_optimizer": (None, "the optimizer's fused=True"),
    "foreach_optimizer": (None, "the optimizer's foreach=True"),
    "set_to_none": (None, "zero_grad(set_to_none=True)"),
    "checkpointing": (None, "activation checkpointing of the repeated blocks (torch.utils.checkpoint)"),
    "cudnn_benchmark": (None, "torch.backends.cudnn.benchmark = True"),
    "tf32": (None, "TF32 matmuls and convolutions (torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32)"),
}
#: The attach findings (rules.py's ids) and the fixes that act on them: the "Try fixes" control ticks these
#: for a run whose finding is flagged (loader_workers takes the finding's ``workers_needed``).
FINDING_FIXES: dict[str, tuple[str, ...]] = {
    "data_wait": ("loader_workers", "persistent_workers", "pin_memory"),
    "host_bound": ("compile",),
    "launch_bound": ("compile", "cudnn_benchmark"),
    "gpu_idle": ("amp_bf16", "tf32"),
}
_FIX_RE = re.compile(r"^([a-z_0-9]+)(?:=(.*))?$")


def known_fixes() -> str:
    return ", ".join(f"{n}=N" if kind == "int" else n for n, (kind, _) in FIXES.items())


def parse_fix(text: str) -> str:
    """One fix in its canonical spelling (``loader_workers=4``); ValueError naming the problem and the known fixes."""
    m = _FIX_RE.match(text.strip())
    name = m.group(1) if m else text.strip()
    if not m or name not in FIXES:
        raise ValueError(f"unknown fix {text.strip()!r}; known fixes: {known_fixes()}")
    kind, value = FIXES[name][0], m.group(2)
    if kind is None:
        if value is not None:
            raise ValueError(f"the fix {name} takes no value, got {text.strip()!r}")
        return name
    if value is None or not value.isdigit() or int(value) < 1:
        raise ValueError(f"the fix {name} needs a whole number of at least 1, e.g. {name}=4; got {text.strip()!r}")
    return f"{name}={int(value)}"


def parse_fixes(text) -> tuple[str, ...]:
    """``amp_bf16,loader_workers=4`` (or a list of such strings) -> the fixes, canonical, each once, in order."""
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in str(t).split(",")]
    out: list[str] = []
    for p in parts:
        if not p.strip():
            continue
        fix = parse_fix(p)
        if fix.split("=")[0] in {f.split("=")[0] for f in out}:
            raise ValueError(f"the fix {fix.split('=')[0]} is given twice")
        out.append(fix)
    if not out:
        raise ValueError(f"no fix given; known fixes: {known_fixes()}")
    return tuple(out)


def split_fix(fix: str) -> tuple[str, int | None]:
    name, _, value = fix.partition("=")
    return name, (int(value) if value else None)


@dataclass(frozen=True)
class TrialConfig:
    """One run's candidate: ``fixes`` (canonical strings; empty: the baseline), ``warmup`` steps (untimed; their
    losses and gradient norms are recorded), then ``steps`` timed steps, after which the guest ends the script
    at the step boundary. ``compile_backend``: torch.compile's backend (tests use "eager")."""

    fixes: tuple[str, ...] = ()
    warmup: int = 3
    steps: int = 10
    compile_backend: str = "inductor"
    label: str = "baseline"
    extra: dict = field(default_factory=dict)

    def write(self, run_dir: str) -> None:
        d = asdict(self)
        d["fixes"] = list(self.fixes)
        with open(os.path.join(run_dir, TRIAL), "w") as f:
            json.dump(d, f)

    @classmethod
    def read(cls, run_dir: str) -> "TrialConfig":
        with open(os.path.join(run_dir, TRIAL)) as f:
            d = json.load(f)
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        d["fixes"] = tuple(d.get("fixes", ()))
        return cls(**d)


def outcome_name(pid: int) -> str:
    return f"{OUTCOME_PREFIX}{pid}.json"


def write_json(path: str, data) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, default=str)
    os.replace(tmp, path)


def suggested_fixes(findings) -> list[str]:
    """The fixes an attached run's flagged findings point to (FINDING_FIXES), each once, in the findings' order:
    ``loader_workers=K`` with the data_wait finding's ``workers_needed`` (at least 2, default 4). ``findings``:
    records with ``id``, ``status`` and ``numbers`` (diagnostics.findings.Finding)."""
    out: list[str] = []
    for f in findings:
        if getattr(f, "status", None) not in ("warn", "fail"):
            continue
        for name in FINDING_FIXES.get(getattr(f, "id", ""), ()):
            if name == "loader_workers":
                n = (getattr(f, "numbers", None) or {}).get("workers_needed") or 4
                name = f"loader_workers={max(2, int(n))}"
            if name.split("=")[0] not in {x.split("=")[0] for x in out}:
                out.append(name)
    return out
