"""Plan: will it fit? Predict the peak memory of each configuration asked for on fake tensors (nothing
of the model's size is allocated), check it against a device, find the largest batch that fits, draw
the batch x sequence grid, and suggest what makes a configuration fit.

The configurations are the product of the options (batch, seq, dtype, optimizer, checkpointing,
shard); each result row is traced (trace.py); the sweeps fit curves through a few traces and check
the boundary with more (sweep.py); suggestions are traced too (suggest.py).
"""

from __future__ import annotations

import msgspec

from diagnostics.analyses.plan import ANALYSIS
from diagnostics.analyses.plan.configs import DTYPES, Config, parse_bytes, parse_seq, parse_sizes, settings_of
from diagnostics.analyses.plan.ledger import CATEGORIES
from diagnostics.analyses.plan.planner import Planner, is_dtype_error, recompute_flops
from diagnostics.analyses.plan.result import Breakdown, PlanMetrics, PlanResult, Timeline
from diagnostics.analyses.plan.sweep import Curve, SweepFailure, curve_point, grid, grid_batches, grid_seqs, \
    max_batch
from diagnostics.analyses.plan.targets import resolve
from diagnostics.analyses.plan.trace import is_token_input, takes_tokens, trace_device
from diagnostics.declare import OptionError
from diagnostics.devices import cpu_facts, gpu_facts
from diagnostics.errors import TorchScopeError

#: Rows traced one by one up to this many configurations; beyond, rows come from the sweep's curves.
MAX_TRACED_ROWS = 24
#: Settings the sweeps (largest batch, grid, suggestions) run for.
MAX_SWEPT_SETTINGS = 4

METHOD = ("each configuration runs on fake tensors (FakeTensorMode: shapes and dtypes, no data) under a "
          "memory ledger: every storage an op creates is counted, sized as the device's allocator sizes it "
          "(512-byte blocks on CUDA), and released when its last reference goes, exactly as on the device; "
          "the optimizer's state exists from the start (the steady-state step); gradients start as None")


def _seq_limit(loaded) -> int | None:
    cfg = getattr(getattr(loaded.model, "model", None), "config", None)
    limit = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
    return int(limit) if limit else None


def _described(specs) -> str:
    return ", ".join(f"{s.name + ' ' if s.name else ''}{list(s.shape)} {s.dtype}" for s in specs)


def _sizes(loaded, o, notes: list[str]) -> tuple[list[int], list]:
    """The batches and sequence lengths to plan. A length applies to the input ``--seq NAME=`` names, or to
    every token input; with none asked for, each input keeps its own (the token inputs' one length when
    they share it, so the grid can vary it; none when they differ: an encoder's and a decoder's)."""
    batches = parse_sizes(o["batch"], "batch") or [int(loaded.batch_size)]
    specs = loaded.input_specs
    token = takes_tokens(specs)
    name, seqs = parse_seq(o["seq"])
    if name:
        named = next((s for s in specs if s.name == name), None)
        if named is None or len(named.shape) < 2:
            raise OptionError(f"option seq: {name} is not an input with a length (a second dimension); the "
                              f"model's inputs: {_described(specs)}")
    elif seqs and not token:
        raise OptionError("option seq: this model takes no token inputs (its inputs: " + _described(specs)
                          + "); sequence lengths apply to token ids, or name an input: --seq NAME=LENGTHS")
    if not seqs:
        lengths = sorted({s.shape[1] for s in specs if is_token_input(s)})
        seqs = lengths if len(lengths) == 1 else [None]
        if len(lengths) > 1:
            notes.append("each input keeps its own length (" + ", ".join(
                f"{s.name or 'input'} {s.shape[1]}" for s in specs if len(s.shape) >= 2)
                + "); --seq NAME=LENGTHS varies one of them")
    limit = _seq_limit(loaded)
    over = [s for s in seqs if s is not None and limit is not None and s > limit]
    if over and (not name or is_token_input(named)):
        raise OptionError(f"option seq: {', '.join(map(str, over))} is longer than the config's "
                          f"max_position_embeddings ({limit}); raise it with --hf-set max_position_embeddings={max(over)}")
    return batches, seqs


def _dtype_error(dtype: str, e: BaseException) -> TorchScopeError | None:
    if dtype != "fp32" and is_dtype_error(e):
        return TorchScopeError(f"the model cannot run in {dtype} ({DTYPES[dtype].label}): "
                               f"{str(e).splitlines()[0][:300]}")
    return None


def _traced(planner: Planner, c: Config, timeline: bool = False):
    """``c``'s trace; a failure a TorchScopeError naming the dtype the model cannot run, or the error."""
    try:
        return planner.run(c, timeline=timeline)
    except TorchScopeError as e:
        raise _dtype_error(c.setting.dtype, e.__cause__ or e) or e
    except Exception as e:
        raise _dtype_error(c.setting.dtype, e) or TorchScopeError(
            f"tracing {c.setting.label} failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from e


def _fit(planner: Planner, configs: list, rows: list, budget: int, notes: list, progress):
    """The budget answer (fit.py) for the configuration with the largest planned peak, as a training step
    without checkpointing; UNSET with a note where it does not apply."""
    import dataclasses

    from diagnostics.analyses.plan.fit import fit_budget

    planned = [(r.peak_bytes, c) for c, r in zip(configs, rows) if not r.error]
    if not planned:
        notes.append("budget: no configuration was planned, so none was fitted")
        return msgspec.UNSET
    c = max(planned, key=lambda x: x[0])[1]
    if c.setting.mode != "train" or c.setting.shard != "none" or c.setting.offload:
        notes.append("budget: the answer chooses activation checkpointing for an unsharded training step; "
                     f"{c.setting.label} is not one")
        return msgspec.UNSET
    c = dataclasses.replace(c, setting=dataclasses.replace(c.setting, checkpointing="none"))
    try:
        return fit_budget(planner, c, budget, notes, progress)
    except TorchScopeError as e:
        notes.append(f"budget: no answer ({e})")
        return msgspec.UNSET


def _calibrated(target, asked: str):
    """The local GPU without a stored calibration: measure its context and workspaces now (calibrate.py)."""
    import torch

    if target.kind != "cuda" or "not calibrated" not in target.calibration or not torch.cuda.is_available():
        return target
    if str(asked).strip().lower() not in ("auto", "local"):
        return target
    import msgspec

    from diagnostics.analyses.plan.calibrate import calibrate_cuda

    cal = calibrate_cuda(0)
    return msgspec.structs.replace(target, context_bytes=cal["context_bytes"], workspace_bytes=cal["workspace_bytes"],
                   calibration=f"measured in this job on {cal['gpu']} (torch {cal['torch']}): context "
                               f"{cal['context_bytes'] / 2**20:.0f} MiB, cuBLAS workspaces "
                               f"{cal['workspace_bytes'] / 2**20:.0f} MiB")


def _traced_rows(ctx, planner, configs: list, failures: list) -> tuple[list, list]:
    """One row per configuration, each traced (a failure is its row's error); the rows and their traces."""
    rows, row_traces = [], []
    for i, c in enumerate(configs):
        ctx.progress(0.02 + 0.4 * i / len(configs), f"tracing {c.setting.label}, batch {c.batch}"
                     + (f", seq {c.seq}" if c.seq is not None else ""))
        try:
            st = _traced(planner, c, timeline=not row_traces)
        except TorchScopeError as e:  # this configuration says why; the others are still answered
            failures.append((c, e))
            rows.append(planner.failed_row(c, str(e)))
            continue
        rows.append(planner.row(c, st, recompute_flops=recompute_flops(planner, c)))
        row_traces.append(st)
    if not row_traces:  # nothing answered: the first configuration's failure is the job's
        raise failures[0][1]
    return rows, row_traces


def _grid_columns(planner, setting, curves: dict, extra_seqs: list, limit: int, notes: list[str]) -> None:
    """The grid's other sequence lengths: a curve each through two small batches (added to ``curves``)."""
    for s in extra_seqs:
        if s not in curves:
            curves[s] = Curve(setting, s)
            for b in (1, min(limit, 8)):
                try:
                    curve_point(planner, curves[s], b)
                except SweepFailure as e:
                    notes.append(f"grid column seq {s}: {e}")
                    break


def _sweeps(ctx, planner, loaded, settings: list, seqs: list, batches: list[int], limit: int,
            notes: list[str]) -> tuple[list, list, dict]:
    """Per swept setting: the largest batch per sequence length and the batch x sequence grid; the
    curves they fitted, by setting and sequence length."""
    maxes, grids, curves_by_setting = [], [], {}
    swept = settings[:MAX_SWEPT_SETTINGS]
    if len(settings) > len(swept):
        notes.append(f"sweeps ran for the first {len(swept)} of {len(settings)} settings")
    extra_seqs = grid_seqs([s for s in seqs if s is not None], _seq_limit(loaded)) if seqs[0] is not None else [None]
    for k, st_ in enumerate(swept):
        curves = {}
        for s in seqs:
            ctx.progress(0.45 + 0.35 * k / len(swept), f"largest batch: {st_.label}" + (f", seq {s}" if s else ""))
            curves[s] = Curve(st_, s)
            try:
                maxes.append(max_batch(planner, curves[s], limit))
            except SweepFailure as e:  # the sweep stops at the batch that failed, and says so
                notes.append(f"largest batch for {st_.label}" + (f", seq {s}" if s else "") + f": {e}")
                maxes.append(e.answer)
        largest = max((m.max_batch for m in maxes if m.setting == st_.label), default=1)
        gb = grid_batches(max(largest, max(batches)), limit)
        _grid_columns(planner, st_, curves, extra_seqs, limit, notes)
        curves = {s: c for s, c in curves.items() if c.points}
        if curves:
            grids.append(grid(planner, st_, curves, gb))
        curves_by_setting[st_] = curves
    return maxes, grids, curves_by_setting


def _fitted_rows(planner, configs: list, curves_by_setting: dict, failures: list) -> list:
    """Too many configurations to trace each: rows read off the sweep's curves (traced where none fits)."""
    rows = []
    for c in configs:
        curve = curves_by_setting.get(c.setting, {}).get(c.seq)
        if curve is None:
            try:
                rows.append(planner.row(c, _traced(planner, c)))
            except TorchScopeError as e:
                failures.append((c, e))
                rows.append(planner.failed_row(c, str(e)))
            continue
        peak, parts, phase = curve.peak(c.batch)
        rows.append(msgspec.structs.replace(planner.row(c, peak=peak, parts=parts, how="fitted"), phase=phase,
                                            analytic=tuple(sorted(planner.standins))))
    return rows


def _make_it_fit(ctx, planner, configs: list, rows: list, maxes: list, notes: list[str]) -> list:
    """Suggestions (traced) for the largest configuration that does not fit; [] when all fit."""
    over = [r for r in rows if not r.fits and r.shard == "none" and not r.error]
    if not over:
        return []
    worst = max(over, key=lambda r: r.peak_bytes)
    c = next(c for c in configs if c.batch == worst.batch and c.seq == worst.seq and c.setting.label == worst.setting)
    largest = next((m.max_batch for m in maxes if m.setting == c.setting.label and m.seq == c.seq), None)
    ctx.progress(0.85, "make it fit: tracing the candidates")
    from diagnostics.analyses.plan.suggest import suggestions as suggest

    return suggest(planner, c, largest, notes)


def _first_timeline(planner, configs: list, rows: list, traced_rows: bool) -> Timeline | None:
    """Memory over the step of the first configuration that was answered (None when it cannot be traced)."""
    answered = next((c for c, r in zip(configs, rows) if not r.error), configs[0]) if traced_rows else configs[0]
    try:
        first = _traced(planner, answered, timeline=True)
    except TorchScopeError:
        first = None
    return None if first is None or first.timeline is None else msgspec.convert(
        {**first.timeline, "configuration": answered.setting.label}, Timeline)


def _closing_notes(planner, target, failures: list, row_traces: list, notes: list[str]) -> None:
    """What could not be planned, what was estimated, and how the device's numbers were made."""
    for c, e in failures:
        notes.append(f"batch {c.batch}" + (f", seq {c.seq}" if c.seq is not None else "")
                     + f" ({c.setting.label}) could not be planned: {e}")
    if planner.scratch is not None and planner.scratch.skipped:
        notes.append("kernel scratch not counted for: " + "; ".join(sorted(planner.scratch.skipped)))
    if planner.standins:
        notes.append("estimated analytically (fake tracing failed in them): " + "; ".join(
            f"{m} ({why})" for m, why in planner.standins.items()) + ". Their activations are an estimate: "
            "every token through each of their layers once")
    if target.kind == "cuda" and trace_device(target) == "cpu":
        notes.append("traced on fake CPU tensors for a CUDA device (this torch has no GPU): attention and dropout "
                     "run the kernels CUDA picks (cuDNN / flash / memory-efficient attention, one-byte dropout "
                     "masks), autocast follows CUDA's op lists, optimizers run foreach; cuDNN's convolution workspaces, which cuDNN sizes at "
                     "run time, are not in the prediction")
    if target.kind == "cuda":
        notes.append(f"CUDA context and workspaces: {target.calibration}")
        notes.append("the peak is the CUDA caching allocator's (max_memory_allocated): its blocks (512-byte "
                     "rounding, blocks it does not split) replayed over a warm-up and the measured step, the "
                     "cuBLAS / cuBLASLt workspaces each thread keeps, and kernels' own scratch (reductions' "
                     "staging, fused attention's backward); fits = peak + CUDA context within the device's "
                     "memory; memory cached but free (reserved beyond allocated) is not in the peak")
    for st in row_traces:  # what the rows' own traces noted (per-rank peaks, offload, the KV cache)
        notes.extend(n for n in st.notes if n not in notes)


def analyze(ctx, options: dict) -> PlanResult:
    o = ANALYSIS.validate(options)
    loaded = ctx.loaded
    settings = settings_of(o)
    target = _calibrated(resolve(o["device"], count=1, gpus=gpu_facts(), cpu=cpu_facts()), o["device"])
    planner = Planner(loaded, target, o["checkpoint_modules"], progress=lambda m: ctx.progress(0.4, m))
    notes: list[str] = []
    batches, seqs = _sizes(loaded, o, notes)
    if loaded.meta:
        notes.append(f"the model is on the meta device ({loaded.meta}); the plan needs no weights")

    # -- one row per configuration asked for
    configs = [Config(b, s, st) for st in settings for s in seqs for b in batches]
    traced_rows = len(configs) <= MAX_TRACED_ROWS
    ctx.progress(0.02, f"{len(configs)} configuration(s) on fake tensors")
    failures: list[tuple[Config, TorchScopeError]] = []
    rows, row_traces = _traced_rows(ctx, planner, configs, failures) if traced_rows else ([], [])

    # -- sweeps: the largest batch per sequence length, the grid, the suggestions
    limit = int(o["max_batch"])
    maxes, grids, suggestions, curves_by_setting = [], [], [], {}
    if o["sweep"] or not traced_rows:
        maxes, grids, curves_by_setting = _sweeps(ctx, planner, loaded, settings, seqs, batches, limit, notes)
    if not traced_rows:
        rows = _fitted_rows(planner, configs, curves_by_setting, failures)
    if o["sweep"] and o["mode"] == "train":
        suggestions = _make_it_fit(ctx, planner, configs, rows, maxes, notes)

    # -- the budget: what to checkpoint so the largest configuration fits
    fit = msgspec.UNSET
    budget = parse_bytes(o["budget"])
    if budget is not None:
        ctx.progress(0.9, "fit in the budget: choosing what to checkpoint")
        fit = _fit(planner, configs, rows, budget, notes, lambda m: ctx.progress(0.9, m))

    ctx.progress(0.95, "memory over the first configuration's step")
    timeline = _first_timeline(planner, configs, rows, traced_rows)
    _closing_notes(planner, target, failures, row_traces, notes)
    peaks = [r.peak_bytes for r in rows if not r.error] or [0]
    metrics = PlanMetrics(configs=len(rows), fitting_configs=sum(r.fits for r in rows), min_peak_bytes=min(peaks),
                          max_peak_bytes=max(peaks), capacity_bytes=target.capacity_bytes, traces=planner.traces,
                          analytic_modules=len(planner.standins), trace_seconds=round(planner.seconds, 3))
    traced_on = (f"fake {trace_device(target)} tensors" + (" (CUDA's rounding and optimizer defaults applied)"
                                                              if target.kind == "cuda" and trace_device(target) == "cpu" else ""))
    ctx.progress(1.0, "done")
    return PlanResult(model=loaded.spec.label, device=target, options=dict(o), rows=tuple(rows),
                      breakdown=tuple(Breakdown.of(r) for r in rows), max_batch=tuple(maxes), grids=tuple(grids),
                      suggestions=tuple(suggestions), timeline=timeline, analytic_modules=dict(planner.standins),
                      notes=tuple(notes), metrics=metrics, method=METHOD, traced_on=traced_on,
                      categories=(*CATEGORIES, "workspaces"), fit=fit)
