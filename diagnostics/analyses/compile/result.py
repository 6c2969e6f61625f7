"""The compile explorer's result, typed (diagnostics.results: one serialisation for the worker, the store,
--json and result.json), and its partial result (Dynamo's findings while the compile and the timing run:
ctx.partial). No torch.

Dynamo's findings come from torch._dynamo.explain (graphs, graph breaks grouped by reason and place) and
its recompile log (measure.dynamo); the times from the one comparison (measure.compare: interleaved rounds,
an interval, a verdict beside the A/A control's).
"""

from __future__ import annotations

from typing import Annotated, Any

from diagnostics.declare import column, metric, table
from diagnostics.results import UNSET, Record, Result, UnsetType


class GraphBreak(Record, frozen=True, kw_only=True):
    """One graph break, grouped by its reason's first line and the user's source line it happened at."""

    reason: str
    #: "file.py:line" of the user's frame (None: Dynamo named none)
    location: Annotated[str | None, column("text", "file:line")]
    #: the source line(s) there
    code: str | None
    count: Annotated[int, column("count", "times hit")]
    #: the rewrite that usually removes it (None: no known one)
    suggestion: str | None


class Graph(Record, frozen=True, kw_only=True):
    """One graph Dynamo captured, in execution order: its ops and the modules it spans."""

    index: int
    ops: Annotated[int, column("count", "ops")]
    modules: tuple[str, ...]


class Recompile(Record, frozen=True, kw_only=True):
    """One recompile: the function, where it is, the guards that failed and what to change (None: no advice)."""

    function: str | None
    where: str | None
    guard_failures: tuple[str, ...]
    advice: str | None


class Frame(Record, frozen=True, kw_only=True):
    frame: int
    seconds: Annotated[float, column("s", "compile time")]


class Timing(Record, frozen=True, kw_only=True):
    """One side of the comparison (eager, compiled, the A/A control): its times and, but for eager (the
    baseline), its speed-up over eager with its 95% interval (None below 6 rounds) and verdict."""

    median_ms: float
    p90_ms: float
    time_ms: float
    speedup: float | None
    speedup_ci: tuple[float, float] | None
    verdict: str | None
    rounds: int
    round_ms: tuple[float, ...]


class Control(Record, frozen=True, kw_only=True):
    """The training comparison's A/A control: the eager step timed against itself."""

    speedup: float | None
    speedup_ci: tuple[float, float] | None
    verdict: str | None


class TrainTiming(Record, frozen=True, kw_only=True):
    """A training step (forward, loss, backward; no optimizer step), eager vs compiled, interleaved."""

    eager_ms: float
    compiled_ms: float
    speedup: float | None
    speedup_ci: tuple[float, float] | None
    verdict: str | None
    control: Control | UnsetType = UNSET


class CompileMetrics(Record, frozen=True, kw_only=True):
    graph_count: Annotated[int, metric("count", "Graphs", "as Dynamo counts them (torch._dynamo.explain)")]
    graph_break_count: Annotated[int, metric("count", "Graph breaks")]
    break_sites: Annotated[int, metric("count", "Break sites", "distinct reason and source line")]
    op_count: Annotated[int, metric("count", "Ops captured")]
    recompiles: Annotated[int, metric("count", "Recompiles")]
    #: None: fullgraph=True was not tried (option off)
    fullgraph_ok: Annotated[bool | None, metric("bool", "Compiles with fullgraph=True")]
    compile_time_s: Annotated[float | None, metric("s", "Compile time", "Dynamo + backend, all frames of the "
                                                                          "first call")]
    first_call_ms: Annotated[float, metric("ms", "First compiled call")]
    eager_ms: Annotated[float, metric("ms", "Eager (time per call)", "geometric mean of the interleaved rounds' times")]
    compiled_ms: Annotated[float, metric("ms", "Compiled (time per call)",
                                         "geometric mean of the interleaved rounds' times")]
    speedup: Annotated[float | None, metric("ratio", "Compiled speed-up", "eager time / compiled time: the geometric "
                                            "mean of the interleaved rounds' ratios",
                                            interval=("speedup_ci_low", "speedup_ci_high"), verdict="verdict")]
    speedup_ci_low: Annotated[float | None, metric("ratio", "Speed-up interval, low")]
    speedup_ci_high: Annotated[float | None, metric("ratio", "Speed-up interval, high")]
    verdict: Annotated[str | None, metric("text", "Verdict")]
    #: the training step's comparison: None without it (option train off)
    train_speedup: Annotated[float | None, metric("ratio", "Training-step speed-up",
                                                  interval=("train_speedup_ci_low", "train_speedup_ci_high"),
                                                  verdict="train_verdict")]
    train_speedup_ci_low: Annotated[float | None, metric("ratio", "Training-step speed-up interval, low")]
    train_speedup_ci_high: Annotated[float | None, metric("ratio", "Training-step speed-up interval, high")]
    train_verdict: Annotated[str | None, metric("text", "Training-step verdict")]
    #: None: not the inductor backend (the notes say so)
    generated_kernels: Annotated[int | None, metric("count", "Generated kernels", "inductor only")]


class CompileResult(Result, frozen=True, kw_only=True):
    model: str
    device: str
    batch_size: int | None
    #: the options as run (backend, mode, dynamic, fullgraph, recompile_probe, train, rounds, warmup)
    options: dict[str, Any]
    metrics: CompileMetrics
    graph_breaks: Annotated[tuple[GraphBreak, ...], table("Graph breaks")]
    graphs: Annotated[tuple[Graph, ...], table("Graphs")]
    recompiles: Annotated[tuple[Recompile, ...], table("Recompiles")]
    compile_frames: Annotated[tuple[Frame, ...], table("Compile time per frame")]
    #: the first break's error under fullgraph=True (None: it compiled whole, or was not tried)
    fullgraph_error: str | None
    #: eager, compiled and the A/A control
    timing: dict[str, Timing]
    train_timing: TrainTiming | None
    timing_cv: float | None
    torch_version: str
    notes: tuple[str, ...]


class DynamoMetrics(Record, frozen=True, kw_only=True):
    """Dynamo's counts as soon as explain has them; the recompiles and fullgraph once the light pass has run."""

    graph_count: int
    graph_break_count: int
    break_sites: int
    op_count: int
    recompiles: int | UnsetType = UNSET
    fullgraph_ok: bool | None | UnsetType = UNSET


class CompilePartial(Record, frozen=True, kw_only=True):
    """What the job reports while it runs: ``stage`` explain (graphs and breaks), dynamo (fullgraph and the
    recompiles too), compiled (the user's backend compiled: the compile time and the first call)."""

    model: str
    device: str
    batch_size: int | None
    options: dict[str, Any]
    stage: str
    metrics: DynamoMetrics
    graph_breaks: tuple[GraphBreak, ...]
    graphs: tuple[Graph, ...]
    #: None until the light pass ran
    recompiles: tuple[Recompile, ...] | None
    fullgraph_error: str | None
    compile_time_s: float | None | UnsetType = UNSET
    first_call_ms: float | UnsetType = UNSET
