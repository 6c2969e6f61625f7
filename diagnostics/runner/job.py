"""The job model: a job (analysis + spec + options), its outcome, what an analysis sees while it runs
(AnalysisContext), and ``execute``, which runs a job in the calling process (the worker calls it;
tests and notebooks may too). Also why a cancelled job stopped (``cancel_reason``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from diagnostics.errors import JobError, SpecError, TorchScopeError
from diagnostics.registry import get_analysis
from diagnostics.results import checked, checked_partial, timing_cv_of, with_disturbance
from diagnostics.spec import ModelSpec, cache_key

#: Stored as the error of a run stopped through its ``cancel`` event, unless the event carries a
#: ``reason`` of its own (the dashboard's shutdown does).
CANCELLED_MESSAGE = "cancelled: stopped by the user before it finished"

ProgressFn = Callable[[float, str], None]
#: Gets a running job's partial result (the analysis' declared ``partial`` type; a plain dict where it
#: declares none): rows known so far.
PartialFn = Callable[[object], None]


@dataclass(frozen=True)
class Job:
    analysis: str
    spec: ModelSpec | None
    options: dict = field(default_factory=dict)

    def validated(self) -> "Job":
        """This job with its options checked against the analysis' declaration and every default
        filled in (raises OptionError / TorchScopeError naming the problem)."""
        return Job(self.analysis, self.spec, get_analysis(self.analysis).validate(self.options))

    def key(self) -> str:
        """Same key, same computation: options are keyed with their defaults filled in, so a run that
        spells out a default and one that leaves it out share their result."""
        try:
            options = self.validated().options
        except TorchScopeError:
            options = self.options
        return cache_key(self.spec or ModelSpec(), self.analysis, options)

    def label(self) -> str | None:
        """What History shows in its model column: the model, or the trace file(s) a spec-less job reads."""
        if self.spec is not None:
            return self.spec.label
        o = dict(self.options)  # any analysis' options: read what is there

        def name(p) -> str:  # the file and its folder: a profiling run's id, or a trace's directory
            p = Path(str(p).rstrip("/"))
            return f"{p.parent.name[:24]}/{p.name}" if p.parent.name else p.name

        if o.get("path"):
            return name(o["path"])
        if o.get("before") and o.get("after"):
            return f"{name(o['before'])} vs {name(o['after'])}"
        if o.get("trace_dir"):
            return f"{name(o['trace_dir'])}/ (per-rank traces)"
        return None

    def to_dict(self) -> dict:
        return {"analysis": self.analysis, "spec": None if self.spec is None else self.spec.to_dict(),
                "options": self.options}

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        return cls(d["analysis"], None if d["spec"] is None else ModelSpec.from_dict(d["spec"]), d["options"])


@dataclass
class JobOutcome:
    status: str  # ok | error | timeout | crashed | oom | cancelled; "running": ui.jobs' job not finished yet
    result: Any = None  # the analysis' typed result (diagnostics.results), a plain dict if it declares no type
    error: str | None = None
    error_type: str | None = None
    run_id: str | None = None
    duration_s: float = 0.0
    log_tail: str = ""
    artifact_dir: str | None = None
    from_cache: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def unwrap(self):
        if not self.ok:
            raise JobError(self.error or self.status)
        return self.result


#: Analyses that run on a model built on the meta device (counts on fake tensors, no measurement).
META_ANALYSES = ("summary", "memory", "validate", "plan")


class AnalysisContext:
    """What an analysis sees: the loaded model (lazily), options, progress, partial results and an
    artifact folder."""

    def __init__(self, job: Job, artifact_dir: Path, progress: ProgressFn | None = None,
                 partial: PartialFn | None = None):
        self.job = job
        self.spec = job.spec
        self.options = job.options
        self.artifact_dir = Path(artifact_dir)
        self._progress = progress
        self._partial = partial
        self._loaded = None

    @property
    def loaded(self):
        if self._loaded is None:
            from diagnostics.intake import load_model

            self.progress(0.0, "loading model")
            loaded = load_model(self.spec)
            if loaded.meta and self.job.analysis not in META_ANALYSES:
                raise SpecError(f"{self.spec.label} was {loaded.meta}: nothing was allocated, so only the "
                                      f"counting analyses run on it ({', '.join(META_ANALYSES)}); for "
                                      f"{self.job.analysis}, use a smaller config")
            self._loaded = loaded
        return self._loaded

    def progress(self, fraction: float, message: str = "") -> None:
        if self._progress is not None:
            self._progress(max(0.0, min(1.0, float(fraction))), message)

    def partial(self, result) -> None:
        """Report what is known so far (the analysis' declared partial type; the page and the CLI draw it
        while the job runs)."""
        if self._partial is not None:
            self._partial(result)


def execute(job: Job, artifact_dir: Path, progress: ProgressFn | None = None,
            partial: PartialFn | None = None):
    """Run the analysis in this process (the worker calls this; tests and notebooks may too): its typed
    result, encoded and decoded once as it will cross the process boundary (diagnostics.results); so
    is each partial result ``partial`` gets."""
    analysis = get_analysis(job.analysis)
    job = job.validated()
    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    ctx = AnalysisContext(job, artifact_dir, progress,
                          None if partial is None else lambda p: partial(checked_partial(analysis, p)))
    if not analysis.exclusive:
        return checked(analysis, analysis.load()(ctx, dict(job.options)))
    # A timed analysis: was the machine busy meanwhile? (measure.disturbance; the figures and the
    # verdict go into the result, and a page, the report and the CLI say so.)
    from diagnostics.measure.disturbance import assess, watch

    with watch() as w:
        result = analysis.load()(ctx, dict(job.options))
    return checked(analysis, with_disturbance(result, assess(w.figures, timing_cv_of(result))))


def cancel_reason(cancel: threading.Event) -> str:
    """What to store for a run stopped through ``cancel``: its own ``reason`` if it has one."""
    return getattr(cancel, "reason", None) or CANCELLED_MESSAGE
