"""Server-safe mode refuses an exported program's script-object constant whose type cannot be read
(it was skipped: what cannot be checked passed the allow-list)."""
import types

import pytest
import torch

from diagnostics import graph_ops
from diagnostics.graph_ops import TrustError, check_exported, exported_ops


class _FakeScriptObject:
    def __init__(self, qualified=None):
        self.qualified = qualified

    def _type(self):
        if self.qualified is None:
            raise RuntimeError("type of this object is not known")
        return types.SimpleNamespace(qualified_name=lambda: self.qualified)


def _program(constants):
    graph_module = types.SimpleNamespace(named_modules=lambda: iter(()))
    return types.SimpleNamespace(graph_module=graph_module, constants=constants)


def test_an_unreadable_constant_type_is_refused_with_its_name(monkeypatch):
    monkeypatch.setattr(torch, "ScriptObject", _FakeScriptObject)
    ep = _program({"weird": _FakeScriptObject(None)})
    assert f"class {graph_ops.UNREADABLE_CLASS}" in exported_ops(ep)
    with pytest.raises(TrustError, match=r"model\.pt2 calls .*type cannot be read.*constant weird.*RuntimeError"):
        check_exported(ep, "model.pt2")


def test_a_readable_allowed_constant_still_passes(monkeypatch):
    monkeypatch.setattr(torch, "ScriptObject", _FakeScriptObject)
    ep = _program({"packed": _FakeScriptObject("__torch__.torch.classes.quantized.LinearPackedParamsBase")})
    assert "class __torch__.torch.classes.quantized.LinearPackedParamsBase" in exported_ops(ep)
    check_exported(ep, "model.pt2")  # quantized packed parameters are on the allow-list
