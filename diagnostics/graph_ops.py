"""The operators an uploaded graph calls, and the ones server-safe mode refuses.

A TorchScript archive or a torch.export program is code: its graph can call operators that read
or write files (``aten::save``, ``aten::from_file``), talk to other processes or hosts (the
``c10d`` collectives, RPC) or share memory with them. In server-safe mode ``check_torchscript`` /
``check_exported`` list every operator of the graph before it runs (every method of every
submodule, nested blocks, fork subgraphs and inlined function calls included) and raise TrustError
naming the first refused one and where it is. This is defence in depth: the job sandbox already
keeps such an operator away from the server's files and network.
"""

from __future__ import annotations

from diagnostics.errors import TrustError

#: Operators refused by name -> what they do.
REFUSED_OPS = {
    "aten::save": "writes a file",
    "aten::from_file": "reads a file",
    "debugprims::load_tensor": "reads a file",
    "prim::rpc_async": "calls another process over the network (RPC)",
    "prim::rpc_sync": "calls another process over the network (RPC)",
    "prim::rpc_remote": "calls another process over the network (RPC)",
}
#: Operator namespaces refused whole -> what their operators do.
REFUSED_NAMESPACES = {
    "c10d": "talks to other processes (collectives)",
    "_c10d_functional": "talks to other processes (collectives)",
    "_c10d_functional_autograd": "talks to other processes (collectives)",
    "_dtensor": "talks to other processes (collectives)",
    "symm_mem": "shares memory with other processes",
    "debugprims": "reads a file",
}
#: TorchScript custom classes (``torch.classes.<namespace>``) refused whole.
REFUSED_CLASS_NAMESPACES = {
    "c10d": "a process group or store (network, files)",
    "dist_c10d": "a process group or store (network, files)",
    "dist_rpc": "RPC (network)",
    "dist_autograd": "distributed autograd (network)",
}


def refusal(op: str) -> str | None:
    """Why ``op`` ('aten::save', 'torch.ops.aten.save.default', ...) is refused, or None."""
    name = op
    if name.startswith("torch.ops."):
        parts = name.split(".")
        name = f"{parts[2]}::{parts[3]}" if len(parts) >= 4 else name
    name = name.split(".")[0] if "::" in name else name
    if name in REFUSED_OPS:
        return REFUSED_OPS[name]
    namespace = name.split("::")[0] if "::" in name else ""
    return REFUSED_NAMESPACES.get(namespace)


def _class_refusal(type_name: str) -> str | None:
    marker = "__torch__.torch.classes."
    i = type_name.find(marker)
    while i >= 0:
        namespace = type_name[i + len(marker):].split(".")[0]
        if namespace in REFUSED_CLASS_NAMESPACES:
            return REFUSED_CLASS_NAMESPACES[namespace]
        i = type_name.find(marker, i + 1)
    return None


# ------------------------------------------------------------------------------------ TorchScript
def _walk_graph(graph, found: dict, where: str) -> None:
    """Every node kind of ``graph`` (function calls inlined), its blocks and its subgraphs."""
    import torch

    g = graph.copy()
    torch._C._jit_pass_inline(g)  # calls to script functions and methods become their bodies
    _walk_block(g, found, where)


def _walk_block(block, found: dict, where: str) -> None:
    for node in block.nodes():
        found.setdefault(node.kind(), where)
        for value in list(node.outputs()) + list(node.inputs()):
            type_name = str(value.type())
            if "torch.classes." in type_name:
                found.setdefault(f"class {type_name}", where)
        for inner in node.blocks():
            _walk_block(inner, found, where)
        for attr in node.attributeNames():  # prim::fork and friends keep their body as a subgraph
            kind = node.kindOf(attr)
            if kind == "g":
                _walk_graph(node.g(attr), found, where)
            elif kind == "gs":
                for sub in node.gs(attr):
                    _walk_graph(sub, found, where)


def torchscript_ops(module) -> dict[str, str]:
    """Operator (node kind) -> the first 'Module.method' that calls it, over every method of every submodule."""
    found: dict[str, str] = {}
    for name, sub in module.named_modules():
        c = getattr(sub, "_c", None)
        if c is None:
            continue
        label = getattr(sub, "original_name", type(sub).__name__) + (f" ({name})" if name else "")
        for method in c._method_names():
            _walk_graph(c._get_method(method).graph, found, f"{label}.{method}")
    return found


def _raise_first(found: dict[str, str], file_name: str) -> None:
    for op, where in found.items():
        why = _class_refusal(op) if op.startswith("class ") else refusal(op)
        if why:
            what = op[len("class "):] if op.startswith("class ") else op
            raise TrustError(f"{file_name} calls {what} ({why}) in {where}; server-safe mode refuses models whose "
                             "graph reads or writes files, uses the network or talks to other processes")


def check_torchscript(module, file_name: str) -> None:
    """Raise TrustError naming the first refused operator of a loaded TorchScript module."""
    _raise_first(torchscript_ops(module), file_name)


# ------------------------------------------------------------------------------------ torch.export
def _target_name(target) -> str:
    name = getattr(target, "name", None)
    if callable(name):  # OpOverload / HigherOrderOperator
        try:
            return str(name())
        except Exception:
            pass
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', repr(target))}"


def exported_ops(ep) -> dict[str, str]:
    """Operator -> the graph (module path) that calls it, over the program and its subgraphs (cond, map...)."""
    import torch

    found: dict[str, str] = {}
    for name, gm in ep.graph_module.named_modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            if node.op == "call_function":
                found.setdefault(_target_name(node.target), f"graph {name or 'main'}")
    for name, const in (getattr(ep, "constants", None) or {}).items():
        if isinstance(const, torch.ScriptObject):
            try:
                found.setdefault(f"class {const._type().qualified_name()}", f"constant {name}")
            except Exception:
                pass
    return found


def check_exported(ep, file_name: str) -> None:
    """Raise TrustError naming the first refused operator of a loaded ExportedProgram."""
    _raise_first(exported_ops(ep), file_name)
