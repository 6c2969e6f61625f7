"""Activation checkpointing by module name: which modules a model repeats (its blocks), which modules a
list of names or patterns selects, and a scope in which those modules' forwards run under
torch.utils.checkpoint. One definition for the plan (which traces it on fake tensors) and the Memory
analysis (which measures it), so `memory --checkpoint-modules` measures exactly what the plan predicted.
"""

from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from typing import Callable

from torch import nn

from diagnostics.errors import TorchScopeError


def blocks_of(model: nn.Module) -> list[str]:
    """The model's repeated blocks: children of a ModuleList / Sequential that share their class with a
    sibling and hold parameters (transformer layers, ResNet blocks), outermost first, none inside another."""
    names = {m: n for n, m in model.named_modules()}
    found: list[str] = []
    for name, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)):
            continue
        kids = [c for c in m.children() if any(True for _ in c.parameters())]
        classes = [type(c) for c in kids]
        for c in kids:
            if classes.count(type(c)) >= 2:
                found.append(names[c])
    outer = [n for n in found if not any(n != o and n.startswith(o + ".") for o in found)]
    return outer


def select_blocks(model: nn.Module, patterns: str) -> list[str]:
    """Module names matching comma-separated names or fnmatch patterns; TorchScopeError if one matches nothing."""
    names = [n for n, _ in model.named_modules() if n]
    chosen: list[str] = []
    for pat in [p.strip() for p in (patterns or "").split(",") if p.strip()]:
        hits = [n for n in names if n == pat or fnmatch.fnmatchcase(n, pat)]
        if not hits:
            blocks = blocks_of(model)
            raise TorchScopeError(f"checkpoint_modules: no module matches {pat!r}; the model's blocks are "
                                  f"{', '.join(blocks[:6]) + (' ...' if len(blocks) > 6 else '') or '(none found)'}")
        chosen += [h for h in hits if h not in chosen]
    return [n for n in chosen if not any(n != o and n.startswith(o + ".") for o in chosen)]


@contextmanager
def checkpointing(model: nn.Module, names: list[str], on_call: Callable | None = None):
    """Each named module's forward runs under torch.utils.checkpoint (non-reentrant, as recommended):
    its activations are dropped after forward and recomputed in backward. ``on_call(args, kwargs)`` sees
    each call's inputs first (what checkpointing keeps). Undone afterwards: the model is left as it was."""
    from torch.utils.checkpoint import checkpoint

    mods = dict(model.named_modules())
    patched = []
    for name in names:
        m = mods[name]
        inner = m.forward

        def run(*args, _inner=inner, **kwargs):
            if on_call is not None:
                on_call((args, kwargs))
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        m.forward = run
        patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
