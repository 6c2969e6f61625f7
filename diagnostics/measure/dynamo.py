"""What torch.compile's front end (Dynamo) makes of a model: graphs, graph breaks, recompiles.

``explain(model, inputs)`` runs ``torch._dynamo.explain`` (Dynamo only, no backend compile) and
returns plain data: the graphs (ops per graph, the modules each covers), and each graph break
with Dynamo's reason kept whole, the user's ``file.py:LINE`` and code line (the innermost frame
outside torch), how many times it was hit, and a suggested rewrite for the common causes.
``watch_recompiles()`` collects Dynamo's recompile messages (which guard failed and why) while a
compiled model runs. The compile analysis and the checklist's graph-break rule read the same facts.
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager

import torch

from diagnostics.inputs import call as call_model

#: Common causes of a break (matched on Dynamo's reason, lower-cased) -> what to write instead.
SUGGESTIONS = (
    (("tensor.item()", "item()", "_local_scalar_dense", "data-dependent", "data dependent"),
     "a Python value read from a tensor (Tensor.item(), bool(t), if t > 0): keep it a tensor (torch.where, "
     "torch.cond) or set torch._dynamo.config.capture_scalar_outputs = True"),
    (("numpy", "tensor.numpy", "np."),
     "numpy on tensor data leaves the graph: use the torch op of the same name (torch.tanh, torch.clip...)"),
    (("builtin operator `print`", "print"),
     "print in forward: remove it, or log outside the compiled region (torch._dynamo.config.reorderable_logging_functions)"),
    (("tolist", "list(", "iterating"),
     "converting a tensor to Python lists: keep the computation in tensor ops"),
    (("c extension", "pybind", "non-torch", "unsupported builtin", "skipfiles", "skip_files", "marked as skipped",
      "torch.compiler.disable"),
     "a call Dynamo cannot look into (a C extension or a skipped function): wrap it in torch.library.custom_op, "
     "or move it outside the compiled module"),
    (("generator", "yield"), "a generator in forward: return a list or tuple instead"),
    (("inline", "recursion"), "deep or recursive Python: unroll it or compile the inner module instead"),
)


def suggestion(reason: str) -> str | None:
    r = reason.lower()
    for keys, advice in SUGGESTIONS:
        if any(k in r for k in keys):
            return advice
    return None


def is_torch_frame(filename: str) -> bool:
    f = filename.replace(os.sep, "/")
    return "/torch/" in f or "/site-packages/torch" in f or f.startswith("<")


def _user_frame(stack) -> tuple[str | None, str | None]:
    """(file.py:LINE, the code line) of the innermost frame outside torch, else of the innermost."""
    frames = list(stack or [])
    for fs in reversed(frames):
        if not is_torch_frame(fs.filename):
            return f"{os.path.basename(fs.filename)}:{fs.lineno}", (fs.line or "").strip() or None
    if frames:
        fs = frames[-1]
        return f"{os.path.basename(fs.filename)}:{fs.lineno}", (fs.line or "").strip() or None
    return None, None


def _graph_modules(gm) -> list[str]:
    """The user modules a captured graph's ops come from (nn_module_stack), outermost first."""
    seen: dict[str, None] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue  # parameters (get_attr) come first in a graph, out of execution order
        stack = node.meta.get("nn_module_stack") or {}
        for path, _ in stack.values():
            name = re.sub(r"^L\['self'\]\.?|^L__self___?", "", str(path)).replace("_modules['", "").replace("']", "")
            if name:
                seen.setdefault(name, None)
    names = list(seen)
    # only the outermost of nested names: "enc" covers "enc.lin"
    return [n for n in names if not any(n != o and n.startswith(o + ".") for o in names)][:8]


def _op_count(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def explain(model, inputs: tuple) -> dict:
    """Dynamo's view of one forward: graphs, graph breaks (grouped by reason and place), op counts.

    The model runs once eagerly first: a freshly built model's first call may set state up in Python
    (a lazily computed scale or cache, a parametrization's first evaluation) that Dynamo would trace
    once as a graph break no later call has. Only reasons Dynamo marks as graph breaks are listed (a
    frame's normal end is not one)."""
    import torch._dynamo

    call_model(model, inputs)
    torch._dynamo.reset()
    out = call_model(torch._dynamo.explain(model), inputs)
    breaks: dict[tuple, dict] = {}
    for br in out.break_reasons:
        if not getattr(br, "graph_break", True):
            continue
        reason = str(br.reason).strip()
        location, code = _user_frame(getattr(br, "user_stack", None))
        key = (reason.splitlines()[0] if reason else "", location)
        row = breaks.get(key)
        if row is None:
            breaks[key] = {"reason": reason, "location": location, "code": code, "count": 1,
                           "suggestion": suggestion(reason)}
        else:
            row["count"] += 1
    graphs = [{"index": i, "ops": _op_count(g), "modules": _graph_modules(g)} for i, g in enumerate(out.graphs)]
    torch._dynamo.reset()
    return {"graph_count": int(out.graph_count), "graph_break_count": int(out.graph_break_count),
            "op_count": int(out.op_count), "graphs": graphs, "graph_breaks": list(breaks.values())}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:
            return
        if "Recompiling function" in msg:
            self.messages.append(msg)


def parse_recompile(message: str) -> dict:
    """One recompile message -> the function and its failed guards, with advice for shape guards."""
    lines = [l.strip() for l in message.splitlines() if l.strip()]
    head = lines[0] if lines else message
    guards = [l[2:].strip() for l in lines[1:] if l.startswith("- ")]
    fn = re.search(r"Recompiling function (\S+) in (\S+)", head)
    text = " ".join(guards).lower()
    if "size mismatch" in text or "stride mismatch" in text:
        advice = ("the input shape changed: mark the dimension dynamic (torch._dynamo.mark_dynamic(x, 0)) or compile "
                  "with dynamic=True; or pad inputs to a few fixed sizes")
    elif "dtype mismatch" in text or "device mismatch" in text:
        advice = "the input dtype or device changed: cast inputs to one dtype / device before the compiled call"
    elif "requires_grad mismatch" in text:
        advice = "the same compiled module is called with and without gradients: compile one for each, or keep one mode"
    elif "___check_obj_id" in text or "id_match" in text or "== " in text:
        advice = ("a Python value the graph depends on changed: pass it as a tensor, or mark it "
                  "torch._dynamo.config.force_parameter_static_shapes / make it a constant")
    else:
        advice = None
    return {"function": fn.group(1) if fn else None, "where": fn.group(2) if fn else None,
            "guard_failures": guards, "advice": advice}


@contextmanager
def watch_recompiles():
    """``with watch_recompiles() as found:`` -> ``found`` (a list) gets one parsed row per recompile."""
    handler = _Collect()
    logger = logging.getLogger("torch._dynamo")
    found: list[dict] = []
    torch._logging.set_logs(recompiles=True)
    logger.addHandler(handler)
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()
        found.extend(parse_recompile(m) for m in handler.messages)


def compile_seconds() -> list[float]:
    """Dynamo's wall time per compiled frame so far (torch._dynamo.utils.compilation_time_metrics)."""
    from torch._dynamo.utils import compilation_time_metrics

    return [float(t) for t in compilation_time_metrics.get("_compile.compile_inner", [])]


# ----------------------------------------------------------------------------- inductor on an empty cache
#: Seconds the compiler may take to accept the vector ISA's flags (a tiny translation unit).
ISA_CHECK_TIMEOUT_S = 30


def _compiler_accepts(flags: str) -> bool:
    """Does the C++ compiler inductor uses compile a file with ``flags`` (the vector ISA's -m flags)?"""
    import subprocess

    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        done = subprocess.run([get_cpp_compiler(), *flags.split(), "-fsyntax-only", "-x", "c++", "-"],
                              input=b"#include <immintrin.h>\nint main() { return 0; }\n", capture_output=True,
                              timeout=ISA_CHECK_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@contextmanager
def empty_cache_codegen():
    """TorchInductor's CPU code generation without the one-off work an empty compiler cache costs.

    A job's compiler cache is private and starts empty (diagnostics.sandbox), so inductor's first CPU
    compile of every job paid for two things a persistent cache pays once per machine: the vector-ISA
    probe (ATen's vector headers compiled and loaded once per ISA: 6-15 s of a small MLP's compile)
    and a precompiled header (5-13 s), which only pays off over many kernels. Here the ISA comes from
    the CPU's flags (what the probe also requires), kept only when the compiler accepts its flags (else
    the probe runs as before), and kernels are compiled without the precompiled header: the same
    generated code, the same kernels. Restored on exit."""
    import torch._inductor.config as config
    from torch._inductor import cpu_vec_isa

    before = (config.cpp.vec_isa_ok, config.cpp_cache_precompile_headers)
    config.cpp_cache_precompile_headers = False
    if config.cpp.vec_isa_ok is None:
        config.cpp.vec_isa_ok = True
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        isa = cpu_vec_isa.pick_vec_isa()
        if isa and not _compiler_accepts(isa.build_arch_flags()):
            config.cpp.vec_isa_ok = None  # let inductor probe as it does by default
            cpu_vec_isa.valid_vec_isa_list.cache_clear()
    try:
        yield
    finally:
        config.cpp.vec_isa_ok, config.cpp_cache_precompile_headers = before
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
