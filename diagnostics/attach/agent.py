"""The bootstrap's work inside every process of an attached job (loaded by bootstrap/sitecustomize.py
once the process has imported torch): find the steps, time their parts, profile the chosen steps.

torch and the standard library only, and the run folder's protocol (loaded by its path): nothing of
the engine is imported inside the user's job, except with ``run --plan``: at the first optimizer step's
end the planner (analyses/plan/attached.py) is imported for the time of the plan (``_engine_imported``:
sys.path restored, its ``diagnostics`` modules dropped after it), and when the script dies of out-of-memory
(its excepthook: ``_record_oom``, the budget answer for the device's capacity). Every failure of ours is written
to the process' errors.jsonl and switches the instrumentation off; the job runs on as it would bare. The user's
own calls are inside our try blocks only to note where an exception passed (``except: note; raise``), so their
exceptions pass through unchanged, and the frames our wrappers add are taken out of a traceback before it is
printed, torch's hooked module call shown as bare shows it (the excepthook installed by ``_install_exit``).

What is timed, on the main thread, in every step (a few perf_counter reads per step):

* the boundary: the global optimizer step post-hook (pytorch#88446); an iteration that steps
  several optimizers counts once (its cycle is learned from the first iteration: the steps until
  an optimizer steps again); with no optimizer, a backward and the parameter update after it (the
  step ends where the next forward or batch begins: "manual update"); with no backward either, the
  end of the top-level module's forward (the first module with parameters called at the top level:
  an inference loop), else a DataLoader batch, else the whole run as one time window;
* its parts: ``DataLoader.__iter__`` / ``__next__`` (data_wait), the top-level module calls (forward;
  ``evaluation`` when under no_grad / inference_mode or in eval mode, in a training run: an evaluation
  loop between training steps is kept out of the steps, timed apart), ``torch.autograd.backward`` / ``grad``
  (backward), the optimizer's step (optimizer), torch.distributed's collectives (comm), and
  ``.item()`` / ``.tolist()`` / ``bool()`` / ``.cpu()`` of a tensor on a device (not the CPU:
  nothing waits there) and ``cuda.synchronize`` (sync, by file:line). The main thread's time goes to the innermost part it is in, ``host`` when
  in none, so the parts sum to the step's time; our own work between and inside steps is kept out.

Nothing of ours is left on the user's objects: the module and optimizer hooks are torch's global ones
(filtered here to the top-level calls of the main thread), the modules found are held by weak reference,
and no attribute is set on a module, optimizer, tensor, loader or iterator; the model pickles, deep-copies,
scripts and saves as bare, during and after the window.

In the profiled steps only: torch.profiler (ProfilerStep#N ranges with our step numbers), the
phase segments (to place GPU idle time), gradient sums per parameter (the optimizer's pre-hook),
CUDA peak memory per step and the allocator's history (a memory snapshot at the end).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import sys
import threading
import time
import traceback
import weakref

perf = time.perf_counter
AGENT_FILE = os.path.abspath(__file__)
if AGENT_FILE.endswith((".pyc", ".pyo")):
    AGENT_FILE = AGENT_FILE[:-1]
#: torch.distributed functions timed as communication.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "reduce", "barrier", "all_to_all",
               "all_to_all_single", "gather", "gather_object", "scatter", "scatter_object_list", "send", "recv",
               "monitored_barrier")
#: Tensor methods that make the host wait for the device (``cpu`` only on a device tensor).
SYNC_METHODS = ("item", "tolist", "__bool__", "cpu")
#: Steps kept in memory before they are written out (also flushed every FLUSH_S seconds).
FLUSH_STEPS, FLUSH_S = 64, 1.0
#: Frames looked through for the model and loss modules when the first optimizer step comes.
SCAN_DEPTH = 40
#: Steps written out: the first KEEP_FIRST, the KEEP_BEFORE before the window, and KEEP_AFTER after it;
#: the others are counted only (a long job's files stay small: a line is about 300 bytes).
KEEP_FIRST, KEEP_BEFORE, KEEP_AFTER = 60, 10, 200
#: Step times kept in memory for the warm-up decision.
KEEP_TIMES = 64
#: Top-level forwards remembered before the boundary is known (an inference loop's are counted as steps).
PENDING_MAX = 100_000

#: The name torch.profiler gives a step's range; the trace layer's step pattern (trace/classify.py) reads
#: it. Spelled here because this module runs inside the user's process, where the trace layer is not
#: importable; tests/trace/test_classify.py checks the two agree.
STEP_RANGE = "ProfilerStep#"


def _noop_compiling() -> bool:
    return False


class _TorchAsItIs:
    """torch, as torch.profiler's ``prepare_trace`` looks at it: every attribute torch's own, but
    ``_inductor`` only once the script imported inductor itself. torch's check ``hasattr(torch, "_inductor")``
    otherwise imports inductor, dynamo and sympy (1.5 to 2.5 s of the script's wall at the window's start, and
    modules a bare run never loads) to read a cudagraphs setting that is off unless inductor runs."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        if name == "_inductor" and "torch._inductor" not in sys.modules:
            raise AttributeError(name)
        return getattr(self._torch, name)


#: Kineto's log level while it first starts in the script: above its USDT level (5), so its own lines
#: ("USDT: ... profiler_start", "STAGE: ...") are not added to the script's stderr.
KINETO_QUIET = "6"


@contextlib.contextmanager
def _quiet_kineto():
    """KINETO_LOG_LEVEL set for the window's start only, unless the user set it: Kineto reads it once, when
    it starts, so the script's own profiling later is quiet too (as it is when the script sets it) and its
    environment is as it was as soon as the profiler has started."""
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = KINETO_QUIET
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


def _profiler_class(torch):
    """torch.profiler.profile whose ``prepare_trace`` is torch's own code read against ``_TorchAsItIs``
    (a subclass: torch binds ``prepare_trace`` when the profiler is made). The profiler is ours, nothing of
    torch's is changed; with inductor imported by the script it does exactly what torch's does."""
    base = torch.profiler.profile
    fn = getattr(base, "prepare_trace", None)
    if type(fn) is not type(_noop_compiling) or fn.__closure__ or fn.__globals__.get("torch") is not torch:
        return base  # not the function this was written against: torch's own, with its import
    code_globals = dict(fn.__globals__)
    code_globals["torch"] = _TorchAsItIs(torch)
    prepare = type(fn)(fn.__code__, code_globals, fn.__name__, fn.__defaults__, fn.__closure__)
    prepare.__kwdefaults__ = fn.__kwdefaults__
    return type("_AttachProfile", (base,), {"prepare_trace": prepare, "__module__": __name__})


class Agent:
    """One process' instrumentation; a forked child (a DataLoader worker) keeps only the worker timing."""

    def __init__(self, torch, run_dir: str, protocol):
        self.torch, self.run_dir, self.P = torch, run_dir, protocol
        self.cfg = protocol.AttachConfig.read(run_dir)
        self.pid = os.getpid()
        self.child = False  # a forked copy (DataLoader worker): main-thread instrumentation off
        self.active = True
        self.main = threading.main_thread().ident
        self.t_start = perf()
        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.proc_dir = os.path.join(run_dir, f"{protocol.PROC_PREFIX}{self.pid}")
        self.lock = threading.Lock()
        # the step in progress
        self.mode = None  # one of protocol.BOUNDARIES once known
        self.mode_detail = ""
        self.completed = 0
        self.stack: list[str] = []
        self.acc = dict.fromkeys(protocol.PHASES, 0.0)
        self.t0 = self.t_last = self.t_start
        self.step_tool = 0.0
        self.syncs: dict[str, list] = {}
        self.batches = 0
        self.events = 0  # instrumented main-thread events seen (a process with none writes nothing)
        # optimizer cycle
        self.seq: list[int] = []
        self.cycle: int | None = None
        self.snap = None
        self.optimizers: dict[int, dict] = {}
        self.roots: list = []  # weak references to the model and loss modules found in the frames
        self.root_info: list[dict] = []
        self.param_names: dict[int, tuple] = {}
        # top-level module calls (global module hooks, main thread): depth, the call in progress
        self.depth = 0
        self.top_phase = "forward"
        self.top_t = 0.0
        self.has_params = weakref.WeakKeyDictionary()  # module -> it holds parameters
        self.main_root = None  # weakref: the first module with parameters called at the top level
        self.main_info = None  # its id, type and parameter count (it may be gone when the boundary is chosen)
        self.pending: list = []  # boundary not known yet: each top-level forward's end, to count them later
        self.pending_t0 = 0.0  # when the first of the pending forwards began
        self.first_batch_t = None  # when the first DataLoader batch was asked for (the batch fallback's clock)
        self.forward_from_eval = None  # forward steps chosen from forwards under no_grad / in eval mode: (note, root)
        self.backward_seen = False
        self.step_backward = False  # a backward ran in the step in progress
        self.step_train = False  # a training forward or a backward ran in the step in progress
        self.evaluating = None  # perf() at the start of an evaluation period (outside every step)
        self.evaluation = {"forwards": 0, "forward_ms": 0.0, "periods": 0, "period_ms": 0.0}
        self.iter_loader = weakref.WeakKeyDictionary()  # a DataLoader iterator -> id of its loader
        # the window
        self.state = "warming up"
        self.window = None  # (first, last)
        self.window_note = ""
        self.prof = None
        self.step_rf = None
        self.segs = None
        self.grad_steps: list = []
        self.step_times: list = []  # (n, ms) of completed steps, for the warm-up decision
        self.window_file = os.path.join(run_dir, protocol.WINDOW)
        self.decided: int | None = None  # the first profiled step, once decided
        self.decider = os.environ.get("LOCAL_RANK", "0") == "0"
        distributed = os.environ.get("WORLD_SIZE", "1") not in ("", "1")
        self.lead = 2 if distributed else 1
        # records
        self.lines: list[str] = []
        self.last_flush = self.last_status = 0.0
        self.notes: list[str] = []
        self.loaders: dict[int, dict] = {}
        self.batch_sizes: dict[int, int] = {}
        self.tool_outside = 0.0
        self.exports: dict = {}
        self.oom = None
        # out of memory: (id of the exception, the parts' stack, step, module) where an exception first passed
        # through one of our wrappers (the innermost), and the CUDA allocator's last out-of-memory observation
        self.raised = None
        self.oom_observed = None
        self.opt_refs: dict[int, weakref.ref] = {}  # the optimizers seen, weakly (held memory at an OOM)
        self.worker_lines: list[str] = []
        self.worker_flush = perf()
        self.collate_s = 0.0
        self.autocast = None
        self.compiles_at_window = None
        self.finished = False
        self.cuda = False
        self.handles: list = []  # the global module hooks (removed if we fail)
        self.busy = False  # our own work runs: our wrappers let the calls through untimed
        # run --plan and an OOM's budget answer: each module with parameters trained at the top level so far, by
        # id: (weakref, its last call's [(shape, dtype)] of positional tensors then [(shape, dtype, keyword)] of
        # keyword ones, autocast dtype, non-tensor arguments)
        self.plan_calls: dict[int, tuple] = {}
        self.plan_done = self.cfg.plan is None
        # the script's loss: the autograd sequence number of the last such call's output, and the names of the
        # autograd nodes a backward started from after it (the loss the script computed outside the model)
        self.out_seq: int | None = None
        self.loss_ops: list[str] | None = None
        try:
            self.is_compiling = torch.compiler.is_compiling
        except AttributeError:
            self.is_compiling = _noop_compiling

    # ------------------------------------------------------------------ failures of ours
    def fail(self, where: str, exc: BaseException | None = None) -> None:
        """Our own failure: written down, instrumentation off (the global module hooks removed), the job
        goes on."""
        self.active = False
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles = []
        try:
            os.makedirs(self.proc_dir, exist_ok=True)
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) if exc else ""
            with open(os.path.join(self.proc_dir, self.P.ERRORS), "a") as f:
                f.write(json.dumps({"where": where, "error": f"{type(exc).__name__}: {exc}" if exc else where,
                                    "traceback": text[-4000:], "step": self.completed}) + "\n")
        except Exception:
            pass
        try:
            self._stop_window(aborted=True)
        except Exception:
            pass

    def ok(self) -> bool:
        """Instrument this call: our instrumentation is on, on the main thread, and the call is the script's
        (not ours: reading the gradient statistics back calls .cpu() on a device tensor)."""
        return self.active and not self.child and not self.busy and threading.get_ident() == self.main

    def note_raise(self, exc: BaseException, mod=None) -> None:
        """An exception passes through one of our wrappers (before its part is left): where it first did,
        the innermost part, is where an out-of-memory error is placed (only its id is kept, not it)."""
        if self.raised is not None and self.raised[0] == id(exc):
            return
        self.raised = (id(exc), list(self.stack) or ["host"], self.completed + 1,
                       type(mod).__name__ if mod is not None else None)

    # ------------------------------------------------------------------ phases
    def enter(self, phase: str) -> None:
        now = perf()
        st = self.stack
        self.acc[st[-1] if st else "host"] += now - self.t_last
        self.t_last = now
        st.append(phase)
        self.events += 1
        if self.segs is not None:
            self.segs.append((now, phase))

    def leave(self) -> float:
        now = perf()
        st = self.stack
        top = st.pop() if st else "host"
        self.acc[top] += now - self.t_last
        self.t_last = now
        if self.segs is not None:
            self.segs.append((now, st[-1] if st else "host"))
        return now

    def tool(self, t_begin: float) -> None:
        """Our own work inside a step, from t_begin to now: kept out of the step's parts and time."""
        spent = perf() - t_begin
        self.step_tool += spent
        self.t_last += spent

    # ------------------------------------------------------------------ steps
    def _keep(self, n: int) -> bool:
        """Whether step n is written out (see KEEP_FIRST)."""
        if n <= KEEP_FIRST:
            return True
        first = self.window[0] if self.window else self.cfg.at
        if first is None:
            return self.state == "warming up"  # warm-up ends by max_warmup: never long
        return first - KEEP_BEFORE <= n <= (self.window[1] if self.window else first + self.cfg.steps) + KEEP_AFTER

    def _record(self, t0: float, t1: float, acc: dict, syncs: dict, tool: float, batches: int) -> None:
        n = self.completed = self.completed + 1
        profiled = self.window is not None and self.state == "profiling" and self.window[0] <= n <= self.window[1]
        if len(self.step_times) > KEEP_TIMES:
            del self.step_times[:-KEEP_TIMES]
        if not self._keep(n):
            self.step_times.append((n, (t1 - t0 - tool) * 1e3, None))
            return
        rec = {"n": n, "t0": t0, "t1": t1, "ms": {k: v * 1e3 for k, v in acc.items()}, "tool_ms": tool * 1e3,
               "syncs": [[loc, c, s * 1e3] for loc, (c, s) in syncs.items()], "p": profiled, "b": batches,
               "c": self._compiles()}
        torch = self.torch
        if profiled and self.cuda:  # the peak since the step began (reset at its start: window only)
            try:
                rec["mem"] = torch.cuda.max_memory_allocated()
            except Exception:
                pass
        elif profiled:
            rec["rss"] = _rss()
        self.lines.append(json.dumps(rec))
        self.step_times.append((n, (t1 - t0 - tool) * 1e3, rec["c"]))

    def close(self, now: float) -> None:
        """The step in progress ends now; then the window's work; the next step starts after it."""
        self._record(self.t0, now, self.acc, self.syncs, self.step_tool, self.batches)
        self._reset_step()
        self._between(now)

    def close_retro(self) -> None:
        """The iteration ended at the last optimizer post-hook (an optimizer stepped again): the step is
        recorded up to then, and what came after starts the next one."""
        t, acc, syncs, tool, batches = self.snap
        now_acc = {k: self.acc[k] - acc[k] for k in self.acc}
        rest_syncs = {k: [v[0] - syncs.get(k, (0, 0))[0], v[1] - syncs.get(k, (0, 0))[1]]
                      for k, v in self.syncs.items() if v[0] - syncs.get(k, (0, 0))[0] > 0}
        self._record(self.t0, t, acc, syncs, tool, batches)
        self.acc, self.syncs = now_acc, rest_syncs
        self.step_tool -= tool
        self.batches -= batches
        self.step_train = True
        self.t0 = t
        if self.cycle is None:
            self.cycle = max(1, len(self.seq))
        self.seq = []
        self.snap = None
        self._between(None)

    def _reset_step(self) -> None:
        self.acc = dict.fromkeys(self.P.PHASES, 0.0)
        self.syncs = {}
        self.step_tool = 0.0
        self.batches = 0
        self.seq = []
        self.snap = None
        self.step_backward = self.step_train = False

    def _between(self, ended: float | None) -> None:
        """Between two steps: the warm-up decision, the window, the live status, the files."""
        t = perf()
        self.busy = True
        try:
            if _OOM_PENDING and self.torch.cuda.is_initialized():
                attach_oom_observer(self)
            if not self.finished:  # a step closed at exit starts no window
                self._window_control()
            if t - self.last_flush > FLUSH_S or len(self.lines) >= FLUSH_STEPS:
                self.flush()
            if t - self.last_status > self.P.STATUS_EVERY_S:
                self._status()
        except Exception as e:
            self.fail("between steps", e)
        finally:
            self.busy = False
        now = perf()
        if ended is not None:  # a live boundary: the next step starts now, our work left out
            self.tool_outside += now - ended
            self.t0 = self.t_last = now
        else:  # a retro boundary: the step started at the snapshot; our time here is tool time inside it
            self.step_tool += now - t
            self.t_last += now - t
        if self.state == "profiling" and self.prof is not None:
            self._begin_profiled_step(restart=ended is not None)

    def _compiles(self) -> int | None:
        dyn = sys.modules.get("torch._dynamo.utils")
        if dyn is None:
            return None
        try:
            return int(dyn.counters["stats"]["unique_graphs"])
        except Exception:
            return None

    # ------------------------------------------------------------------ the window
    def _window_control(self) -> None:
        n = self.completed
        if self.state == "warming up":
            first = self._decide(n)
            if first is not None and n + 1 >= first:
                if n + 1 > first:
                    self.window_note = (f"the window was decided for step {first} and read at step {n + 1}: "
                                        f"profiled from step {n + 1}")
                self._start_window(n + 1)
        elif self.state == "profiling":
            if self.step_rf is not None:
                self.step_rf.__exit__(None, None, None)
                self.step_rf = None
            if n >= self.window[1]:
                self._stop_window()

    def _decide(self, n: int) -> int | None:
        """The first profiled step once known: --at, the deciding process' choice, or our own (once
        decided, kept: a decision made two steps ahead must not be judged again meanwhile)."""
        if self.decided is None:
            self.decided = self._decide_now(n)
        return self.decided

    def _decide_now(self, n: int) -> int | None:
        cfg = self.cfg
        if cfg.at is not None:
            return cfg.at
        if not self.decider:
            if os.path.exists(self.window_file):
                got = self.P.read_json(self.window_file, {})
                if isinstance(got.get("first"), int):
                    self.window_reason = got.get("reason", "")
                    return got["first"]
            if n < cfg.max_warmup + 2 * self.lead:
                return None
            self.notes.append("the deciding process (LOCAL_RANK 0) chose no window in time: this process chose its own")
        first, reason = self._stable(n)
        if first is None:
            return None
        self.window_reason = reason
        self.P.write_json(self.window_file, {"first": first, "last": first + cfg.steps - 1, "decided_at": n,
                                             "reason": reason, "pid": self.pid})
        return first

    def _stable(self, n: int):
        cfg = self.cfg
        recent = [(ms, c) for k, ms, c in self.step_times if k > cfg.min_warmup][-cfg.stable_steps:]
        if n >= cfg.max_warmup:
            return n + self.lead, (f"step times had not settled after {cfg.max_warmup} steps (the most warm-up "
                                   "allowed): profiled from there")
        if len(recent) < cfg.stable_steps:
            return None, ""
        last = [ms for ms, _ in recent]
        med = sorted(last)[len(last) // 2]
        spread = max(abs(x - med) for x in last) / med if med > 0 else 0.0
        if spread > cfg.stable_tol or len({c for _, c in recent}) > 1:  # still changing, or still compiling
            return None, ""
        return n + self.lead, (f"steps {n - cfg.stable_steps + 1}-{n} within {spread:.0%} of their median "
                               f"{med:.2f} ms (stable: within {cfg.stable_tol:.0%})")

    def _rank(self):
        torch = self.torch
        try:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except Exception:
            pass
        r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if r is not None and w not in (None, "", "1"):
            try:
                return int(r), int(w)
            except ValueError:
                pass
        return None, None

    def _start_window(self, first: int) -> None:
        torch = self.torch
        self.window = (first, first + self.cfg.steps - 1)
        self.state = "profiling"
        self.compiles_at_window = self._compiles()
        acts = [torch.profiler.ProfilerActivity.CPU]
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
            if self.cfg.memory:
                try:
                    # Python stacks only: C++ unwinding at every allocation would slow the window down
                    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=200_000)
                    self.memory_history = True
                except Exception as e:
                    self.notes.append(f"CUDA memory history not recorded: {type(e).__name__}: {e}")
        self.segs = []
        self.grad_steps = []
        # what the run's views read: the ops' times (CPU, CUDA) and, for CPU memory per step, the allocation
        # events; input shapes only when asked (--shapes: no view reads them, they cost the window time)
        self.prof = _profiler_class(torch)(activities=acts, record_shapes=bool(self.cfg.shapes), profile_memory=True,
                                           with_stack=bool(self.cfg.stacks))
        with _quiet_kineto():
            self.prof.start()
        self._status(force=True)

    def _begin_profiled_step(self, restart: bool) -> None:
        n = self.completed + 1
        if self.window is None or not (self.window[0] <= n <= self.window[1]):
            return
        if self.cuda:
            try:  # the step's own peak; the script's later max_memory_allocated() counts from the window's end
                self.torch.cuda.reset_peak_memory_stats()
            except Exception:
                pass
        self.step_rf = self.torch.autograd.profiler.record_function(f"{STEP_RANGE}{n}")
        self.step_rf.__enter__()
        if restart:  # the step starts with its range (a retro boundary's step started before)
            now = perf()
            self.tool_outside += now - self.t0
            self.t0 = self.t_last = now
        self.segs.append((self.t0, self.stack[-1] if self.stack else "host", n))

    def _stop_window(self, aborted: bool = False, why: str = "") -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        torch = self.torch
        if self.step_rf is not None:
            try:
                self.step_rf.__exit__(None, None, None)
            except Exception:
                pass
            self.step_rf = None
        rank, world = self._rank()
        self.rank, self.world = rank, world
        prof.stop()
        name = self.P.rank_trace_name(rank)
        path = os.path.join(self.run_dir, name)
        if rank is None and (os.path.exists(path) or os.path.exists(os.path.join(self.run_dir, self.P.raw_trace_name(name)))):
            name = f"pid{self.pid}.{self.P.TRACE}"
            path = os.path.join(self.run_dir, name)
        t = perf()
        # kineto's own JSON writer (fast); the launcher gzips it into ``name`` beside the script (session.py)
        raw = self.P.raw_trace_name(name)
        prof.export_chrome_trace(os.path.join(self.run_dir, raw))
        self.exports["trace"] = name
        self.exports["trace_raw"] = raw
        self.exports["export_s"] = perf() - t
        if getattr(self, "memory_history", False):
            snap = os.path.join(self.run_dir, self.P.rank_file(self.P.SNAPSHOT, rank))
            try:
                torch.cuda.memory._dump_snapshot(snap)
                self.exports["snapshot"] = os.path.basename(snap)
            except Exception as e:
                self.notes.append(f"the memory snapshot could not be written: {type(e).__name__}: {e}")
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass
            self.memory_history = False
        segs, self.segs = self.segs, None
        os.makedirs(self.proc_dir, exist_ok=True)
        self.P.write_json(os.path.join(self.proc_dir, self.P.SEGMENTS), {"segments": segs or []})
        self._write_grads()
        self.state = "running" if not aborted else "aborted"
        if aborted:
            self.notes.append("the profiled window was cut short: " + (why or ("the script ended first"
                              if self.finished else "an error of ours stopped it")))
        self.write_meta()
        self._status(force=True)

    # ------------------------------------------------------------------ gradients (profiled steps)
    def grad_stats(self, opt) -> None:
        """Per parameter the optimizer holds: its gradient's L2, L1 and max norm, zeros, NaN and inf counts, as
        one [params, 6] tensor kept on the device (read back when the window ends). Four fused reductions per
        device and dtype (torch._foreach_norm, in float32 or float64; ord 0 counts the nonzeros, in float64), and NaN / inf
        counted only where a norm is not finite (on CPU; on a device that check would wait for it, so always
        there). On CUDA the reductions are fused kernels; on CPU torch loops over the tensors inside each, so the
        trace still holds a few ops per parameter (dcgan: about 300 per call, 355 before)."""
        torch = self.torch
        params = [p for g in opt.param_groups for p in g["params"]
                  if getattr(p, "grad", None) is not None and not p.grad.is_sparse]
        if not params:
            return
        grads = [p.grad.detach() for p in params]
        with torch.no_grad():
            by_dtype: dict = {}
            for i, g in enumerate(grads):
                by_dtype.setdefault((g.device, g.dtype), []).append(i)
            dev0, blocks, order = grads[0].device, [], []
            for (device, dtype), idx in by_dtype.items():
                gs = [grads[i] for i in idx]
                acc = torch.float64 if dtype == torch.float64 else torch.float32  # never narrowed, half widened
                norms = torch.stack([torch.stack(_norms(torch, gs, o, acc)) for o in (2, 1, float("inf"))]).float()
                numel = torch.tensor([float(g.numel()) for g in gs], device=device, dtype=torch.float64)
                zeros = (numel - torch.stack(_norms(torch, gs, 0, torch.float64))).float()
                bad = torch.zeros(2, len(gs), device=device)
                if device.type != "cpu" or not bool(torch.isfinite(norms[1]).all()):
                    bad = torch.stack([torch.stack([g.isnan().sum().float() for g in gs]),
                                       torch.stack([g.isinf().sum().float() for g in gs])])
                blocks.append(torch.cat([norms, zeros[None], bad]).to(dev0))  # [6, tensors of this dtype]
                order += idx
            table = torch.cat(blocks, 1) if len(blocks) > 1 else blocks[0]
            if order != sorted(order):  # back in the optimizer's order
                table = table[:, sorted(range(len(order)), key=order.__getitem__)]
            self.grad_steps.append((self.completed + 1, [id(p) for p in params], [p.numel() for p in params],
                                    table.T))

    def _write_grads(self) -> None:
        if not self.grad_steps:
            return
        out = []
        for n, ids, numels, t in self.grad_steps:
            values = t.cpu().tolist()
            out.append({"step": n, "params": [
                {"name": self.param_names.get(pid, (f"param{k}", ""))[0],
                 "type": self.param_names.get(pid, ("", ""))[1], "numel": numels[k],
                 "norm": v[0], "abs_sum": v[1], "max": v[2], "zeros": int(v[3]), "nan": int(v[4]), "inf": int(v[5])}
                for k, (pid, v) in enumerate(zip(ids, values))]})
        self.grad_steps = []
        self.P.write_json(os.path.join(self.proc_dir, self.P.GRADS), {"steps": out})

    # ------------------------------------------------------------------ discovery
    def discover(self, frame) -> None:
        """The model and loss modules: nn.Modules in the caller's frames (locals, module globals, and
        the attributes of ``self``) that no other found module contains. Their forward is timed."""
        nn = self.torch.nn
        found: dict[int, object] = {}

        def take(v):
            if isinstance(v, nn.Module):
                found.setdefault(id(v), v)
            elif isinstance(v, (list, tuple)) and len(v) <= 16:
                for x in v:
                    if isinstance(x, nn.Module):
                        found.setdefault(id(x), x)

        f, depth = frame, 0
        while f is not None and depth < SCAN_DEPTH:
            name = f.f_code.co_filename
            if not name.startswith(self.torch_dir) and name != AGENT_FILE:
                for v in list(f.f_locals.values()):
                    take(v)
                    if v is f.f_locals.get("self") and hasattr(v, "__dict__") and not isinstance(v, nn.Module):
                        for a in list(vars(v).values()):
                            take(a)
                if f.f_back is None or f.f_globals.get("__name__") == "__main__":
                    for v in list(f.f_globals.values()):
                        take(v)
            f, depth = f.f_back, depth + 1
        inner = set()
        for m in found.values():
            inner.update(id(s) for s in m.modules() if s is not m)
        roots = [m for k, m in found.items() if k not in inner]
        for m in roots:
            if any(m is r() for r in self.roots):
                continue
            self.roots.append(weakref.ref(m))
            n_params = sum(p.numel() for p in m.parameters())
            self.root_info.append({"type": type(m).__name__, "params": n_params})
            prefix = "" if len(roots) == 1 else f"{type(m).__name__}."
            for pname, p in m.named_parameters():
                owner = pname.rsplit(".", 1)[0] if "." in pname else "(model)"
                try:
                    mtype = type(m.get_submodule(owner)).__name__ if owner != "(model)" else type(m).__name__
                except Exception:
                    mtype = ""
                self.param_names.setdefault(id(p), (prefix + pname, mtype))

    # ------------------------------------------------------------------ top-level module calls
    def _params(self, mod) -> bool:
        got = self.has_params.get(mod)
        if got is None:
            got = self.has_params[mod] = next(iter(mod.parameters()), None) is not None
        return got

    def on_top_forward(self, mod) -> None:
        """A module called at the top level (no module forward of the main thread under way) begins:
        the boundaries that a forward decides, then its part (forward, or evaluation)."""
        params = self._params(mod)
        training = mod.training and self.torch.is_grad_enabled()
        if params and training and self.mode == "forward" and self.forward_from_eval is not None:
            self.evaluation_first()
        if params and self.step_backward and not self.optimizers:
            self.manual_boundary()  # a backward and its update ran: the next forward starts a step
        mode = self.mode
        if params and not training and mode in ("optimizer", "manual update") and not self.step_train \
                and self.evaluating is None:
            self.evaluating = self.t0  # an evaluation loop between steps: out of the steps
            self.evaluation["periods"] += 1
        elif params and training and self.evaluating is not None:
            self.end_evaluation()
        if params and training:
            self.step_train = True
        if self.main_root is None and params:
            self.main_root = weakref.ref(mod)
            self.main_info = {"id": id(mod), "type": type(mod).__name__,
                              "params": sum(p.numel() for p in mod.parameters())}
        phase = "evaluation" if not training and mode in ("optimizer", "manual update") else "forward"
        self.enter(phase)
        self.top_phase, self.top_t = phase, self.t_last
        if self.state == "profiling" and self.autocast is None:
            self.autocast = _autocast(self.torch)

    def on_top_forward_end(self, mod) -> None:
        now = self.leave()
        if self.top_phase == "evaluation":  # the loss module's call counts in the time, not as a forward
            self.evaluation["forwards"] += self._params(mod)
            self.evaluation["forward_ms"] += (now - self.top_t) * 1e3
        mode = self.mode
        if mode == "forward":
            if self.stack or id(mod) != self.main_info["id"]:
                return
            self.close(now)
        elif mode is None and not self.backward_seen and not self.optimizers and self._params(mod):
            if not self.pending:
                self.pending_t0 = self.top_t  # the first of these forwards began
            if len(self.pending) < PENDING_MAX:
                self.pending.append((id(mod), now, dict(self.acc), self.step_tool, self.batches))
            twice = sum(1 for e in self.pending if e[0] == id(mod)) >= 2
            if self.top_phase == "forward" and not (mod.training and self.torch.is_grad_enabled()) and twice:
                self.forward_boundary("no optimizer stepped and no backward ran: the model ran forward twice "
                                      "under no_grad / in eval mode")
                self.forward_from_eval = (self.notes[-1], self.root_info[-1]) if self.mode == "forward" else None
            # Seconds of forwards, counted from the first forward (not from the script's start: a script whose
            # imports and data took 3 s read as an inference loop at its first forward's end, its backward still
            # to come), and at least two of them: a training loop's backward follows its first forward.
            elif twice and now - self.pending_t0 >= self.cfg.fallback_after_s:
                self.forward_boundary(f"no optimizer stepped and no backward ran in the first "
                                      f"{self.cfg.fallback_after_s:g} s")

    def on_backward(self) -> None:
        if self.evaluating is not None:
            self.end_evaluation()
        self.backward_seen = self.step_backward = self.step_train = True

    def evaluation_first(self) -> None:
        """A training forward after forward steps that were chosen from forwards under no_grad / in eval mode:
        those were an evaluation before training (Lightning's sanity check, a trainer.evaluate() first), not
        an inference loop. They become one evaluation period (their steps' time), the forward boundary's note
        goes, a window of them is dropped without a word, and the backward or optimizer to come chooses the
        boundary; the steps are counted again from there."""
        note, root = self.forward_from_eval
        self.forward_from_eval = None
        n = self.completed
        self.evaluation["periods"] += 1
        self.evaluation["forwards"] += n
        self.evaluation["period_ms"] += sum(t[1] for t in self.step_times)
        self.notes = [x for x in self.notes if x != note]
        self.root_info = [r for r in self.root_info if r is not root]
        if self.window is not None:
            if self.prof is not None:
                self._stop_window()
            self.window, self.state, self.decided, self.window_note = None, "warming up", None, ""
        self.mode, self.mode_detail, self.completed, self.step_times, self.pending = None, "", 0, [], []
        self.notes.append(f"the {n} forwards under no_grad / in eval mode before training began were an evaluation "
                          "(a validation before the first step), not steps")

    def end_evaluation(self) -> None:
        """The evaluation period ends (a training forward or a backward begins): the next step starts now."""
        now = perf()
        self.evaluation["period_ms"] += (now - self.evaluating) * 1e3
        self.evaluating = None
        self._reset_step()
        self.t0 = self.t_last = now

    def manual_boundary(self) -> None:
        """No torch.optim optimizer: a step is a backward and the parameter update after it, ended where
        the next forward or batch begins."""
        if self.mode != "manual update":
            if self.mode not in (None, "forward", "batch", "time window"):
                return
            if self.mode in ("forward", "batch"):
                if self.completed > self.cfg.min_warmup:
                    self.notes.append(f"a backward ran after {self.completed} {self.mode} steps: from then on, a "
                                      "step is a backward and the parameter update after it")
                self._restart_window()
            self.mode = "manual update"
            self.mode_detail = "a backward and the parameter update after it (no torch.optim optimizer)"
            self.completed = 0
            self.step_times = []
            self.pending = []
        if self.stack:  # inside a timed call (a module called from a data pipeline): not here
            return
        now = perf()
        self.acc["host"] += now - self.t_last
        self.t_last = now
        self.close(now)

    def _restart_window(self) -> None:
        """The boundary changed (a backward or an optimizer came after forward or batch steps): a window
        of the old steps is ended (its trace is replaced by the new one's) and the warm-up starts again."""
        if self.window is None:
            return
        if self.prof is not None:
            self._stop_window()
        self.notes.append(f"the window of {self.mode} steps {self.window[0]}-{self.window[1]} was dropped: the "
                          "steps changed, a new window follows the warm-up")
        self.window, self.state, self.decided, self.window_note = None, "warming up", None, ""

    def forward_boundary(self, why: str) -> None:
        """No optimizer and no backward: a step is one forward of the main module (the first module with
        parameters called at the top level), counted from the start of the run."""
        info = self.main_info
        if info is None:
            return
        name = info["type"]
        self.mode = "forward"
        self.mode_detail = f"the end of {name}.forward"
        self.notes.append(f"{why}: a step is one {name}.forward (the first module with parameters the script "
                          "called at the top level: an inference loop)")
        self.root_info.append({"type": name, "params": info["params"]})
        key, zero = info["id"], dict.fromkeys(self.P.PHASES, 0.0)
        prev, t_prev, tool_prev, b_prev = zero, self.t0, 0.0, 0
        for mid, t, acc, tool, b in self.pending:  # the forwards before the boundary was known: steps too
            if mid != key:
                continue
            self._record(t_prev, t, {k: acc[k] - prev[k] for k in acc}, {}, tool - tool_prev, b - b_prev)
            prev, t_prev, tool_prev, b_prev = acc, t, tool, b
        self.pending = []
        self.acc = {k: self.acc[k] - prev[k] for k in self.acc}
        self.step_tool -= tool_prev
        self.batches -= b_prev
        self.t0 = t_prev
        if not self.finished:  # at exit: no window to start
            self._between(None)

    # ------------------------------------------------------------------ optimizer hooks
    def on_opt_pre(self, opt, args=(), kwargs=None):
        """The optimizer's step begins. A step given a closure (Lightning's automatic optimization,
        LBFGS) computes its forward and backward inside: the closure is handed on wrapped (returned as the
        step's new arguments, nothing set on the optimizer), so its time is not the optimizer's and the
        gradient statistics read the gradients it computed."""
        if not self.optimizers:
            if threading.get_ident() != self.main:
                self.main = threading.get_ident()
            self._first_optimizer(opt)
        if self.evaluating is not None:
            self.end_evaluation()
        self.step_train = True
        key = id(opt)
        if key not in self.optimizers:
            self._describe_optimizer(opt)
            try:
                self.opt_refs[key] = weakref.ref(opt)
            except TypeError:
                pass
        if key in self.seq and self.mode == "optimizer":
            self.close_retro()
        closure = args[1] if len(args) > 1 else (kwargs or {}).get("closure")
        if closure is None:
            self._grad_stats_timed(opt)
        self.enter("optimizer")
        if callable(closure):
            return self._wrap_closure(opt, closure, args, kwargs or {})
        return None

    def _grad_stats_timed(self, opt) -> None:
        if self.state == "profiling" and self.cfg.grads and self.prof is not None:
            t = perf()
            self.busy = True
            try:
                with self.torch.autograd.profiler.record_function("torchscope: gradient statistics"):
                    self.grad_stats(opt)  # named in the trace: our kernels, not the script's
            except Exception as e:
                self.notes.append(f"gradient statistics stopped: {type(e).__name__}: {e}")
                self.cfg = type(self.cfg)(**{**self.cfg.to_dict(), "grads": False})
            finally:
                self.busy = False
            self.tool(t)

    def _wrap_closure(self, opt, closure, args, kwargs):
        """The step's arguments with its closure wrapped: the closure's own time is the step's host time (its
        forward and backward are timed inside it as usual), and after its first call the gradient statistics."""
        agent, calls = self, []

        @functools.wraps(closure)
        def timed_closure(*a, **k):
            if not agent.ok():
                return closure(*a, **k)
            agent.enter("host")
            try:
                out = closure(*a, **k)
            finally:
                if agent.active:
                    agent.leave()
            if not calls and agent.active:  # the gradients of its first call that returned
                calls.append(1)
                try:
                    agent._grad_stats_timed(opt)
                except Exception as e:
                    agent.fail("gradient statistics after the closure", e)
            return out

        if len(args) > 1:
            return (args[0], timed_closure, *args[2:]), kwargs
        return args, {**kwargs, "closure": timed_closure}

    def on_opt_post(self, opt) -> None:
        now = self.leave()
        if self.mode != "optimizer":
            return
        self.seq.append(id(opt))
        self.snap = (now, dict(self.acc), {k: list(v) for k, v in self.syncs.items()}, self.step_tool, self.batches)
        if self.cycle is not None and len(self.seq) >= self.cycle and not self.stack:
            self.close(now)
        if not self.plan_done:
            self.plan(opt)

    # ------------------------------------------------------------------ run --plan
    def plan_capture(self, mod, args) -> None:
        """A top-level training forward of a module with parameters: its positional tensors' shapes and
        dtypes and autocast's dtype, for the plan (no reference to the tensors is kept). Its keyword tensors
        are known at its end (plan_outputs); until then those of its previous call stand."""
        torch = self.torch
        if not (self._params(mod) and mod.training and torch.is_grad_enabled()):
            return
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        old = self.plan_calls.get(id(mod))
        alive = old is not None and old[0]() is mod
        kw = [t for t in old[1] if len(t) == 3] if alive else []
        dev = tensors[0].device.type if tensors else next(mod.parameters()).device.type
        cast = None
        try:
            if torch.is_autocast_enabled(dev):
                cast = str(torch.get_autocast_dtype(dev))
        except (TypeError, RuntimeError, AttributeError):  # an older torch: no per-device query
            cast = None
        # once per training step: the dtypes' names cached, the module's weak reference kept (issue 39's cost)
        names = _DTYPE_NAMES
        self.plan_calls[id(mod)] = (old[0] if alive else weakref.ref(mod),
                                    [(tuple(t.shape), names.get(t.dtype) or _dtype_name(t.dtype)) for t in tensors]
                                    + kw, cast, len(args) - len(tensors))

    def plan_outputs(self, mod, kwargs: dict, out) -> None:
        """The end of a top-level training forward plan_capture recorded: its keyword tensors' shapes, dtypes
        and names (transformers' ``model(input_ids=..., attention_mask=...)``), and the autograd sequence
        number of its output (the script's loss is made of the nodes after it: loss_capture)."""
        torch = self.torch
        call = self.plan_calls.get(id(mod))
        if call is None or call[0]() is not mod:
            return
        if kwargs:
            kw = [(tuple(v.shape), str(v.dtype).replace("torch.", ""), k) for k, v in kwargs.items()
                  if isinstance(v, torch.Tensor)]
            others = sum(1 for v in kwargs.values() if v is not None and not isinstance(v, torch.Tensor))
            pos = [t for t in call[1] if len(t) == 2]
            self.plan_calls[id(mod)] = (call[0], pos + kw, call[2], call[3] + others)
        if self.plan_done and self.loss_ops is not None:
            return
        seqs, seen, looked = [], [out], 0
        while seen and looked < 256:
            x, looked = seen.pop(), looked + 1
            if isinstance(x, torch.Tensor):
                if x.grad_fn is not None:
                    seqs.append(x.grad_fn._sequence_nr())
            elif isinstance(x, dict):
                seen.extend(x.values())
            elif isinstance(x, (list, tuple)):
                seen.extend(x)
        if seqs:
            self.out_seq = max(seqs)

    def loss_capture(self, args, kwargs) -> None:
        """A backward starts (before the plan is made): the names of the autograd nodes between the tensors it
        starts from and the last recorded training forward's output: the loss the script computed outside
        the model ([]: the backward started from the model's output; analyses/plan/attached.loss_of). Names
        only: no tensor the nodes saved is read."""
        try:
            self._loss_capture(args, kwargs)
        except Exception as e:  # the loss is the plan's detail: the run goes on (the plan says it used a stand-in)
            self.loss_ops = self.out_seq = None
            note = f"the script's loss could not be read from its autograd graph: {type(e).__name__}: {e}"
            if note not in self.notes:
                self.notes.append(note)

    def _loss_capture(self, args, kwargs) -> None:
        torch = self.torch
        if self.out_seq is None or (self.plan_done and self.loss_ops is not None):
            return
        roots = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
        roots = [roots] if isinstance(roots, torch.Tensor) else list(roots or ())
        nodes = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        found: dict[int, str] = {}
        while nodes and len(found) < 64:
            n = nodes.pop()
            seq, name = n._sequence_nr(), n.name()
            if seq <= self.out_seq or seq in found or "AccumulateGrad" in name:
                continue
            found[seq] = name
            nodes.extend(f for f, _ in n.next_functions if f is not None)
        self.loss_ops = [found[k] for k in sorted(found, reverse=True)]

    def plan(self, opt) -> None:
        """``run --plan``, once, at the first optimizer step's end (its state exists): the engine's planner
        (analyses/plan/attached.py, imported only now) plans the main module with this optimizer on a
        fake copy; its rows, or why there are none, go to the run folder as JSON."""
        self.plan_done = True
        t = perf()
        self.busy = True
        try:
            held = {id(p) for g in opt.param_groups for p in g["params"]}
            live = [(c, c[0]()) for c in self.plan_calls.values()]
            live = [(c, m) for c, m in live if m is not None]
            # the module the optimizer that stepped first trains: the first trained one holding its parameters
            got, mod = next(((c, m) for c, m in live if {id(p) for p in m.parameters()} & held), (None, None))
            if not live:
                out = {"error": "no training forward of a module with parameters was "
                                "seen before the first optimizer step: nothing to plan"}
            elif mod is None:
                out = {"error": f"the optimizer that stepped first ({type(opt).__name__}) holds none of the "
                                f"parameters of the modules called ({', '.join(type(m).__name__ for _, m in live)}): "
                                "nothing to plan"}
            else:
                with _engine_imported() as attached:
                    out = attached.plan_in_process(mod, opt, got[1], self.cfg.plan or "", got[2], self.loss_ops)
                if len(live) > 1:
                    out.setdefault("notes", []).append(
                        f"the script trained {len(live)} modules with parameters before its first optimizer step "
                        f"({', '.join(type(m).__name__ for _, m in live)}): the plan is of {type(mod).__name__}, the "
                        f"one its first optimizer ({type(opt).__name__}) trains, while the measured peak is the whole "
                        "process' (the others' memory is in it)")
                if got[3]:
                    out.setdefault("notes", []).append(
                        f"{got[3]} argument(s) of the model's forward that are not tensors were left out")
        except Exception as e:  # the plan is ours: the script goes on
            out = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:400]}"}
        finally:
            self.busy = False
        try:
            os.makedirs(self.proc_dir, exist_ok=True)
            self.P.write_json(os.path.join(self.proc_dir, self.P.PLAN), out)
        except Exception as e:
            self.notes.append(f"the plan could not be written: {type(e).__name__}: {e}")
        self.tool(t)

    def _first_optimizer(self, opt) -> None:
        if self.mode in (None, "time window", "forward", "batch", "manual update"):
            if self.mode in ("forward", "batch", "manual update"):
                if self.completed > self.cfg.min_warmup:  # not the first micro-batches of an accumulation
                    self.notes.append(f"an optimizer first stepped after {self.completed} {self.mode} steps: from "
                                      "then on, steps end at the optimizer's step")
                self._restart_window()
            self.mode = "optimizer"
            self.completed = 0
            self.step_times = []
        try:
            self.discover(sys._getframe())
        except Exception as e:
            self.notes.append(f"the model's modules were not found in the caller's frames ({type(e).__name__}: "
                              f"{e}): forward is not told apart from host")

    def _describe_optimizer(self, opt) -> None:
        groups = []
        dtypes: dict[str, int] = {}
        devices: dict[str, int] = {}
        n = 0
        for g in opt.param_groups:
            groups.append({k: v for k, v in g.items() if k != "params" and isinstance(v, (int, float, str, bool,
                                                                                       type(None), tuple, list))})
            for p in g["params"]:
                n += p.numel()
                dtypes[str(p.dtype).replace("torch.", "")] = dtypes.get(str(p.dtype).replace("torch.", ""), 0) + p.numel()
                devices[p.device.type] = devices.get(p.device.type, 0) + p.numel()
                if id(p) not in self.param_names:
                    self.param_names[id(p)] = (f"{type(opt).__name__}{len(self.optimizers)}.param{len(self.param_names)}", "")
        self.optimizers[id(opt)] = {"type": type(opt).__name__, "module": type(opt).__module__, "params": n,
                                    "groups": groups[:8], "param_dtypes": dtypes, "devices": devices,
                                    "order": len(self.optimizers)}
        try:
            self.write_meta()
        except Exception:
            pass

    # ------------------------------------------------------------------ fallback boundaries
    def batch_fallback(self) -> None:
        """At a DataLoader batch, with no optimizer, no backward and no module with parameters called after
        fallback_after_s: a step is one DataLoader batch. The seconds count from the first batch, not from the
        script's start: a Trainer whose imports took 3 s fetches its first batch before its first forward."""
        now = perf()
        if self.first_batch_t is None:
            self.first_batch_t = now
        if now - self.first_batch_t < self.cfg.fallback_after_s or self.main_info is not None or self.backward_seen:
            return
        self.mode = "batch"
        self.mode_detail = "each DataLoader batch"
        self.notes.append(f"no optimizer stepped and no module was called in {self.cfg.fallback_after_s:g} s of "
                          "DataLoader batches: a step is one DataLoader batch")
        self.completed = 0
        self.step_times = []

    # ------------------------------------------------------------------ files
    def flush(self) -> None:
        self.last_flush = perf()
        if not self.lines:
            return
        os.makedirs(self.proc_dir, exist_ok=True)
        lines, self.lines = self.lines, []
        with open(os.path.join(self.proc_dir, self.P.STEPS), "a") as f:
            f.write("\n".join(lines) + "\n")

    def _status(self, force: bool = False) -> None:
        now = perf()
        if not force and now - self.last_status < self.P.STATUS_EVERY_S:
            return
        self.last_status = now
        os.makedirs(self.proc_dir, exist_ok=True)
        self.P.write_json(os.path.join(self.proc_dir, self.P.STATUS), {
            "phase": self.state, "step": self.completed, "window": self.window, "pid": self.pid,
            "rank": os.environ.get("RANK"), "boundary": self.mode, "time": time.time()})

    def write_meta(self, stub: bool = False) -> None:
        if self.events == 0 and self.mode is None and not stub:
            return
        os.makedirs(self.proc_dir, exist_ok=True)
        if stub:  # torch imported, no call of ours: what the analysis needs to say so
            self.P.write_json(os.path.join(self.proc_dir, self.P.META), {
                "pid": self.pid, "ppid": os.getppid(), "argv": list(sys.argv), "torch": self.torch.__version__,
                "events": 0, "steps_seen": 0, "finished": self.finished, "elapsed_s": perf() - self.t_start})
            return
        rank, world = getattr(self, "rank", None), getattr(self, "world", None)
        if rank is None:
            rank, world = self._rank()
        torch = self.torch
        meta = {
            "pid": self.pid, "ppid": os.getppid(), "argv": list(sys.argv), "cwd": os.getcwd(),
            "rank": rank, "world_size": world, "local_rank": os.environ.get("LOCAL_RANK"),
            "boundary": self.mode, "boundary_detail": self.mode_detail, "cycle": self.cycle,
            "steps_seen": self.completed, "state": self.state, "window": self.window,
            "window_reason": getattr(self, "window_reason", ""), "window_note": self.window_note,
            "optimizers": sorted(self.optimizers.values(), key=lambda o: o["order"]),
            "roots": self.root_info, "loaders": list(self.loaders.values()),
            "batch_sizes": {str(k): v for k, v in self.batch_sizes.items()},
            "autocast": self.autocast, "cuda": bool(torch.cuda.is_available() and torch.cuda.is_initialized()),
            "device_name": _device_name(torch), "torch": torch.__version__,
            "tool_outside_s": self.tool_outside, "exports": self.exports, "oom": self.oom,
            "notes": self.notes, "compiles_at_window": self.compiles_at_window, "compiles": self._compiles(),
            "finished": self.finished, "events": self.events, "elapsed_s": perf() - self.t_start,
            "evaluation": self.evaluation,
            "clock": {"perf": perf(), "time": time.time()},
        }
        self.P.write_json(os.path.join(self.proc_dir, self.P.META), meta)

    def finish(self) -> None:
        """At exit (also after an uncaught exception): the open step, the window, every file."""
        if self.child or self.finished:
            return
        self.finished = True
        self.busy = True
        try:
            if self.events == 0 and self.mode is None:
                self.write_meta(stub=True)  # torch was imported, nothing ran: the analysis says so
                return
            now = perf()
            if self.mode is None and self.backward_seen and not self.optimizers:
                self.manual_boundary()  # one backward and its update: a whole step
            elif self.mode is None and self.pending:
                self.forward_boundary("no optimizer stepped and no backward ran before the script ended")
            if self.evaluating is not None:  # an evaluation period, not a step
                self.evaluation["period_ms"] += (now - self.evaluating) * 1e3
                self.evaluating = None
            elif self.mode is None:
                self.mode = "time window"
                self.mode_detail = "the whole run (no optimizer step, module or DataLoader batch ended a step)"
                self._record(self.t0, now, self.acc, self.syncs, self.step_tool, self.batches)
            elif self.mode == "manual update" and self.step_backward:  # its update ran: a whole step
                self.acc["host"] += now - self.t_last
                self._record(self.t0, now, self.acc, self.syncs, self.step_tool, self.batches)
            else:
                # the step in progress, unfinished: kept apart (not a whole step)
                partial = {"n": self.completed + 1, "t0": self.t0, "t1": perf(),
                           "ms": {k: v * 1e3 for k, v in self.acc.items()}, "partial": True}
                self.lines.append(json.dumps(partial))
            if self.prof is not None:
                self._stop_window(aborted=True)
            self.flush()
            self.write_meta()
            self._status(force=True)
        except Exception as e:
            self.fail("at exit", e)

    # ------------------------------------------------------------------ DataLoader workers
    def worker_batch(self, t0: float, t1: float, collate_s: float, worker: int, n: int) -> None:
        self.worker_lines.append(f"[{t0:.6f},{t1:.6f},{collate_s:.6f},{worker},{n},{os.getppid()}]")
        if t1 - self.worker_flush > self.P.WORKER_FLUSH_S:
            self.flush_workers()

    def flush_workers(self) -> None:
        self.worker_flush = perf()
        if not self.worker_lines:
            return
        d = os.path.join(self.run_dir, self.P.WORKERS)
        os.makedirs(d, exist_ok=True)
        lines, self.worker_lines = self.worker_lines, []
        with open(os.path.join(d, f"{os.getpid()}.jsonl"), "a") as f:
            f.write("\n".join(lines) + "\n")

    def after_fork(self) -> None:
        self.child = True
        self.prof = None
        self.step_rf = None
        self.lines = []
        self.worker_lines = []


# ---------------------------------------------------------------------- helpers
def _norms(torch, tensors: list, order, dtype) -> list:
    """torch._foreach_norm(tensors, order) in ``dtype`` (an older torch without its dtype argument: each norm
    computed in the tensors' dtype and cast; ord 0, the nonzero count, then by count_nonzero)."""
    try:
        return list(torch._foreach_norm(tensors, order, dtype=dtype))
    except TypeError:
        if order == 0:
            return [torch.count_nonzero(t).to(dtype) for t in tensors]
        return [x.to(dtype) for x in torch._foreach_norm(tensors, order)]


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    """'float32' for torch.float32 (cached: plan_capture asks at every training forward)."""
    name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


@contextlib.contextmanager
def _engine_imported():
    """diagnostics.analyses.plan.attached, imported from this checkout for the time of the plan: sys.path
    is restored after it and the ``diagnostics`` modules it imported are dropped from sys.modules (the
    third-party modules they import, numpy and msgspec among them, stay imported)."""
    import importlib

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    theirs = sys.modules.get("diagnostics")
    if theirs is not None and not os.path.abspath(getattr(theirs, "__file__", "") or "").startswith(root + os.sep):
        raise RuntimeError("the script has a module of its own named diagnostics: the plan cannot import ours")
    path, before = list(sys.path), set(sys.modules)
    sys.path.insert(0, root)
    try:
        yield importlib.import_module("diagnostics.analyses.plan.attached")
    finally:
        sys.path[:] = path
        for name in [n for n in sys.modules if n not in before and (n == "diagnostics" or n.startswith("diagnostics."))]:
            del sys.modules[name]


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _device_name(torch) -> str | None:
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:
        pass
    return None


def _autocast(torch) -> dict | None:
    out = {}
    for dev in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                out[dev] = str(torch.get_autocast_dtype(dev)).replace("torch.", "")
        except Exception:
            pass
    return out


def _first_tensor(x, torch, depth: int = 0):
    if isinstance(x, torch.Tensor):
        return x
    if depth > 2:
        return None
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        for v in x[:8]:
            t = _first_tensor(v, torch, depth + 1)
            if t is not None:
                return t
    return None


def _location(frame, torch_dir: str) -> str:
    """file:line of the first frame outside torch (and outside this file)."""
    f, k = frame, 0
    while f is not None and k < 20 and (f.f_code.co_filename.startswith(torch_dir) or f.f_code.co_filename == AGENT_FILE):
        f, k = f.f_back, k + 1
    f = f or frame
    return f"{f.f_code.co_filename}:{f.f_lineno}"


def _prune(tb):
    """A traceback without the frames of this file (our wrappers), so the user reads their own."""
    head = prev = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != AGENT_FILE:
            if prev is None:
                head = tb
            else:
                prev.tb_next = tb
            prev = tb
        tb = tb.tb_next
    if prev is not None:
        prev.tb_next = None
    return head


def _prune_chain(exc, seen=None) -> None:
    seen = seen if seen is not None else set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            exc.__traceback__ = _prune(exc.__traceback__)
        if exc.__cause__ is not None:
            _prune_chain(exc.__cause__, seen)
        exc = exc.__context__


def _fast_path(torch):
    """(code of Module._call_impl, the offset and line of its fast path's call: ``return forward_call(*args,
    **kwargs)``, what a module without hooks runs), or None where torch's code is not shaped so."""
    import dis

    code = getattr(getattr(torch.nn.Module, "_call_impl", None), "__code__", None)
    if code is None:
        return None
    first = next((i for i in dis.get_instructions(code) if i.opname == "CALL_FUNCTION_EX"), None)
    pos = getattr(first, "positions", None)  # Python 3.11+
    if pos is None or pos.lineno is None:
        return None
    inner = {c for c in code.co_consts if getattr(c, "co_name", None) == "inner"}
    return (code, first.offset, pos.lineno, inner) if inner else None


def _only_our_global_hooks(agent) -> bool:
    from torch.nn.modules import module as mm

    ours = {getattr(h, "id", None) for h in agent.handles}
    return (not mm._global_backward_pre_hooks and not mm._global_backward_hooks
            and set(mm._global_forward_hooks) <= ours and set(mm._global_forward_pre_hooks) <= ours)


def _as_bare(agent, tb, fast):
    """The traceback as bare shows it: our global module hooks make torch's module call take its hooked path
    (``_call_impl`` -> ``inner``) where, bare, a module without hooks of its own takes the fast path (the
    first return of ``_call_impl``); each such pair is shown as that one entry (its frame, at the fast path's
    call). Modules with hooks of their own, or global hooks other than ours, take the hooked path bare too:
    left as they are."""
    import types

    code, lasti, line, inner = fast
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    out, i = [], 0
    while i < len(entries):
        cur = entries[i]
        nxt = entries[i + 1] if i + 1 < len(entries) else None
        if cur.tb_frame.f_code is code and nxt is not None and nxt.tb_frame.f_code in inner:
            mod = cur.tb_frame.f_locals.get("self")
            if mod is not None and not (mod._backward_hooks or mod._backward_pre_hooks or mod._forward_hooks
                                        or mod._forward_pre_hooks):
                out.append(types.TracebackType(None, cur.tb_frame, lasti, line))
                i += 2
                continue
        out.append(cur)
        i += 1
    for a, b in zip(out, out[1:] + [None]):
        a.tb_next = b
    return out[0] if out else None


def _bare_chain(agent, exc) -> None:
    fast = _fast_path(agent.torch)
    if fast is None or not _only_our_global_hooks(agent):
        return
    seen: set = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            e.__traceback__ = _as_bare(agent, e.__traceback__, fast)
        todo += [e.__cause__, e.__context__]


# ---------------------------------------------------------------------- installation
def install(torch, run_dir: str, protocol) -> Agent:
    """Install every hook in this process (torch has just been imported)."""
    agent = Agent(torch, run_dir, protocol)
    _install_optimizer(agent)
    _install_modules(agent)
    _install_autograd(agent)
    _install_dataloader(agent)
    _install_syncs(agent)
    _install_collectives(agent)
    _install_exit(agent)
    os.register_at_fork(after_in_child=agent.after_fork)
    return agent


def _guarded(agent, fn):
    def run():
        try:
            fn()
        except Exception as e:
            agent.fail(getattr(fn, "__name__", "thread"), e)
    return run


def _install_optimizer(agent: Agent) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def pre(opt, args, kwargs):
        if agent.is_compiling() or not agent.active or agent.child or agent.busy:
            return
        if agent.optimizers and threading.get_ident() != agent.main:
            return
        try:
            return agent.on_opt_pre(opt, args, kwargs)
        except Exception as e:
            agent.fail("optimizer pre-hook", e)

    def post(opt, args, kwargs):
        if agent.is_compiling() or not agent.ok():
            return
        try:
            agent.on_opt_post(opt)
        except Exception as e:
            agent.fail("optimizer post-hook", e)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def _phase_wrapper(agent: Agent, orig, phase: str, before=None, look=None):
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if agent.is_compiling() or not agent.ok():
            return orig(*args, **kwargs)
        try:
            if look is not None:
                look(args, kwargs)
            if before is not None:
                before()
            agent.enter(phase)
        except Exception as e:
            agent.fail(phase, e)
            return orig(*args, **kwargs)
        try:
            return orig(*args, **kwargs)
        except BaseException as e:  # noted (where an out-of-memory error happened), raised on unchanged
            _noted(agent, e)
            raise
        finally:
            if agent.active:
                agent.leave()
    return wrapper


def _noted(agent: Agent, e: BaseException, mod=None) -> None:
    try:
        if agent.active:
            agent.note_raise(e, mod)
    except Exception:
        pass


def _install_modules(agent: Agent) -> None:
    """torch's global module hooks, filtered to the main thread's top-level calls: nothing is put on the
    user's modules (they pickle, deep-copy, script and save as bare)."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    def pre(mod, args):
        if agent.is_compiling() or not agent.ok():
            return
        d = agent.depth
        agent.depth = d + 1
        if d:
            return
        try:
            agent.on_top_forward(mod)
            agent.plan_capture(mod, args)  # run --plan, and the budget answer at an out-of-memory error
        except Exception as e:
            agent.fail("module forward pre-hook", e)

    def post(mod, args, *rest):
        # with_kwargs: (kwargs, output) after a forward; torch's except clause calls an always_call hook with
        # (output) alone
        if agent.is_compiling() or not agent.ok() or agent.depth <= 0:
            return
        agent.depth -= 1
        if agent.depth:
            return
        exc = sys.exc_info()[1]  # always_call: the forward raised (torch calls this hook in its except clause)
        if exc is not None:
            _noted(agent, exc, mod)
        try:
            agent.on_top_forward_end(mod)
        except Exception as e:
            agent.fail("module forward hook", e)
        try:
            if len(rest) == 2:
                agent.plan_outputs(mod, rest[0], rest[1])  # run --plan: keyword inputs, where the loss starts
        except Exception as e:  # the plan's record only: the run goes on
            agent.plan_calls.pop(id(mod), None)
            note = f"the model's keyword inputs could not be recorded: {type(e).__name__}: {e}"
            if note not in agent.notes:
                agent.notes.append(note)

    agent.handles = [register_module_forward_pre_hook(pre),
                     register_module_forward_hook(post, with_kwargs=True, always_call=True)]


def _install_autograd(agent: Agent) -> None:
    autograd = agent.torch.autograd
    autograd.backward = _phase_wrapper(agent, autograd.backward, "backward", agent.on_backward, agent.loss_capture)
    autograd.grad = _phase_wrapper(agent, autograd.grad, "backward", agent.on_backward, agent.loss_capture)


def _install_dataloader(agent: Agent) -> None:
    torch = agent.torch
    from torch.utils.data import dataloader as dl
    from torch.utils.data._utils import worker as wk

    base_next = dl._BaseDataLoaderIter.__next__

    @functools.wraps(base_next)
    def __next__(self):
        if agent.is_compiling() or not agent.ok():
            return base_next(self)
        try:
            if agent.mode == "batch":
                agent.close(perf())
            elif agent.step_backward and not agent.optimizers and not agent.stack:
                agent.manual_boundary()  # the step's backward and update ran: the next batch starts a step
            elif agent.mode is None and not agent.optimizers:
                agent.batch_fallback()
            agent.enter("data_wait")
        except Exception as e:
            agent.fail("DataLoader.__next__", e)
            return base_next(self)
        try:
            batch = base_next(self)
        except BaseException as e:
            _noted(agent, e)
            raise
        finally:
            if agent.active:
                agent.leave()
        try:
            agent.batches += 1
            key = agent.iter_loader.get(self, id(self))
            if key not in agent.batch_sizes or agent.state == "profiling":
                t = _first_tensor(batch, torch)
                if t is not None and t.dim() > 0:
                    agent.batch_sizes[key] = int(t.shape[0])
        except Exception as e:
            agent.fail("DataLoader batch", e)
        return batch

    dl._BaseDataLoaderIter.__next__ = __next__

    loader_iter = dl.DataLoader.__iter__

    @functools.wraps(loader_iter)
    def __iter__(self):
        if agent.is_compiling() or not agent.ok():
            return loader_iter(self)
        t = perf()
        try:
            agent.enter("data_wait")
        except Exception as e:
            agent.fail("DataLoader.__iter__", e)
            return loader_iter(self)
        try:
            it = loader_iter(self)
        finally:
            if agent.active:
                agent.leave()
        try:
            info = agent.loaders.get(id(self))
            if info is None:
                info = agent.loaders[id(self)] = {
                    "id": id(self), "batch_size": self.batch_size, "num_workers": self.num_workers,
                    "pin_memory": bool(self.pin_memory), "persistent_workers": bool(self.persistent_workers),
                    "prefetch_factor": self.prefetch_factor, "drop_last": bool(self.drop_last),
                    "dataset": type(self.dataset).__name__, "iter_starts_ms": [], "iters": 0,
                    "multiprocessing_context": str(getattr(self.multiprocessing_context, "_name", None)
                                                   or self.multiprocessing_context or "default")}
                try:
                    info["len"] = len(self)
                except Exception:
                    info["len"] = None
            info["iters"] += 1
            if len(info["iter_starts_ms"]) < 50:
                info["iter_starts_ms"].append((perf() - t) * 1e3)
            try:
                agent.iter_loader[it] = id(self)  # weakly: nothing set on the user's iterator
            except TypeError:
                pass
        except Exception as e:
            agent.fail("DataLoader iterator", e)
        return it

    dl.DataLoader.__iter__ = __iter__

    worker_loop = wk._worker_loop

    @functools.wraps(worker_loop)
    def _worker_loop(dataset_kind, dataset, index_queue, data_queue, done_event, auto_collation, collate_fn,
                     *rest, **kw):
        worker_id = rest[3] if len(rest) > 3 else kw.get("worker_id", -1)
        timing = _WorkerTiming(agent, worker_id)
        try:
            return worker_loop(dataset_kind, dataset, _TimedGet(index_queue, timing),
                               _TimedPut(data_queue, timing), done_event, auto_collation,
                               timing.collate(collate_fn), *rest, **kw)
        finally:
            try:
                agent.flush_workers()
            except Exception:
                pass

    wk._worker_loop = _worker_loop


class _WorkerTiming:
    """One DataLoader worker's batches: from taking an index off its queue to putting the batch on
    the data queue (fetch + collate), and the collate part."""

    def __init__(self, agent: Agent, worker: int):
        self.agent, self.worker = agent, worker
        self.t_get = None
        self.n = 0
        self.collate_s = 0.0

    def collate(self, fn):
        if fn is None:
            return fn
        timing = self

        def timed_collate(batch):
            t = perf()
            try:
                return fn(batch)
            finally:
                timing.collate_s += perf() - t
        timed_collate.__wrapped__ = fn
        return timed_collate


class _TimedGet:
    def __init__(self, q, timing: _WorkerTiming):
        self._q, self._timing = q, timing

    def get(self, *a, **k):
        r = self._q.get(*a, **k)
        if isinstance(r, tuple) and len(r) == 2:
            t = self._timing
            t.t_get, t.collate_s = perf(), 0.0
            try:
                t.n = len(r[1])
            except TypeError:
                t.n = 1
        return r

    def __getattr__(self, name):
        return getattr(self._q, name)


class _TimedPut:
    def __init__(self, q, timing: _WorkerTiming):
        self._q, self._timing = q, timing

    def put(self, item, *a, **k):
        t = self._timing
        if t.t_get is not None and isinstance(item, tuple) and len(item) == 2:
            try:
                t.agent.worker_batch(t.t_get, perf(), t.collate_s, t.worker, t.n)
            except Exception:
                pass
            t.t_get = None
        return self._q.put(item, *a, **k)

    def __getattr__(self, name):
        return getattr(self._q, name)


def _install_syncs(agent: Agent) -> None:
    torch = agent.torch
    torch_dir = agent.torch_dir

    def make(orig, name):
        @functools.wraps(orig)
        def sync(self, *args, **kwargs):
            if agent.is_compiling() or not agent.ok():
                return orig(self, *args, **kwargs)
            if self is not None and self.device.type == "cpu":  # no device to wait for
                return orig(self, *args, **kwargs)
            try:
                frame = sys._getframe(1)
                agent.enter("sync")
                t = agent.t_last
            except Exception as e:
                agent.fail("sync", e)
                return orig(self, *args, **kwargs)
            try:
                return orig(self, *args, **kwargs)
            finally:
                if agent.active:
                    try:
                        now = agent.leave()
                        loc = _location(frame, torch_dir)
                        rec = agent.syncs.get(loc)
                        if rec is None:
                            agent.syncs[loc] = [1, now - t]
                        else:
                            rec[0] += 1
                            rec[1] += now - t
                    except Exception as e:
                        agent.fail("sync", e)
        return sync

    for name in SYNC_METHODS:
        orig = getattr(torch.Tensor, name, None)
        if orig is not None:
            setattr(torch.Tensor, name, make(orig, name))
    if hasattr(torch, "cuda") and hasattr(torch.cuda, "synchronize"):
        orig_sync = torch.cuda.synchronize

        @functools.wraps(orig_sync)
        def synchronize(*args, **kwargs):
            return sync_fn(None, *args, **kwargs)

        sync_fn = make(lambda _self, *a, **k: orig_sync(*a, **k), "synchronize")
        torch.cuda.synchronize = synchronize


def _install_collectives(agent: Agent) -> None:
    torch = agent.torch
    try:
        dist = torch.distributed
        if not dist.is_available():
            return
        import torch.distributed.distributed_c10d as c10d
    except Exception:
        return
    for name in COLLECTIVES:
        orig = getattr(c10d, name, None)
        if orig is None:
            continue
        wrapped = _phase_wrapper(agent, orig, "comm")
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, wrapped)


def _install_exit(agent: Agent) -> None:
    atexit.register(_guarded(agent, agent.finish))
    previous = sys.excepthook

    def excepthook(etype, value, tb):
        try:
            if value is not None:
                _prune_chain(value)
                try:
                    _bare_chain(agent, value)
                except Exception:  # shown with torch's hooked path then: still the script's own frames
                    pass
                tb = value.__traceback__
            if agent.torch.cuda.is_available() and "OutOfMemoryError" in etype.__name__:
                _dump_oom(agent, f"{etype.__name__}: {value}")
        except Exception:
            pass
        try:
            if value is not None and not agent.child:
                _record_oom(agent, value)
        except Exception:
            pass
        return previous(etype, value, tb)

    # No SIGTERM handler: a Python handler would delay a rank blocked in native code, which torchrun
    # stops with SIGTERM (bare, it dies at once). What was measured is flushed every FLUSH_S anyway.
    sys.excepthook = excepthook
    try:
        observer = getattr(agent.torch._C, "_cuda_attach_out_of_memory_observer", None)
        if observer is not None and agent.torch.cuda.is_available():
            agent.oom_observer = observer
            _OOM_PENDING.append(agent)
    except Exception:
        pass


_OOM_PENDING: list = []


def attach_oom_observer(agent: Agent) -> None:
    """Once CUDA is initialised: the allocator's out-of-memory observer dumps a snapshot."""
    if agent not in _OOM_PENDING:
        return
    _OOM_PENDING.remove(agent)

    def on_oom(device, alloc, device_alloc, device_free):
        agent.oom_observed = {"device": int(device), "requested": int(alloc), "allocated": int(device_alloc),
                              "free": int(device_free)}
        _dump_oom(agent, f"CUDA out of memory on device {device}: asked for {alloc} bytes, "
                         f"{device_alloc} allocated, {device_free} free")

    agent.oom_observer(on_oom)


def _dump_oom(agent: Agent, why: str) -> None:
    if agent.oom is not None:
        return
    torch = agent.torch
    rank, _ = agent._rank()
    path = os.path.join(agent.run_dir, agent.P.rank_file(agent.P.OOM_SNAPSHOT, rank))
    agent.oom = {"why": why, "step": agent.completed + 1, "snapshot": None}
    try:
        torch.cuda.memory._dump_snapshot(path)
        agent.oom["snapshot"] = os.path.basename(path)
    except Exception as e:
        agent.oom["error"] = f"{type(e).__name__}: {e}"
    try:
        agent.write_meta()
    except Exception:
        pass


# ---------------------------------------------------------------------- out of memory
#: Exceptions looked through for an out-of-memory error (its cause / context chain).
OOM_CHAIN = 8
#: The most of an out-of-memory message kept.
OOM_MESSAGE_CHARS = 2000


def _oom_in_chain(P, exc):
    """(the out-of-memory exception in ``exc``'s cause / context chain, "cuda" or "cpu"), or (None, None)."""
    seen = 0
    while exc is not None and seen < OOM_CHAIN:
        kind = P.oom_kind(type(exc).__name__, str(exc))
        if kind:
            return exc, kind
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None, None


def _record_oom(agent: Agent, value: BaseException) -> None:
    """The script dies of out-of-memory (called from the excepthook, before the previous hook prints the
    traceback): the failing allocation, the step and part it happened in, what held memory (by category and
    by module: the script's tensors counted), and the planner's budget answer for the device's capacity, to
    proc-<pid>/oom.json. Only read: nothing of the script's is changed, the exception passes on as it came."""
    import warnings

    P = agent.P
    exc, kind = _oom_in_chain(P, value)
    if exc is None:
        return
    t = perf()
    agent.busy = True
    try:
        message = f"{type(exc).__name__}: {exc}"[:OOM_MESSAGE_CHARS]
        size, exact = P.requested_bytes(str(exc))
        observed = agent.oom_observed if kind == "cuda" else None
        if observed is not None:  # the allocator's own figure: exact
            size, exact = observed["requested"], True
        raised = agent.raised
        ids = set()
        e, k = value, 0
        while e is not None and k < OOM_CHAIN:
            ids.add(id(e))
            e, k = e.__cause__ or e.__context__, k + 1
        if raised is not None and raised[0] in ids:
            stack, step, module = raised[1], raised[2], raised[3]
        else:  # no wrapper of ours saw it: the part still open (an optimizer's step that raised), else host
            stack, step, module = list(agent.stack) or ["host"], agent.completed + 1, None
        rec = {"kind": kind, "why": message, "step": step, "phase": P.OOM_PHASES.get(stack[0], stack[0]),
               "inside": P.OOM_PHASES.get(stack[-1], stack[-1]) if len(stack) > 1 else None, "module": module,
               "requested_bytes": size, "requested_exact": exact}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the script's stderr stays as bare
            if agent.prof is not None:  # the trace ends at the failure: our counting and planning stay out of it
                try:
                    agent._stop_window(aborted=True, why=f"the script died of out-of-memory in step {step}")
                except Exception as e:
                    agent.notes.append(f"the profiled window could not be stopped at the out-of-memory error: "
                                       f"{type(e).__name__}: {e}")
            model, opt = _oom_model(agent)
            try:
                rec.update(_held_memory(agent, kind, model, opt, observed))
            except Exception as e:
                rec["held_error"] = f"{type(e).__name__}: {e}"
            rec.update(_oom_plan(agent, kind, model, opt))
        rec["seconds"] = perf() - t  # what the report delayed the script's end by
        os.makedirs(agent.proc_dir, exist_ok=True)
        P.write_json(os.path.join(agent.proc_dir, P.OOM), rec)
    finally:
        agent.busy = False
        agent.tool_outside += perf() - t


def _oom_model(agent: Agent):
    """(the model, its optimizer) at an out-of-memory error: the first optimizer that stepped and the module
    trained at the top level that holds its parameters (as ``run --plan`` picks them); without an optimizer,
    the first module with parameters called at the top level."""
    opts = sorted(((agent.optimizers.get(k, {}).get("order", 0), r()) for k, r in agent.opt_refs.items()),
                  key=lambda x: x[0])
    opts = [o for _, o in opts if o is not None]
    opt = opts[0] if opts else None
    model = None
    if opt is not None:
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        for ref, *_ in agent.plan_calls.values():
            m = ref()
            if m is not None and {id(p) for p in m.parameters()} & held:
                model = m
                break
    if model is None and agent.main_root is not None:
        model = agent.main_root()
    return model, opt


def _held_memory(agent: Agent, kind: str, model, opt, observed) -> dict:
    """What held the device's memory: the script's tensors on that device counted from their storages (each
    once): parameters, buffers, gradients and optimizer state, in total and per top-level child module of the
    model (``(model)``: the model's own; ``(outside the model)``: an optimizer's parameters the model does
    not hold); the rest (activations and temporaries) is the allocated total less them."""
    torch = agent.torch
    seen: set = set()

    def nbytes(ts) -> int:
        n = 0
        for x in ts:
            if not isinstance(x, torch.Tensor) or x.device.type != kind:
                continue
            try:
                st = x.untyped_storage()
                key = (st.data_ptr(), str(x.device))
                if key in seen:
                    continue
                seen.add(key)
                n += int(st.nbytes())
            except Exception:  # a tensor without storage (sparse, a subclass): not counted
                continue
        return n

    opts = [r() for r in agent.opt_refs.values()]
    opts = [o for o in opts if o is not None]
    owners: list = []
    taken: set = set()
    if model is not None:
        for name, child in model.named_children():
            owners.append((name, [p for p in child.parameters() if id(p) not in taken],
                           [b for b in child.buffers()]))
            taken.update(id(p) for p in owners[-1][1])
        own = [p for p in model.parameters(recurse=False) if id(p) not in taken]
        owners.append(("(model)", own, list(model.buffers(recurse=False))))
        taken.update(id(p) for p in own)
    rest = [p for o in opts for g in o.param_groups for p in g["params"] if id(p) not in taken]
    if rest:
        owners.append(("(outside the model)", list({id(p): p for p in rest}.values()), []))
    rows = []
    for name, params, buffers in owners:
        state = [v for o in opts for p in params for v in (o.state.get(p) or {}).values()]
        row = {"module": name, "parameters": nbytes(params), "buffers": nbytes(buffers),
               "gradients": nbytes([p.grad for p in params]), "optimizer_state": nbytes(state)}
        if any(row[k] for k in ("parameters", "buffers", "gradients", "optimizer_state")):
            rows.append(row)
    cats = {k: sum(r[k] for r in rows) for k in ("parameters", "buffers", "gradients", "optimizer_state")}
    if kind == "cuda":
        if observed is not None:
            total = observed["allocated"]
            how = "torch.cuda.memory_allocated() when the allocator ran out (its out-of-memory observer)"
        else:
            total = int(torch.cuda.memory_allocated())
            how = "torch.cuda.memory_allocated() as the exception ended the script (its frames still held)"
    else:
        total = _rss()
        how = ("the process' resident memory (RSS) as the exception ended the script (its frames still held): the "
               "CPU allocator keeps no count, so the rest also holds the interpreter's and torch's own memory")
    counted = sum(cats.values())
    return {"held_bytes": {**cats, "activations and temporaries": max(0, total - counted) if total else None},
            "total_bytes": total, "total_how": how, "by_module": rows}


def _oom_plan(agent: Agent, kind: str, model, opt) -> dict:
    """The planner's budget answer for the script's step on the device's capacity, or why there is none."""
    if opt is None:
        return {"plan_error": "no optimizer step was seen before the out-of-memory error: the planner plans a "
                              "training step with the script's optimizer (its settings, its state), so it is not made"}
    if model is None:
        return {"plan_error": f"no module trained at the top level holds the parameters of the script's optimizer "
                              f"({type(opt).__name__}): nothing to plan"}
    call = agent.plan_calls.get(id(model))
    if call is None:
        return {"plan_error": "no training forward of the model was seen: its batch "
                              "is not known"}
    try:
        with _engine_imported() as attached:
            return {"plan": attached.fit_in_process(model, opt, call[1], call[2], kind, agent.loss_ops)}
    except Exception as e:
        return {"plan_error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:400]}"}
