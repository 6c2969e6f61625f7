"""The operators an uploaded graph calls, and the ones server-safe mode refuses.

A TorchScript archive or a torch.export program is code: its graph can call operators that read
or write files (``aten::save``, ``aten::from_file``), talk to other processes or hosts (the
``c10d`` collectives, RPC) or share memory with them, and loading a TorchScript archive already
runs code (every ``__setstate__`` of its objects). So in server-safe mode the archive is inspected
*before* anything in it runs, against an allow-list: ``inspect_torchscript_archive`` parses every
code file of the archive (never compiled, never run) and checks every call in every method,
``__setstate__`` included, and the classes its pickles create; ``inspect_export_archive`` reads the
program's JSON and checks every node's target and every operator passed as an argument, in every
subgraph. Allowed: operators of ATen, prims, TorchScript's primitives and quantized kernels
(``ALLOWED_NAMESPACES``, minus ``REFUSED_OPS``), known-safe higher-order operators and pure Python
functions (``SAFE_HIGHER_ORDER``, ``SAFE_FUNCTIONS``); anything else is refused (TrustError) by
name and place. After loading, ``check_torchscript`` / ``check_exported`` walk the loaded graphs
the same way (every method of every submodule, nested blocks, fork subgraphs and inlined calls;
every callable argument). This is defence in depth: the job sandbox already keeps such an operator
away from the server's files and network.
"""

from __future__ import annotations

import ast
import json
import pickletools
import zipfile

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
#: Operator namespaces a graph may call in safe mode (an operator named in REFUSED_OPS still is not).
ALLOWED_NAMESPACES = ("aten", "prim", "prims", "quantized", "_quantized", "quantized_decomposed")
#: torch.export higher-order operators known to only run the subgraphs and operators they are given
#: (those are checked too): ``torch.ops.higher_order.<name>``.
SAFE_HIGHER_ORDER = ("cond", "map_impl", "while_loop", "scan", "associative_scan", "wrap_with_set_grad_enabled",
                     "wrap_with_autocast", "auto_functionalized", "auto_functionalized_v2", "invoke_subgraph",
                     "with_effects", "run_const_graph", "flex_attention", "flex_attention_backward")
#: Plain functions a torch.export graph may call (shape arithmetic, item access): they only compute.
SAFE_FUNCTIONS = frozenset(
    [f"_operator.{n}" for n in ("getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos",
                                "abs", "and_", "or_", "xor", "invert", "not_", "lshift", "rshift", "eq", "ne", "lt",
                                "le", "gt", "ge", "truth", "index")]
    + [f"torch.{n}" for n in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum",
                              "_sym_sqrt")])
#: Python builtins that TorchScript's serialized code calls (TorchScript's own, not Python's).
TORCHSCRIPT_BUILTINS = frozenset((
    "len", "int", "float", "bool", "str", "complex", "range", "isinstance", "annotate", "uninitialized",
    "unchecked_cast", "getattr", "hasattr", "print", "min", "max", "abs", "round", "divmod", "enumerate", "zip",
    "list", "dict", "tuple", "hash", "ord", "chr", "hex", "oct", "bin", "all", "any", "sum", "sorted", "reversed",
    "fork", "wait", "iter", "next", "pow", "id", "Tensor", "Optional", "List", "Dict", "Tuple", "Future", "Any",
    "NoneType", "Union"))
#: Pickle members of a TorchScript archive that torch.jit.load reads (code/*.debug_pkl hold source ranges).
_TORCHSCRIPT_PICKLES = ("data.pkl", "constants.pkl")

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


# A constant whose type cannot be read: nothing about it can be checked, so it is refused, never skipped.
UNREADABLE_CLASS = "<a script object whose type cannot be read>"


def _class_refusal(type_name: str) -> str | None:
    if UNREADABLE_CLASS in type_name:  # called with "class <name>"
        return "its type could not be read, so the allow-list cannot be checked"
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


def serialized_target(target) -> str:
    """How torch.export writes a call target: 'torch.ops.aten.add.Tensor', 'torch.ops.higher_order.cond',
    '_operator.getitem', 'torch.sym_float', 'torch.export.custom_ops.<fn>' (what target_verdict judges)."""
    import torch

    if isinstance(target, torch._ops.OpOverload):
        return f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"torch.ops.{target._qualified_op_name.replace('::', '.')}.default"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"torch.ops.higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    return f"{'_operator' if module == 'operator' else module}.{getattr(target, '__name__', repr(target))}"


def exported_calls(ep) -> list[tuple[str, str]]:
    """(serialized target, where) of every node target and every callable passed as an argument,
    over the program and its subgraphs (cond, map...)."""
    import torch

    found: list[tuple[str, str]] = []
    for name, gm in ep.graph_module.named_modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            found.append((serialized_target(node.target), f"graph {name or 'main'}"))

            def arg(a, node=node):
                if callable(a) and not isinstance(a, (torch.fx.Node, torch.nn.Module, type)):
                    found.append((serialized_target(a), f"graph {name or 'main'}, an argument of node {node.name}"))
                return a

            torch.fx.node.map_aggregate((node.args, node.kwargs), arg)
    return found


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
            except Exception as e:  # refused by _class_refusal: what cannot be read cannot be allowed
                found.setdefault(f"class {UNREADABLE_CLASS}", f"constant {name} ({type(e).__name__}: {e})")
    return found


def check_exported(ep, file_name: str) -> None:
    """Raise TrustError naming the first refused operator of a loaded ExportedProgram: a refused one
    by name (as before loading), then any target or callable argument off the allow-list."""
    _raise_first(exported_ops(ep), file_name)
    for target, where in exported_calls(ep):
        why = target_verdict(target)
        if why:
            raise TrustError(f"{file_name} calls {_shown(target)} ({why}) in {where}; server-safe mode refuses models "
                             "whose graph reads or writes files, uses the network or talks to other processes, and "
                             "any call outside its allow-list")


# ------------------------------------------------------------------------------------ before loading
class _Refused(Exception):
    def __init__(self, what: str, why: str, where: str, detail: str = ""):
        super().__init__(what)
        self.what, self.why, self.where, self.detail = what, why, where, detail


def _refuse(file_name: str, r: _Refused) -> TrustError:
    return TrustError(f"{file_name} calls {r.what} ({r.why}) in {r.where}; server-safe mode refuses models whose graph "
                      "reads or writes files, uses the network or talks to other processes, and any call outside its "
                      f"allow-list ({r.detail + ': ' if r.detail else ''}checked before anything in the archive ran)")


def _shown(target: str) -> str:
    """'torch.ops.aten.save.default' -> 'aten::save' (as the messages after loading say it)."""
    parts = target.split(".")
    if target.startswith("torch.ops.") and len(parts) >= 4 and parts[2] != "higher_order":
        return f"{parts[2]}::{parts[3]}"
    return target


def _op_verdict(namespace: str, name: str) -> str | None:
    """Why ``namespace::name`` is refused, or None when the allow-list has it."""
    why = refusal(f"{namespace}::{name}")
    if why:
        return why
    if namespace not in ALLOWED_NAMESPACES:
        return f"an operator of {namespace!r}, outside the allow-list"
    return None


_CLASSES = "__torch__.torch.classes."


def _custom_class_verdict(fqn: str) -> str | None:
    """Why a TorchScript custom class ('__torch__.torch.classes.<ns>.<Class>') is refused, or None
    (quantized packed parameters are allowed); None for anything else."""
    if not fqn.startswith(_CLASSES):
        return None
    namespace = fqn[len(_CLASSES):].split(".")[0]
    if namespace in ALLOWED_NAMESPACES:
        return None
    return REFUSED_CLASS_NAMESPACES.get(namespace, f"a custom class of {namespace!r}, outside the allow-list")


def _aten_has(name: str) -> bool:
    import torch

    try:
        getattr(torch.ops.aten, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def _dotted(node) -> str | None:
    """'a.b.c' for a Name or a chain of Attributes on one, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


class _CodeCheck(ast.NodeVisitor):
    """Every call of one TorchScript code file, against the allow-list (see inspect_torchscript_archive)."""

    def __init__(self, member: str, defined: set, classes: set):
        self.member, self.defined, self.classes = member, defined, classes
        self.scope: list[str] = []
        self.aliases: dict[str, str] = {}

    def _refused(self, what: str, why: str, node) -> _Refused:
        return _Refused(what, why, ".".join(self.scope) or "module level", f"{self.member}, line {node.lineno}")

    def visit_ClassDef(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node):
        self.scope.append(node.name)
        saved, self.aliases = self.aliases, dict(self.aliases)
        self.generic_visit(node)
        self.aliases = saved
        self.scope.pop()

    def visit_Assign(self, node):
        target = _dotted(node.value)
        for t in node.targets:
            if isinstance(t, ast.Name) and target is not None:
                self.aliases[t.id] = target
        self.generic_visit(node)

    def visit_Call(self, node):
        self._check(node.func, node)
        self.generic_visit(node)

    def _check(self, func, node) -> None:
        name = _dotted(func)
        if name is None:
            if isinstance(func, ast.Attribute):
                return self._method(func.attr, node)
            raise self._refused("a call whose target cannot be named", "not on the allow-list", node)
        for _ in range(10):  # a local name bound to a function: what it names
            if "." in name or name not in self.aliases:
                break
            name = self.aliases[name]
        head, _, rest = name.partition(".")
        if not rest:
            if name in TORCHSCRIPT_BUILTINS or name in self.defined or name in self.classes:
                return
            raise self._refused(name, "not a TorchScript builtin nor defined in the archive", node)
        if head == "torch":
            if "." in rest or not _aten_has(rest):
                raise self._refused(name, "not an ATen operator", node)
            why = _op_verdict("aten", rest)
            if why:
                raise self._refused(f"aten::{rest}", why, node)
            return
        if head == "ops":
            namespace, _, op = rest.partition(".")
            why = _op_verdict(namespace, op.split(".")[0]) if op else "not an operator"
            if why:
                raise self._refused(f"{namespace}::{op}", why, node)
            return
        if head == "__torch__":
            if name.startswith(_CLASSES):
                why = _custom_class_verdict(name)
                if why:
                    raise self._refused(f"torch.classes.{name[len(_CLASSES):]}", why, node)
                return
            if name.rsplit(".", 1)[-1] in self.defined or name in self.classes:
                return
            raise self._refused(name, "not defined in the archive", node)
        self._method(name.rsplit(".", 1)[-1], node)  # value.method(...): a local, self, an attribute

    def _method(self, method: str, node) -> None:
        """``value.method(...)``: a method of a class in the archive, or an ATen / prim method."""
        why = refusal(f"aten::{method}") or refusal(f"prim::{method}")
        if why:
            raise self._refused(f"aten::{method}", why, node)
        if method in self.defined or _aten_has(method):
            return
        raise self._refused(f".{method}()", "a method neither defined in the archive nor an ATen operator", node)


def _pickle_classes(data: bytes) -> list[str]:
    """The classes a pickle names (GLOBAL opcodes), without unpickling it."""
    out = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL" and isinstance(arg, str):
                out.append(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL":
                out.append("<a class named on the stack>")
    except Exception as e:  # a malformed pickle: torch.jit.load would fail on it anyway
        raise TrustError(f"its pickled data cannot be read ({type(e).__name__}: {e})") from None
    return out


def inspect_torchscript_archive(path, file_name: str) -> None:
    """Before torch.jit.load: refuse (TrustError, naming the call and where it is) a TorchScript archive
    whose code calls anything off the allow-list, in any method of any class (``__setstate__``,
    which loading runs, included), or whose pickles create a custom class outside the allow-list."""
    with zipfile.ZipFile(path) as z:
        members = [n for n in z.namelist() if not n.endswith("/")]
        code = {n: z.read(n).decode("utf-8", "replace") for n in members if "/code/" in n and n.endswith(".py")}
        pickles = {n: z.read(n) for n in members if n.rsplit("/", 1)[-1] in _TORCHSCRIPT_PICKLES}
    trees = {}
    for member, text in code.items():
        try:
            trees[member] = ast.parse(text)
        except SyntaxError as e:
            raise TrustError(f"{file_name} has TorchScript code that cannot be read ({member}, line {e.lineno}): "
                             "server-safe mode refuses what it cannot check") from None
    defined, classes = set(), set()
    for member, tree in trees.items():
        module = "__torch__" + member.split("/code/__torch__", 1)[-1][:-3].replace("/", ".")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                defined.add(node.name)
            elif isinstance(node, ast.ClassDef):
                classes.update({node.name, f"{module}.{node.name}"})
    for member, tree in trees.items():
        short = member.split("/", 1)[-1]
        try:
            _CodeCheck(short, defined, classes).visit(tree)
        except _Refused as r:
            raise _refuse(file_name, r) from None
    for member, data in pickles.items():
        for cls in _pickle_classes(data):
            why = _custom_class_verdict(cls)
            if why:
                raise _refuse(file_name, _Refused(f"torch.classes.{cls[len(_CLASSES):]}", why, "the archive's data",
                                                  member.split("/", 1)[-1]))
            if cls.startswith("<"):
                raise _refuse(file_name, _Refused(cls, "not readable without unpickling", "the archive's data",
                                                  member.split("/", 1)[-1]))


def target_verdict(target: str) -> str | None:
    """Why a serialized torch.export call target ('torch.ops.aten.add.Tensor', '_operator.getitem',
    'torch.ops.higher_order.cond', ...) is refused, or None when the allow-list has it."""
    if target in SAFE_FUNCTIONS or (target.startswith("math.") and target.count(".") == 1):
        return None
    if target.startswith("torch.ops.higher_order."):
        name = target.split(".")[3]
        return None if name in SAFE_HIGHER_ORDER else f"a higher-order operator outside the allow-list"
    if target.startswith("torch.ops."):
        parts = target.split(".")
        if len(parts) < 4:
            return "not an operator"
        return _op_verdict(parts[2], parts[3])
    return "a Python callable, not an operator"


def _walk_export(value, where: str, found: list) -> None:
    """Every node target, operator argument and custom object in a serialized program (nested graphs too)."""
    if isinstance(value, dict):
        target = value.get("target")
        if isinstance(target, str) and isinstance(value.get("inputs"), list):
            node = value.get("name") or _shown(target)
            found.append((target, where, f"node {node}"))
            where_args = f"{where}, an argument of node {node}"
            for arg in value["inputs"]:
                _walk_export(arg, where_args, found)
            for k, v in value.items():
                if k != "inputs":
                    _walk_export(v, where, found)
            return
        op = value.get("as_operator")
        if isinstance(op, str):
            found.append((op, where, ""))
        obj = value.get("as_custom_obj")
        if isinstance(obj, dict) and isinstance(obj.get("class_fqn"), str):
            found.append(("class " + obj["class_fqn"], where, ""))
        graph = value.get("as_graph")
        if isinstance(graph, dict):
            _walk_export(graph.get("graph"), f"subgraph {graph.get('name', '?')} (in {where})", found)
            value = {k: v for k, v in value.items() if k != "as_graph"}
        for k, v in value.items():
            _walk_export(v, where, found)
    elif isinstance(value, list):
        for v in value:
            _walk_export(v, where, found)


def inspect_export_archive(path, file_name: str) -> None:
    """Before torch.export.load: refuse (TrustError, naming the target and where it is) a .pt2 whose
    programs call anything off the allow-list, as a node's target or as an operator passed as an
    argument (a higher-order operator's subgraphs included), or hold a custom object outside it."""
    with zipfile.ZipFile(path) as z:
        models = {n: z.read(n) for n in z.namelist() if "/models/" in n and n.endswith(".json")}
    if not models:
        raise TrustError(f"{file_name} holds no program this version can check (no models/*.json): server-safe mode "
                         "refuses what it cannot check")
    for member, data in models.items():
        try:
            program = json.loads(data)
        except ValueError as e:
            raise TrustError(f"{file_name}: {member} is not JSON ({e})") from None
        found: list = []
        _walk_export(program, "graph main", found)
        for target, where, node in found:
            detail = f"{member.split('/', 1)[-1]}" + (f", {node}" if node else "")
            if target.startswith("class "):
                fqn = target[len("class "):]
                why = _custom_class_verdict(fqn if fqn.startswith(_CLASSES) else _CLASSES + fqn)
                if why:
                    raise _refuse(file_name, _Refused(fqn, why, where, detail))
                continue
            why = target_verdict(target)
            if why:
                raise _refuse(file_name, _Refused(_shown(target), why, where, detail))
