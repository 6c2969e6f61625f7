"""The plan's result as typed, frozen records (no torch), each with to_dict / from_dict: what
``analyze`` returns is ``PlanResult.to_dict()``, plain JSON for the store, the report and the CLI.

Categories of memory at a peak (``Row.parts``): parameters (and buffers), gradients, optimizer
state, activations (saved for backward, kept or recomputed by checkpointing), kv cache (inference),
temporaries, inputs,
rounding (CUDA's caching allocator: 512-byte blocks, and blocks it serves a request with without
splitting them), workspaces (CUDA: the cuBLAS / cuBLASLt workspaces a step's threads keep, and kernels'
own scratch at the peak). Their sum is ``peak_bytes``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

#: Row.parts keys, in the order charts and tables show them.
PART_KEYS = ("parameters", "gradients", "optimizer state", "activations", "kv cache", "temporaries", "inputs",
             "rounding", "workspaces")


def _build(cls, d: dict):
    return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True)
class Row:
    """One configuration's prediction. ``how``: "traced" (this configuration ran on fake tensors) or
    "fitted" (interpolated from traced neighbours, see sweep.py). ``fits`` / ``headroom_bytes`` are for
    the result's device: headroom = capacity - context - peak (negative: over by that much)."""

    batch: int
    seq: int | None
    dtype: str
    optimizer: str
    checkpointing: str
    shard: str
    ranks: int
    offload: bool
    mode: str
    peak_bytes: int
    parts: dict
    phase: str
    module: str
    fits: bool
    headroom_bytes: int
    how: str = "traced"
    setting: str = ""
    host_bytes: int = 0
    recompute_flops: int | None = None
    analytic: tuple = ()
    kv_dtype: str = "model"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["analytic"] = list(self.analytic)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        d = dict(d)
        d["analytic"] = tuple(d.get("analytic") or ())
        return _build(cls, d)


@dataclass(frozen=True)
class MaxBatch:
    """The largest batch that fits at one sequence length for one setting; ``checked``: the traces at the
    boundary that confirmed it (that batch fits, the next one does not)."""

    setting: str
    seq: int | None
    max_batch: int
    peak_bytes: int | None
    checked: str
    limit: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MaxBatch":
        return _build(cls, d)


@dataclass(frozen=True)
class Grid:
    """Predicted peaks over batch x sequence for one setting (fitted from traced points, see sweep.py)."""

    setting: str
    batches: list
    seqs: list
    peak_bytes: list  # [seq index][batch index]
    fits: list
    traced_points: list  # [[batch, seq], ...] the fit used

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Grid":
        return _build(cls, d)


@dataclass(frozen=True)
class Suggestion:
    """A change that brings a configuration under the device's memory, with its predicted peak and cost."""

    change: str
    peak_bytes: int
    fits: bool
    headroom_bytes: int
    cost: str
    recompute_flops: int | None = None
    batch: int | None = None
    seq: int | None = None
    setting: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Suggestion":
        return _build(cls, d)


@dataclass(frozen=True)
class PlanResult:
    model: str
    device: dict  # targets.Target.to_dict()
    options: dict
    rows: tuple
    max_batch: tuple = ()
    grids: tuple = ()
    suggestions: tuple = ()
    timeline: dict | None = None
    analytic_modules: dict = field(default_factory=dict)
    notes: tuple = ()
    metrics: dict = field(default_factory=dict)
    method: str = ""
    traced_on: str = ""

    def to_dict(self) -> dict:
        keys = PART_KEYS
        rows = [r.to_dict() for r in self.rows]
        return {
            "model": self.model, "device": dict(self.device), "options": dict(self.options),
            "rows": rows,
            "breakdown": [{"configuration": f"{r['setting']} · batch {r['batch']}"
                           + (f" · seq {r['seq']}" if r["seq"] is not None else ""),
                           **{k.replace(" ", "_"): r["parts"].get(k, 0) for k in keys}} for r in rows],
            "max_batch": [m.to_dict() for m in self.max_batch],
            "grids": [g.to_dict() for g in self.grids],
            "suggestions": [s.to_dict() for s in self.suggestions],
            "timeline": self.timeline, "analytic_modules": dict(self.analytic_modules),
            "notes": list(self.notes), "metrics": dict(self.metrics), "method": self.method,
            "traced_on": self.traced_on,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "PlanResult":
        return cls(model=d["model"], device=d["device"], options=d["options"],
                   rows=tuple(Row.from_dict(r) for r in d["rows"]),
                   max_batch=tuple(MaxBatch.from_dict(m) for m in d.get("max_batch") or ()),
                   grids=tuple(Grid.from_dict(g) for g in d.get("grids") or ()),
                   suggestions=tuple(Suggestion.from_dict(s) for s in d.get("suggestions") or ()),
                   timeline=d.get("timeline"), analytic_modules=d.get("analytic_modules") or {},
                   notes=tuple(d.get("notes") or ()), metrics=d.get("metrics") or {}, method=d.get("method", ""),
                   traced_on=d.get("traced_on", ""))
