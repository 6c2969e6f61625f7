"""The planner: traces configurations (cached), stands in for modules fake tracing fails in, and turns
a trace into a Row for the result's device.

One ``FakeTensorMode`` serves every trace of a job (a loss that caches its targets keeps fake ones
from that mode). A configuration that fails in a module is traced again with that module estimated
(analytic.stand_in), up to MAX_STANDINS modules; the modules so estimated are named in the rows.
"""

from __future__ import annotations

import time

from diagnostics.analyses.plan.configs import Config
from diagnostics.analyses.plan.ledger import LOSS, ROOT
from diagnostics.analyses.plan.result import Row
from diagnostics.analyses.plan.targets import Target
from diagnostics.analyses.plan.trace import StepTrace, TraceFailure, trace
from diagnostics.errors import TorchScopeError

MAX_STANDINS = 8


#: Words of the errors torch raises when an op gets a dtype it does not take.
DTYPE_WORDS = ("dtype", "scalar type", "type BFloat16", "type Half", "Float8", "float8", "expected both",
               "mat1 and mat2", "same dtype")


def is_dtype_error(e: BaseException) -> bool:
    return isinstance(e, (RuntimeError, TypeError)) and any(w in str(e) for w in DTYPE_WORDS)


def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Tensors a model keeps as plain attributes (not parameters or buffers) are real: let them in.
    return FakeTensorMode(allow_non_fake_inputs=True)


class Planner:
    """Traces for one model and device. ``checkpoint_patterns``: the 'selected' checkpointing's modules."""

    def __init__(self, loaded, target: Target, checkpoint_patterns: str = "", progress=None):
        self.loaded, self.target = loaded, target
        self.checkpoint_patterns = checkpoint_patterns
        self.fake = fake_mode()
        self.cache: dict[Config, StepTrace] = {}
        self.standins: dict[str, str] = {}  # module -> why (shared by every configuration)
        self.traces = 0
        self.seconds = 0.0
        self.flop_cache: dict = {}
        from diagnostics.analyses.plan.scratch import Scratch
        from diagnostics.analyses.plan.trace import trace_device

        device = trace_device(target)
        # Kernels' own scratch is probed on this machine's device, so only when it is the one planned for.
        self.scratch = Scratch(device) if device == ("cuda" if target.kind == "cuda" else "cpu") else None
        self.progress = progress or (lambda message: None)

    def run(self, config: Config, timeline: bool = False, first_rank_only: bool = False,
            checkpoint_patterns: str | None = None) -> StepTrace:
        """The configuration's trace (cached; a cached one without a timeline is traced again for one).
        ``first_rank_only``: a sharded configuration's rank 0 alone (the suggestions' quick look).
        ``checkpoint_patterns``: the modules 'selected' checkpointing checkpoints, if not the planner's."""
        if checkpoint_patterns is not None and checkpoint_patterns != self.checkpoint_patterns:
            own = self.checkpoint_patterns
            self.checkpoint_patterns = checkpoint_patterns
            try:
                return self.run(config, timeline, first_rank_only)
            finally:
                self.checkpoint_patterns = own
        whole = (config, self.checkpoint_patterns) if config.setting.checkpointing == "selected" else config
        key = (whole, "rank0") if first_rank_only and config.setting.shard != "none" else whole
        hit = self.cache.get(key) or (self.cache.get(whole) if key != whole else None)
        if hit is not None and (hit.timeline is not None or not timeline):
            return hit
        while True:
            t0 = time.perf_counter()
            try:
                if config.setting.shard != "none":
                    from diagnostics.analyses.plan.shard import trace_sharded

                    st = trace_sharded(self, config, timeline=timeline, ranks=(0,) if first_rank_only else None)
                else:
                    st = trace(self.loaded, config, self.target, self.fake, timeline=timeline,
                               checkpoint_patterns=self.checkpoint_patterns, standins=self.standins,
                               scratch=self.scratch)
            except TraceFailure as e:
                self._stand_in_for(e)
                continue
            finally:
                self.traces += 1
                self.seconds += time.perf_counter() - t0
            self.cache[key] = st
            return st

    def _stand_in_for(self, e: TraceFailure) -> None:
        from diagnostics.analyses.plan.analytic import model_output

        if is_dtype_error(e.cause):  # the model cannot run in this dtype: no estimate stands in for that
            raise TorchScopeError(str(e)) from e.cause

        whole = e.module == ROOT and model_output(self.loaded, self.loaded.model) is not None
        if (e.module in (ROOT, LOSS, "(autograd)", "(optimizer)") and not whole) or e.module in self.standins \
                or len(self.standins) >= MAX_STANDINS:
            raise TorchScopeError(f"the memory plan cannot trace this model on fake tensors: {e}") from e.cause
        self.standins[e.module] = f"{e.phase}: {type(e.cause).__name__}: {str(e.cause).splitlines()[0][:160]}"
        self.cache.clear()  # every configuration now uses the stand-in
        self.progress(f"{e.module}: fake tracing failed, estimated analytically")

    # ------------------------------------------------------------------ rows
    def device_peak(self, st: StepTrace) -> tuple[int, dict]:
        """The peak as the device sees it: for CUDA, the caching allocator's replayed peak (trace.on_device),
        or, where a trace was not replayed (sharded ranks), the traced one plus the calibrated cuBLAS
        workspaces."""
        parts = {k: int(v) for k, v in st.parts.items()}
        if st.on_device:  # the caching allocator's peak, workspaces included (trace.on_device)
            return int(st.peak_bytes), parts
        if self.target.kind == "cuda":
            parts["workspaces"] = parts.get("workspaces", 0) + int(self.target.workspace_bytes)
        return int(st.peak_bytes) + (int(self.target.workspace_bytes) if self.target.kind == "cuda" else 0), parts

    def phase_peaks(self, st: StepTrace) -> dict[str, int]:
        extra = int(self.target.workspace_bytes) if self.target.kind == "cuda" and not st.on_device else 0
        return {ph: int(v["bytes"]) + extra for ph, v in st.phase_peaks.items() if ph != "setup"}

    def budget(self) -> int:
        """Bytes a step may peak at on the device: its memory less the CUDA context."""
        return self.target.budget_bytes

    def fits(self, peak: int) -> bool:
        return peak <= self.budget()

    def row(self, config: Config, st: StepTrace | None = None, *, peak: int | None = None, parts: dict | None = None,
            how: str = "traced", recompute_flops: int | None = None) -> Row:
        if st is not None:
            peak, parts = self.device_peak(st)
        s = config.setting
        return Row(batch=config.batch, seq=config.seq, dtype=s.dtype, optimizer=s.optimizer,
                   checkpointing=s.checkpointing, shard=s.shard, ranks=s.ranks, offload=s.offload, mode=s.mode,
                   peak_bytes=int(peak), parts=parts or {}, phase=st.phase if st else "",
                   module=st.module if st else "", fits=self.fits(int(peak)),
                   headroom_bytes=self.budget() - int(peak), how=how, setting=s.label,
                   host_bytes=int(st.host_bytes) if st else 0, recompute_flops=recompute_flops,
                   analytic=tuple(sorted(self.standins)), kv_dtype=s.kv_dtype)

    def failed_row(self, config: Config, error: str) -> Row:
        """A configuration that could not be planned: no peak, and why."""
        s = config.setting
        return Row(batch=config.batch, seq=config.seq, dtype=s.dtype, optimizer=s.optimizer,
                   checkpointing=s.checkpointing, shard=s.shard, ranks=s.ranks, offload=s.offload, mode=s.mode,
                   peak_bytes=0, parts={}, phase="", module="", fits=False, headroom_bytes=0, how="failed",
                   setting=s.label, kv_dtype=s.kv_dtype, error=error)


def recompute_flops(planner: Planner, config: Config) -> int | None:
    """FLOPs activation checkpointing recomputes per step: the checkpointed modules' forward FLOPs at this
    configuration, counted on fake tensors by the one FLOP counter (measure.flops). None: nothing
    checkpointed, or the count failed (then the cost is not shown, never 0)."""
    if config.setting.checkpointing == "none":
        return None
    key = ("flops", config, planner.checkpoint_patterns)
    if key in planner.flop_cache:
        return planner.flop_cache[key]
    from diagnostics.analyses.plan.trace import checkpointed_names, skeleton

    value = None
    by_module = forward_flops(planner, config)
    if by_module is not None:
        try:
            names = checkpointed_names(skeleton(planner.loaded.model), config.setting, planner.checkpoint_patterns)
            value = int(sum(by_module.get(n, 0) for n in names))
        except Exception:  # the cost is optional; the plan is not
            value = None
    planner.flop_cache[key] = value
    return value


def forward_flops(planner: Planner, config: Config) -> dict[str, int] | None:
    """Forward FLOPs per module (qualified name) of ``config`` without checkpointing, counted on fake
    tensors by the one FLOP counter; None when the count fails."""
    import dataclasses

    plain = dataclasses.replace(config, setting=dataclasses.replace(config.setting, checkpointing="none"))
    key = ("flops by module", plain)
    if key in planner.flop_cache:
        return planner.flop_cache[key]
    import torch

    from diagnostics.analyses.plan.trace import _autocast, eager_transformers, inputs_for, prepare
    from diagnostics.measure.flops import FlopCounter

    value = None
    try:
        with eager_transformers():
            model, device, _ = prepare(planner.loaded, plain, planner.target, planner.fake, standins=planner.standins)
            inputs = inputs_for(planner.loaded, plain, planner.fake, device)
            counter = FlopCounter()
            with planner.fake, counter, torch.no_grad(), _autocast(plain, device):
                inputs.call(model)
            value = dict(counter.result(type(model).__name__).by_module)
    except Exception:  # the cost is optional; the plan is not
        value = None
    planner.flop_cache[key] = value
    return value
