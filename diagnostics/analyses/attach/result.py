"""An attached run's result, typed: frozen dataclasses with to_dict / from_dict (plain JSON both ways).

The keys a user reads first (``--json``, result.json, History) are the issue's: exit_code, steps,
step_boundary, profiled_steps, step_ms, breakdown_ms, bottleneck, overhead_pct, trace, ranks,
findings; the rest is what the views draw (per-step rows, workers, syncs, gradients, memory, GPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from diagnostics.analyses.attach.protocol import PHASES


@dataclass(frozen=True)
class Bottleneck:
    """The part of the step that takes the most time: its name, its share of the step, its ms."""

    category: str
    share: float
    ms: float

    @classmethod
    def of(cls, breakdown: dict, step_ms: float | None) -> "Bottleneck | None":
        if not breakdown or not step_ms:
            return None
        cat = max(PHASES, key=lambda k: breakdown.get(k) or 0.0)
        ms = breakdown.get(cat) or 0.0
        return cls(cat, ms / step_ms if step_ms > 0 else 0.0, ms)


@dataclass(frozen=True)
class RankResult:
    """One process that stepped: its rank (None for a single process), pid, step time (median of the
    steps outside the window), the parts of its step, its bottleneck and where its trace is."""

    rank: int | None
    pid: int
    steps: int
    step_ms: float | None
    breakdown_ms: dict
    bottleneck: Bottleneck | None
    profiled_steps: list | None
    step_ms_profiled: float | None
    overhead_pct: float | None
    trace: str | None
    busy_ms: float | None = None
    waited_for: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> "RankResult":
        return cls(**_typed(cls, d))


@dataclass(frozen=True)
class AttachResult:
    exit_code: int | None
    status: str  # ok | failed (the script exited non-zero) | interrupted | no steps
    command: list
    cwd: str
    duration_s: float | None
    steps: int
    step_boundary: str | None
    step_boundary_detail: str
    profiled_steps: list | None
    step_ms: float | None
    step_ms_profiled: float | None
    breakdown_ms: dict
    bottleneck: Bottleneck | None
    overhead_pct: float | None
    trace: str | list | None
    ranks: list = field(default_factory=list)  # RankResult
    waited_for_rank: int | None = None
    window: dict = field(default_factory=dict)
    overhead: dict = field(default_factory=dict)
    step_table: list = field(default_factory=list)
    workers: dict = field(default_factory=dict)
    loaders: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    model: dict = field(default_factory=dict)
    syncs: list = field(default_factory=list)
    memory: dict = field(default_factory=dict)
    gpu: dict | None = None
    gradients: dict | None = None
    ranks_view: dict | None = None
    findings: list = field(default_factory=list)
    fix_first: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    artifacts: list = field(default_factory=list)
    run_id: str | None = None
    run_dir: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "AttachResult":
        d = dict(d, ranks=[RankResult.from_dict(r) for r in d.get("ranks") or []])
        return cls(**_typed(cls, d))


def _typed(cls, d: dict) -> dict:
    """``d``'s keys that are fields of ``cls``, its bottleneck as a Bottleneck (unknown keys dropped)."""
    out = {f.name: d[f.name] for f in fields(cls) if f.name in d}
    if "bottleneck" in out:
        b = out["bottleneck"]
        out["bottleneck"] = Bottleneck(**b) if isinstance(b, dict) else b
    return out
