"""The compile job: Dynamo's graphs, graph breaks and recompiles first (no code generated: a light
backend, seconds), reported at once as a partial result; then the model compiled as the user asked, its
first (compiling) call and eager vs compiled time interleaved.

The model is compiled in the worker; the user's model is left as it was (weights, modes). Numbers
come from Dynamo itself (torch._dynamo.explain, its compile-time metrics and recompile log) and
from the one timer (measure.compare: interleaved rounds in a fresh random order each, an exact interval,
a verdict beyond the A/A control's interval).

Where the time goes (docs/compile.md): the Dynamo pass costs tenths of a second on a small model; the
user's backend compiles once (inductor on the worker's empty compiler cache without its one-off probes:
measure.dynamo.empty_cache_codegen). The recompile probe (a call at twice the batch) runs on the light
backend, where a recompile costs a Dynamo trace, not a second inductor compile: the guards that fail are
Dynamo's, whatever the backend.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import torch
import torch._dynamo

from diagnostics.analyses.compile import ANALYSIS
from diagnostics.analyses.compile.result import (CompileMetrics, CompilePartial, CompileResult, Control, DynamoMetrics,
                                                 Frame, Graph, GraphBreak, Recompile, Timing, TrainTiming)
from diagnostics.errors import ModelRunError, TorchScopeError
from diagnostics.inputs import call as call_model
from diagnostics.measure.compare import CONTROL, METHOD, control_problem, interleaved, too_few_rounds
from diagnostics.measure.dynamo import compile_seconds, empty_cache_codegen, explain, watch_recompiles
from diagnostics.measure.state import restored_state
from diagnostics.measure.timer import time_once
from diagnostics.measure.training import Step, Trainee
from diagnostics.results import to_plain

#: The backend of the first pass: Dynamo's graphs run as they are, nothing generated.
LIGHT_BACKEND = "eager"


def _first_line(e: BaseException) -> str:
    text = next((l.strip() for l in str(e).splitlines() if l.strip()), "")
    return f"{type(e).__name__}: {text}"[:500]


def _dynamic(o: dict):
    return {"auto": None, "static": False, "dynamic": True}[o["dynamic"]]


def _compile(model, o: dict, **extra):
    kwargs = {"backend": o["backend"], "dynamic": _dynamic(o), **extra}
    if o["mode"] != "default" and o["backend"] == "inductor":
        kwargs["mode"] = o["mode"]
    return torch.compile(model, **kwargs)


def _dynamo_pass(model, loaded, o: dict, notes: list[str]) -> dict:
    """fullgraph=True (does the forward compile as one graph; if not, the first break's error) and the
    recompile probe (the batch, then twice the batch), both on the light backend."""
    out = {"fullgraph_ok": None, "fullgraph_error": None, "recompiles": []}
    if o["fullgraph"]:
        torch._dynamo.reset()
        try:
            with torch.no_grad():
                call_model(torch.compile(model, fullgraph=True, backend=LIGHT_BACKEND), loaded.inputs)
            out["fullgraph_ok"] = True
        except Exception as e:
            out["fullgraph_ok"], out["fullgraph_error"] = False, _first_line(e)
    if o["recompile_probe"] and loaded.make_inputs is not None and loaded.batch_size:
        torch._dynamo.reset()
        light = torch.compile(model, backend=LIGHT_BACKEND, dynamic=_dynamic(o))
        bigger = loaded.make_inputs(2 * loaded.batch_size)
        with watch_recompiles() as found, torch.no_grad():
            call_model(light, loaded.inputs)
            try:
                call_model(light, bigger)
            except Exception as e:
                notes.append(f"the model failed under Dynamo at batch {2 * loaded.batch_size}: {_first_line(e)}")
        out["recompiles"] = found
    torch._dynamo.reset()
    return out


def _graph_breaks(ex: dict) -> tuple[GraphBreak, ...]:
    """Dynamo's graph breaks (measure.dynamo.explain's rows) as this analysis' records."""
    return tuple(GraphBreak(reason=b["reason"], location=b["location"], code=b["code"], count=b["count"],
                            suggestion=b["suggestion"]) for b in ex["graph_breaks"])


def _graphs(ex: dict) -> tuple[Graph, ...]:
    return tuple(Graph(index=g["index"], ops=g["ops"], modules=tuple(g["modules"])) for g in ex["graphs"])


def _recompiles(found: list[dict]) -> tuple[Recompile, ...]:
    """The recompiles measure.dynamo.watch_recompiles saw, as this analysis' records."""
    return tuple(Recompile(function=r["function"], where=r["where"], guard_failures=tuple(r["guard_failures"]),
                           advice=r["advice"]) for r in found)


def _dynamo_partial(result: dict, ex: dict, dyn: dict | None, o: dict, **compiled) -> CompilePartial:
    """What the page shows before the compile and the timing: Dynamo's graphs, breaks and recompiles (and,
    ``compiled``, the compile time and the first call)."""
    counts = {"graph_count": ex["graph_count"], "graph_break_count": ex["graph_break_count"],
              "break_sites": len(ex["graph_breaks"]), "op_count": ex["op_count"]}
    if dyn is not None:
        counts.update(recompiles=len(dyn["recompiles"]), fullgraph_ok=dyn["fullgraph_ok"])
    stage = "compiled" if compiled else "dynamo" if dyn is not None else "explain"
    return CompilePartial(
        **result, options=dict(o), stage=stage, metrics=DynamoMetrics(**counts), graph_breaks=_graph_breaks(ex),
        graphs=_graphs(ex), recompiles=None if dyn is None else _recompiles(dyn["recompiles"]),
        fullgraph_error=None if dyn is None else dyn["fullgraph_error"], **compiled)


def _explain(model, inputs) -> dict:
    """Dynamo's graphs and graph breaks (torch._dynamo.explain); its failure is the job's, named."""
    try:
        with torch.no_grad():
            return explain(model, inputs)
    except Exception as e:  # Dynamo failing outright is what the user needs to see
        raise ModelRunError(f"torch._dynamo.explain failed on the model: {_first_line(e)}") from e


@dataclass
class _Timed:
    """The user's backend at work: its first (compiling) call, the frames it compiled, the kernels it
    generated, the recompiles while it ran, and eager vs compiled interleaved."""

    first_ms: float
    frames: list
    kernels_before: int | None
    kernels: int | None
    recompiles: list
    cmp: dict


def _compiled_and_timed(ctx, loaded, o: dict, codegen: ExitStack, partial) -> _Timed:
    """Compile the model as the user asked (on an empty compiler cache), time its first call, report it
    (``partial(compile_time_s=..., first_call_ms=...)``), then time eager vs compiled in interleaved rounds."""
    model, inputs, device = loaded.model, loaded.inputs, loaded.device
    codegen.enter_context(empty_cache_codegen())  # from here on: the Dynamo pass generated nothing
    torch._dynamo.reset()
    kernels_before = _kernel_count()
    frames_before = len(compile_seconds())
    compiled = _compile(model, o)

    def eager_call():
        with torch.no_grad():
            return call_model(model, inputs)

    def compiled_call():
        with torch.no_grad():
            return call_model(compiled, inputs)

    with watch_recompiles() as recompiles:  # any the user's backend adds while it runs
        try:
            first_ms = time_once(compiled_call, device)
        except Exception as e:
            raise ModelRunError(f"the compiled model failed on its first call ({o['backend']}): "
                                f"{_first_line(e)}") from e
        frames = compile_seconds()[frames_before:]
        kernels = _kernel_count()
        partial(compile_time_s=sum(frames) if frames else None, first_call_ms=first_ms)
        ctx.progress(0.55, f"eager vs compiled: {o['rounds']} interleaved rounds")
        cmp = interleaved({"eager": eager_call, "compiled": compiled_call}, device, o["rounds"], o["warmup"],
                          batch_size=loaded.batch_size, control=True,
                          progress=lambda f, m: ctx.progress(0.55 + 0.3 * f, m))
    return _Timed(first_ms, frames, kernels_before, kernels, recompiles, cmp)


def _generated_kernels(t: _Timed, o: dict, notes: list[str]) -> int | None:
    if t.kernels is not None and t.kernels_before is not None and o["backend"] == "inductor":
        return t.kernels - t.kernels_before
    notes.append("generated kernels are counted for the inductor backend only")
    return None


def _closing_notes(loaded, o: dict, ex: dict, cmp: dict, train: dict | None, notes: list[str]) -> None:
    if ex["graph_break_count"]:
        notes.append(f"{ex['graph_break_count']} graph break(s): each splits the model into separately compiled "
                     "graphs with Python in between; fix the listed lines to give the compiler the whole model")
    if o["recompile_probe"]:
        notes.append(f"recompiles: Dynamo's guards at batch {loaded.batch_size} and then {2 * (loaded.batch_size or 0)} "
                     f"(backend {LIGHT_BACKEND}: the guards are Dynamo's whatever the backend), and any while the "
                     f"{o['backend']} model was timed")
    notes += [f"eager vs compiled: {o['rounds']} {METHOD}"]
    notes += [n for n in (too_few_rounds(o["rounds"]), control_problem(cmp),
                          train and control_problem({CONTROL: to_plain(train.control)})) if n]


def analyze(ctx, options: dict) -> CompileResult:
    o = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    loaded = ctx.loaded
    model, inputs, device = loaded.model, loaded.inputs, loaded.device
    if isinstance(model, torch.jit.ScriptModule):
        raise TorchScopeError("a TorchScript model cannot be compiled with torch.compile (it is already a graph); "
                              "load the Python model or an exported program instead")
    notes: list[str] = []
    result: dict = {"model": loaded.spec.label, "device": str(device), "batch_size": loaded.batch_size}
    codegen = ExitStack()
    with restored_state(model), codegen:
        model.eval()
        ctx.progress(0.05, "Dynamo: graphs and graph breaks (torch._dynamo.explain)")
        ex = _explain(model, inputs)
        ctx.partial(_dynamo_partial(result, ex, None, o))
        ctx.progress(0.1, f"Dynamo: fullgraph=True and recompiles at batch x2 (backend {LIGHT_BACKEND})")
        dyn = _dynamo_pass(model, loaded, o, notes)
        ctx.partial(_dynamo_partial(result, ex, dyn, o))
        ctx.progress(0.15, f"compiling (backend {o['backend']}, mode {o['mode']})")
        t = _compiled_and_timed(ctx, loaded, o, codegen,
                                lambda **compiled: ctx.partial(_dynamo_partial(result, ex, dyn, o, **compiled)))
        train = None
        if o["train"]:
            ctx.progress(0.88, "training step: eager vs compiled")
            train = _train_comparison(model, loaded, o, device)

    recompiles = dyn["recompiles"] + t.recompiles
    torch._dynamo.reset()
    cmp, frames = t.cmp, t.frames
    c = cmp["compiled"]
    ci = c["speedup_ci"] or [None, None]
    generated = _generated_kernels(t, o, notes)
    _closing_notes(loaded, o, ex, cmp, train, notes)
    tci = (train.speedup_ci if train is not None else None) or [None, None]
    metrics = CompileMetrics(
        graph_count=ex["graph_count"], graph_break_count=ex["graph_break_count"],
        break_sites=len(ex["graph_breaks"]), op_count=ex["op_count"],
        recompiles=len(recompiles), fullgraph_ok=dyn["fullgraph_ok"],
        compile_time_s=sum(frames) if frames else None, first_call_ms=t.first_ms,
        eager_ms=cmp["eager"]["time_ms"], compiled_ms=c["time_ms"],
        speedup=c["speedup"], speedup_ci_low=ci[0], speedup_ci_high=ci[1], verdict=c["verdict"],
        train_speedup=None if train is None else train.speedup,
        train_speedup_ci_low=tci[0], train_speedup_ci_high=tci[1],
        train_verdict=None if train is None else train.verdict,
        generated_kernels=generated,
    )
    ctx.progress(1.0, "done")
    return CompileResult(
        **result, options=dict(o), metrics=metrics,
        graph_breaks=_graph_breaks(ex), graphs=_graphs(ex), recompiles=_recompiles(recompiles),
        compile_frames=tuple(Frame(frame=i, seconds=s) for i, s in enumerate(frames)),
        fullgraph_error=dyn["fullgraph_error"],
        timing={k: _timing(v) for k, v in cmp.items()},
        train_timing=train, timing_cv=cmp["eager"]["cv"],
        torch_version=str(torch.__version__), notes=tuple(notes),  # a str, not torch's TorchVersion
    )


def _ci(ci) -> tuple[float, float] | None:
    return None if ci is None else tuple(ci)


def _timing(row: dict) -> Timing:
    """One candidate's row of measure.compare's comparison as this analysis' record."""
    return Timing(median_ms=row["median_ms"], p90_ms=row["p90_ms"], time_ms=row["time_ms"], speedup=row["speedup"],
                  speedup_ci=_ci(row["speedup_ci"]), verdict=row["verdict"], rounds=row["rounds"],
                  round_ms=tuple(row["round_ms"]))


def _kernel_count() -> int | None:
    try:
        import torch._inductor.metrics as m

        return int(m.generated_kernel_count)
    except Exception:
        return None


def _train_comparison(model, loaded, o: dict, device) -> TrainTiming:
    """Forward + loss + backward, eager vs compiled, interleaved (no optimizer step: weights stay)."""
    model.train()
    compiled = _compile(model, o)

    def step(m) -> Step:  # the one training step without an optimizer: zero_grad, forward, loss, backward
        return Step(Trainee(m, loaded.loss_fn, loaded.inputs, loaded.loss_name), True, optimizer=None)

    eager, fast = step(model), step(compiled)
    fast()  # compiles forward and backward
    cmp = interleaved({"eager": eager, "compiled": fast}, device, o["rounds"], o["warmup"], control=True)
    c = cmp["compiled"]
    control = cmp[CONTROL]
    return TrainTiming(eager_ms=cmp["eager"]["time_ms"], compiled_ms=c["time_ms"], speedup=c["speedup"],
                       speedup_ci=_ci(c["speedup_ci"]), verdict=c["verdict"],
                       control=Control(speedup=control["speedup"], speedup_ci=_ci(control["speedup_ci"]),
                                       verdict=control["verdict"]))
