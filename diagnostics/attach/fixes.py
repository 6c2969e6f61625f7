"""The trial guest: inside the user's process (torch and the standard library only, loaded by path by the
bootstrap when the run folder holds a trial.json), it applies one candidate's fixes with no edit of the
script, times the steps and ends the script at a step boundary once the timed steps are done.

* a step ends at the first optimizer's step (the global optimizer step post-hook, as attach mode);
* the first ``warmup`` steps are not timed (a compile happens there: it is reported as warm-up time); their
  losses (the scalar ``backward`` is called on) and gradient norms (the optimizer's gradients before its step)
  are recorded, then ``steps`` steps are timed, end to end;
* every fix says whether it could act on this script and why not (no DataLoader, no 4-D tensor, no CUDA...),
  and, where it acts, the change to make by hand with its line (``DataLoader(..., num_workers=4) at train.py:41``);
* the same instrumentation runs in every candidate, the baseline's included (global module hooks to find the
  top-level module, the optimizer hooks, the ``backward`` wrapper), so its cost is on both sides of a ratio.

Everything of ours is removed at the end (hooks, class attributes put back, instance attributes deleted); the
fixes themselves stay on the user's objects, as the change by hand would. Failures of ours are written into
the outcome file and the script runs on as the candidate it is.
"""

from __future__ import annotations

import os
import sys
import time

GUEST_FILE = os.path.abspath(__file__)


def _site(torch_dir: str, skip: int = 2) -> str | None:
    """file:line of the first frame outside torch and this file (where the user's code called us)."""
    f = sys._getframe(skip)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(torch_dir) and fn != GUEST_FILE and "<frozen" not in fn and "importlib" not in fn:
            return f"{os.path.relpath(fn) if not os.path.relpath(fn).startswith('..') else fn}:{f.f_lineno}"
        f = f.f_back
    return None


class Fix:
    """A fix's state in this process: applicable (None: not decided yet), why not, the change to make."""

    def __init__(self, spec: str, name: str, value):
        self.spec, self.name, self.value = spec, name, value
        self.applicable: bool | None = None
        self.reason = ""
        self.change: str | None = None
        self.acted = False  # it changed something in this process

    def na(self, reason: str) -> None:
        if self.applicable is None:
            self.applicable, self.reason = False, reason

    def ok(self, change: str) -> None:
        if self.applicable is None:
            self.applicable, self.change = True, change

    def to_dict(self) -> dict:
        return {"applicable": self.applicable, "reason": self.reason, "change": self.change}


class Guest:
    def __init__(self, torch, run_dir: str, protocol, config):
        self.torch, self.run_dir, self.protocol, self.config = torch, run_dir, protocol, config
        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
        self.fixes = {}
        for spec in config.fixes:
            name, value = protocol.split_fix(spec)
            self.fixes[name] = Fix(spec, name, value)
        self.t_install = time.perf_counter()
        self.t_first: float | None = None  # the top-level module's first forward
        self.ends: list[float] = []  # each step's end
        self.losses: list[float] = []
        self._step_losses: list[float] = []
        self.grad_norms: list[float] = []
        self.depth = 0
        self.top = None  # the top-level module with parameters (weakly referenced)
        self.top_name = ""
        self.call_site: str | None = None
        self.device_type = "cpu"
        self.loaders: list[dict] = []
        self.optimizer = None
        self.optimizer_site: str | None = None
        self.zero_grad_false: str | None = None
        self.handles: list = []
        self.restore: list = []  # (object, attribute, original) to put back; original None: delete it
        self.errors: list[str] = []
        self.autocast = None
        self.scaler = None
        self._scaled = False
        self.blocks: list = []
        self.finished = False
        self.ended_by_us = False
        self.cuda = bool(torch.cuda.is_available())

    # ------------------------------------------------------------------ bookkeeping
    def fail(self, where: str, exc: BaseException) -> None:
        self.errors.append(f"{where}: {type(exc).__name__}: {exc}")

    def patch(self, obj, attr: str, new) -> None:
        self.restore.append((obj, attr, obj.__dict__.get(attr) if isinstance(obj, type) else None,
                             isinstance(obj, type)))
        setattr(obj, attr, new)

    def outcome(self) -> dict:
        steps = len(self.ends)
        starts = [self.t_first if self.t_first is not None else self.t_install] + self.ends[:-1]
        ms = [(e - s) * 1e3 for s, e in zip(starts, self.ends)]
        w = self.config.warmup
        return {"pid": os.getpid(), "label": self.config.label, "fixes": {f.spec: f.to_dict() for f in self.fixes.values()},
                "steps_seen": steps, "warmup_ms": ms[:w], "step_ms": ms[w:w + self.config.steps],
                "first_step_ms": ms[0] if ms else None, "losses": self.losses, "grad_norms": self.grad_norms,
                "peak_bytes": self._peak(), "peak_kind": "allocator" if self.device_type == "cuda" else "rss",
                "device": self.device_type, "model": self.top_name, "call_site": self.call_site,
                "loaders": self.loaders, "optimizer_site": self.optimizer_site, "errors": self.errors,
                "done": self.finished, "ended_by_us": self.ended_by_us}

    def write(self) -> None:
        try:
            self.protocol.write_json(os.path.join(self.run_dir, self.protocol.outcome_name(os.getpid())),
                                     self.outcome())
        except Exception:
            pass

    def _peak(self) -> int | None:
        torch = self.torch
        try:
            if self.device_type == "cuda" and torch.cuda.is_initialized():
                return int(torch.cuda.max_memory_allocated())
            import resource

            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
        except Exception:
            return None

    def uninstall(self) -> None:
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles = []
        for obj, attr, orig, is_class in reversed(self.restore):
            try:
                if is_class and orig is not None:
                    setattr(obj, attr, orig)
                else:
                    delattr(obj, attr)
            except Exception:
                pass
        self.restore = []
        if self.autocast is not None:
            try:
                self.autocast.__exit__(None, None, None)
            except Exception:
                pass
            self.autocast = None

    # ------------------------------------------------------------------ the DataLoader
    def dataloader_init(self, orig):
        guest = self

        def __init__(loader, *args, **kwargs):
            import inspect

            over = {}
            try:
                bound = inspect.signature(orig).bind(loader, *args, **kwargs)
                bound.apply_defaults()
                a = bound.arguments
                over = guest._loader_overrides(a)
                site = _site(guest.torch_dir)
                guest.loaders.append({"site": site, "num_workers": a.get("num_workers"),
                                      "pin_memory": a.get("pin_memory"), "overrides": dict(over)})
            except Exception as e:
                guest.fail("reading a DataLoader's arguments", e)
            if over:
                kwargs = dict(kwargs)
                names = list(inspect.signature(orig).parameters)[1:]
                for i, v in enumerate(args):  # positional arguments by name, so an override replaces them
                    kwargs[names[i]] = v
                args = ()
                kwargs.update(over)
            return orig(loader, *args, **kwargs)

        return __init__

    def _loader_overrides(self, a: dict) -> dict:
        """The DataLoader arguments this candidate changes, each fix told whether it could act and why not."""
        torch = self.torch
        over = {}
        site = _site(self.torch_dir, 1) or "?"
        iterable = isinstance(a.get("dataset"), torch.utils.data.IterableDataset)
        workers = a.get("num_workers") or 0
        f = self.fixes.get("loader_workers")
        if f:
            if iterable:
                f.na(f"the DataLoader at {site} reads an IterableDataset: each worker would yield the whole dataset "
                     "unless it shards itself by get_worker_info(), so more workers is a change of the data")
            elif workers >= f.value:
                f.na(f"the DataLoader at {site} already has num_workers={workers}")
            else:
                over["num_workers"] = workers = f.value
                f.ok(f"DataLoader(..., num_workers={f.value}) at {site}")
        f = self.fixes.get("pin_memory")
        if f:
            if not self.cuda:
                f.na("no CUDA device: pinned memory only speeds host-to-device copies")
            elif a.get("pin_memory"):
                f.na(f"the DataLoader at {site} already has pin_memory=True")
            else:
                over["pin_memory"] = True
                f.ok(f"DataLoader(..., pin_memory=True) at {site}")
        for key, arg, value in (("persistent_workers", "persistent_workers", True),
                                ("prefetch", "prefetch_factor", None)):
            f = self.fixes.get(key)
            if not f:
                continue
            value = f.value if value is None else value
            if workers <= 0:
                f.na(f"the DataLoader at {site} has num_workers=0: {arg} needs worker processes")
            elif a.get(arg) == value or (arg == "prefetch_factor" and a.get(arg) is None and value == 2):
                f.na(f"the DataLoader at {site} already has {arg}={value}")
            else:
                over[arg] = value
                f.ok(f"DataLoader(..., {arg}={value}) at {site}")
        return over

    # ------------------------------------------------------------------ the top-level module
    def forward_pre(self, module, args):
        if self.torch.compiler.is_compiling():
            return None
        self.depth += 1
        if self.depth != 1:
            return None
        try:
            if self.top is None:
                if next(module.parameters(), None) is None:
                    return None  # a loss module: not the model
                self._first_forward(module)
            if self.top is not None and self.top() is module:
                return self._enter(module, args)
        except Exception as e:
            self.fail("the top-level module's forward", e)
        return None

    def forward_post(self, module, args, out):
        if self.torch.compiler.is_compiling():
            return None
        self.depth = max(0, self.depth - 1)
        if self.depth != 0 or self.autocast is None:
            return None
        try:
            self.autocast.__exit__(None, None, None)
        finally:
            self.autocast = None
        return self._to_float32(out)

    def _to_float32(self, out):
        torch = self.torch
        if isinstance(out, torch.Tensor):
            return out.float() if out.dtype in (torch.bfloat16, torch.float16) else out
        if isinstance(out, tuple) and not hasattr(out, "_fields"):
            return tuple(self._to_float32(o) for o in out)
        if isinstance(out, list):
            return [self._to_float32(o) for o in out]
        if isinstance(out, dict):
            try:
                return type(out)(**{k: self._to_float32(v) for k, v in out.items()})
            except Exception:
                return out
        return out

    def _first_forward(self, module) -> None:
        import weakref

        torch = self.torch
        self.top = weakref.ref(module)
        self.top_name = type(module).__name__
        self.call_site = _site(self.torch_dir, 1)
        self.t_first = time.perf_counter()
        p = next(module.parameters())
        self.device_type = p.device.type
        at = f" at {self.call_site}" if self.call_site else ""
        name = self.top_name
        for key, dtype in (("amp_bf16", "bfloat16"), ("amp_fp16", "float16")):
            f = self.fixes.get(key)
            if not f:
                continue
            if torch.is_autocast_enabled(self.device_type):
                f.na(f"the forward of {name}{at} already runs under autocast")
            elif self.device_type not in ("cpu", "cuda", "xpu", "mps"):
                f.na(f"autocast does not support the device {self.device_type}")
            else:
                scaler = (" and a torch.amp.GradScaler around backward and the optimizer's step"
                          if key == "amp_fp16" else "")
                f.ok(f"with torch.autocast({self.device_type!r}, dtype=torch.{dtype}): around the call of "
                     f"{name}{at}{scaler}")
                if key == "amp_fp16":
                    self.scaler = torch.amp.GradScaler(self.device_type)
        f = self.fixes.get("compile")
        if f:
            if getattr(module, "_compiled_call_impl", None) is not None:
                f.na(f"{name} is compiled already")
            else:
                module.compile(backend=self.config.compile_backend)
                self.restore.append((module, "_compiled_call_impl", None, False))
                f.ok(f"{name}.compile() (or model = torch.compile(model)) before its first call{at}")
        f = self.fixes.get("channels_last")
        if f:
            if any(q.dim() == 4 for q in module.parameters()):
                module.to(memory_format=torch.channels_last)
                f.ok(f"model.to(memory_format=torch.channels_last) and each 4-D input "
                     f".contiguous(memory_format=torch.channels_last){at}")
        f = self.fixes.get("checkpointing")
        if f:
            self._checkpoint_blocks(module, f)
        for key in ("cudnn_benchmark", "tf32"):
            f = self.fixes.get(key)
            if f and self.device_type != "cuda":
                f.na(f"the model runs on {self.device_type}, not CUDA: "
                     + ("cuDNN is not used" if key == "cudnn_benchmark" else "TF32 is a CUDA tensor-core format"))

    def _enter(self, module, args):
        torch = self.torch
        new_args = None
        f = self.fixes.get("channels_last")
        if f and f.applicable is not False:
            if any(isinstance(a, torch.Tensor) and a.dim() == 4 for a in args):
                new_args = tuple(a.contiguous(memory_format=torch.channels_last)
                                 if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)
                f.ok(f"model.to(memory_format=torch.channels_last) and each 4-D input "
                     f".contiguous(memory_format=torch.channels_last) at {self.call_site}")
            elif f.applicable is None:
                f.na(f"no 4-D tensor: neither the parameters of {self.top_name} nor its inputs are 4-D (N, C, H, W), "
                     "the layout channels_last changes")
        for key, dtype in (("amp_bf16", torch.bfloat16), ("amp_fp16", torch.float16)):
            f = self.fixes.get(key)
            if f and f.applicable:
                self.autocast = torch.autocast(self.device_type, dtype=dtype)
                self.autocast.__enter__()
                f.acted = True
        return new_args

    def _checkpoint_blocks(self, module, f: Fix) -> None:
        torch = self.torch
        import torch.utils.checkpoint as cp

        best = None
        for cname, child in module.named_modules():
            if not isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
                continue
            kinds: dict[type, list] = {}
            for sub in child.children():
                # a block: a module of modules (a transformer layer, a ResNet stage), not a lone Linear
                if next(sub.parameters(), None) is not None and next(sub.children(), None) is not None:
                    kinds.setdefault(type(sub), []).append(sub)
            for kind, subs in kinds.items():
                if len(subs) >= 2 and (best is None or len(subs) > len(best[2])):
                    best = (cname, kind, subs)
        if best is None:
            f.na(f"no repeated blocks in {self.top_name}: no ModuleList or Sequential holds two or more modules of "
                 "one class made of modules with parameters")
            return
        cname, kind, subs = best
        for sub in subs:
            orig = sub.forward

            def forward(*a, _orig=orig, _sub=sub, **k):
                if torch.is_grad_enabled() and _sub.training:
                    return cp.checkpoint(_orig, *a, use_reentrant=False, **k)
                return _orig(*a, **k)

            sub.forward = forward
            self.restore.append((sub, "forward", None, False))
        f.ok(f"torch.utils.checkpoint.checkpoint(block, ..., use_reentrant=False) around each of the {len(subs)} "
             f"{kind.__name__} blocks of {self.top_name}.{cname or '(root)'}")

    # ------------------------------------------------------------------ backward, the optimizer
    def backward_wrapper(self, orig):
        guest = self

        def backward(tensor, *args, **kwargs):
            try:
                if tensor.numel() == 1 and tensor.grad_fn is not None:
                    if len(guest.ends) < guest.config.warmup:
                        guest._step_losses.append(float(tensor.detach().float().item()))
                    if guest.scaler is not None:
                        guest._scaled = True
                        return orig(guest.scaler.scale(tensor), *args, **kwargs)
            except Exception as e:
                guest.fail("reading the loss", e)
            return orig(tensor, *args, **kwargs)

        return backward

    def zero_grad_wrapper(self, orig):
        guest = self

        def zero_grad(obj, set_to_none: bool = True):
            if not set_to_none and "set_to_none" in guest.fixes:
                if guest.zero_grad_false is None:
                    guest.zero_grad_false = _site(guest.torch_dir) or "?"
                set_to_none = True
            elif not set_to_none and guest.zero_grad_false is None:
                guest.zero_grad_false = _site(guest.torch_dir) or "?"
            return orig(obj, set_to_none)

        return zero_grad

    def optimizer_init_wrapper(self, orig):
        guest = self

        def __init__(opt, *args, **kwargs):
            if guest.optimizer_site is None:
                guest.optimizer_site = _site(guest.torch_dir)
            return orig(opt, *args, **kwargs)

        return __init__

    def on_opt_pre(self, opt, args, kwargs):
        torch = self.torch
        if self.optimizer is None:
            self.optimizer = opt
            self._first_optimizer(opt)
        if opt is not self.optimizer:
            if self.scaler is not None:  # GradScaler's one update per iteration over several optimizers: by hand
                f = self.fixes["amp_fp16"]
                f.applicable, f.change = False, None
                f.reason = (f"a second optimizer ({type(opt).__name__}) steps: scaler.step for each optimizer and one "
                            "scaler.update() per iteration must be written by hand")
                self._end()
            return None
        if self.scaler is not None and self._scaled:
            try:
                self.scaler.unscale_(opt)
                found = self.scaler._per_optimizer_states[id(opt)]["found_inf_per_device"]
                if sum(float(v.item()) for v in found.values()):
                    for g in opt.param_groups:  # GradScaler.step's skip: no gradient, no update
                        for p in g["params"]:
                            p.grad = None
            except Exception as e:
                self.fail("the GradScaler", e)
        if len(self.ends) < self.config.warmup:
            sq = 0.0
            for g in opt.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        sq += float(p.grad.detach().float().pow(2).sum().item())
            self.grad_norms.append(sq ** 0.5)
        return None

    def _first_optimizer(self, opt) -> None:
        name = type(opt).__name__
        at = f" at {self.optimizer_site}" if self.optimizer_site else ""
        f = self.fixes.get("fused_optimizer")
        if f:
            if "fused" not in opt.defaults:
                f.na(f"{name} has no fused implementation")
            elif all(g.get("fused") for g in opt.param_groups):
                f.na(f"{name}{at} is fused already")
            else:
                for g in opt.param_groups:
                    g["fused"], g["foreach"] = True, False
                opt._step_supports_amp_scaling = True
                f.ok(f"{name}(..., fused=True){at}")
        f = self.fixes.get("foreach_optimizer")
        if f:
            if "foreach" not in opt.defaults:
                f.na(f"{name} has no foreach implementation")
            elif all(g.get("foreach") or g.get("fused") for g in opt.param_groups):
                f.na(f"{name}{at} uses foreach (or fused) already")
            else:
                for g in opt.param_groups:
                    g["foreach"] = True
                f.ok(f"{name}(..., foreach=True){at}")

    def on_opt_post(self, opt, args, kwargs):
        if opt is not self.optimizer:
            return
        torch = self.torch
        if self.scaler is not None and self._scaled:
            try:
                self.scaler.update()
            except Exception as e:
                self.fail("the GradScaler", e)
            self._scaled = False
        now = time.perf_counter()
        self.ends.append(now)
        n = len(self.ends)
        w = self.config.warmup
        if n <= w:
            self.losses.append(sum(self._step_losses) / len(self._step_losses) if self._step_losses else float("nan"))
            self._step_losses = []
        if n == w:
            self._decide()
            if self.fixes and not any(f.applicable for f in self.fixes.values()):
                self._end()  # nothing of this candidate can act: no point timing it
            if self.device_type == "cuda":
                try:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                except Exception:
                    pass
            self.ends[-1] = time.perf_counter()  # the decision and the reset are ours, not the step's
        elif n >= w + self.config.steps:
            if self.device_type == "cuda":
                torch.cuda.synchronize()
                self.ends[-1] = time.perf_counter()
            self.finished = True
            self._end()

    def _decide(self) -> None:
        """At the end of the warm-up: every fix still undecided is told why it could not act."""
        if self.top is None:
            for f in self.fixes.values():
                if f.name in ("amp_bf16", "amp_fp16", "compile", "channels_last", "checkpointing", "cudnn_benchmark",
                              "tf32"):
                    f.na("no top-level module with parameters was called before the optimizer's step")
        for key in ("loader_workers", "pin_memory", "persistent_workers", "prefetch"):
            f = self.fixes.get(key)
            if f:
                f.na("no torch DataLoader: the script built none before its first steps")
        f = self.fixes.get("set_to_none")
        if f:
            if self.zero_grad_false:
                f.ok(f"zero_grad(set_to_none=True) at {self.zero_grad_false}")
            else:
                f.na("zero_grad already sets the gradients to None (set_to_none=True is the default since torch 2.0)")
        for key in ("cudnn_benchmark", "tf32"):
            f = self.fixes.get(key)
            if f and f.applicable is None:
                torch = self.torch
                if key == "cudnn_benchmark":
                    if not torch.backends.cudnn.benchmark:  # the script turned it off again after our start
                        f.na("the script sets torch.backends.cudnn.benchmark = False itself: set it to True there")
                    else:
                        f.ok("torch.backends.cudnn.benchmark = True at the start of the script")
                else:
                    cap = torch.cuda.get_device_capability() if self.cuda else (0, 0)
                    if not torch.backends.cuda.matmul.allow_tf32:
                        f.na("the script sets torch.backends.cuda.matmul.allow_tf32 = False itself: set it to True "
                             "there")
                    elif cap < (8, 0):
                        f.na(f"this GPU (compute capability {cap[0]}.{cap[1]}) has no TF32 tensor cores (8.0 and up)")
                    else:
                        f.ok("torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True at "
                             "the start of the script")
        for f in self.fixes.values():
            f.na("it found nothing to act on in this script")

    def _end(self) -> None:
        """Write what was measured and end the script at this step boundary (SystemExit: its finally blocks and
        atexit run); a script that swallows it is ended at its next step."""
        if self.ended_by_us:
            self.write()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        self.ended_by_us = True
        self.write()
        raise SystemExit(0)


def install(torch, run_dir: str, protocol) -> Guest:
    """Put the candidate in place in this process (before the script has built anything: right after torch's import)."""
    config = protocol.TrialConfig.read(run_dir)
    g = Guest(torch, run_dir, protocol, config)
    import atexit

    from torch.nn.modules import module as nn_module
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    g.handles.append(nn_module.register_module_forward_pre_hook(g.forward_pre))
    g.handles.append(nn_module.register_module_forward_hook(g.forward_post, always_call=True))
    g.handles.append(register_optimizer_step_pre_hook(g.on_opt_pre))
    g.handles.append(register_optimizer_step_post_hook(g.on_opt_post))
    g.patch(torch.Tensor, "backward", g.backward_wrapper(torch.Tensor.backward))
    g.patch(torch.optim.Optimizer, "zero_grad", g.zero_grad_wrapper(torch.optim.Optimizer.zero_grad))
    g.patch(torch.nn.Module, "zero_grad", g.zero_grad_wrapper(torch.nn.Module.zero_grad))
    g.patch(torch.optim.Optimizer, "__init__", g.optimizer_init_wrapper(torch.optim.Optimizer.__init__))
    g.patch(torch.utils.data.DataLoader, "__init__", g.dataloader_init(torch.utils.data.DataLoader.__init__))
    if "cudnn_benchmark" in g.fixes and g.cuda:
        if torch.backends.cudnn.benchmark:
            g.fixes["cudnn_benchmark"].na("the script sets torch.backends.cudnn.benchmark itself")
        torch.backends.cudnn.benchmark = True
    if "tf32" in g.fixes and g.cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def at_exit():
        g.write()
        g.uninstall()

    atexit.register(at_exit)
    g.at_exit = at_exit  # tests that install the guest in their own process take it off again
    return g
