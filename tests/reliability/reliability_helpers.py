"""Helpers for the reliability tests: user models written as Python files, and a store snapshot."""

import textwrap
from pathlib import Path

from diagnostics import ModelSpec

GOOD_MODEL = """
import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    return nn.Linear(4, 3)

def example_inputs():
    return (torch.ones(2, 4),)
"""


def model_file(folder: Path, name: str, forward: str, imports: str = "") -> Path:
    """A Python-file model whose forward(self, x) body is ``forward`` (indented for you)."""
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    text = (f"import torch\nfrom torch import nn\n{textwrap.dedent(imports)}\n\n"
            f"class UserModel(nn.Module):\n"
            f"    def __init__(self):\n        super().__init__()\n        self.lin = nn.Linear(4, 3)\n\n"
            f"    def forward(self, x):\n{body}\n\n\n"
            "def build_model():\n    return UserModel()\n\n\n"
            "def example_inputs():\n    return (torch.ones(2, 4),)\n")
    path = Path(folder) / name
    path.write_text(text)
    return path


def python_spec(path: Path) -> ModelSpec:
    return ModelSpec(source="python", name=Path(path).name, path=str(path))


def good_spec(folder: Path) -> ModelSpec:
    path = Path(folder) / "good.py"
    path.write_text(GOOD_MODEL)
    return python_spec(path)


def snapshot(store) -> dict:
    """Every stored run, with its result, keyed by id."""
    return {r.id: store.get(r.id).to_dict() for r in store.list(limit=10_000)}


def assert_intact(store, before: dict) -> None:
    """Every run stored before is still there, unchanged."""
    after = snapshot(store)
    for rid, rec in before.items():
        assert rid in after, f"run {rid} disappeared from the store"
        assert after[rid] == rec, f"run {rid} changed: {rec} -> {after[rid]}"


#: The two ways the sandbox confines a job: namespaces of its own (where user namespaces are
#: allowed) and Landlock + seccomp alone (a kernel or container without them; TORCHSCOPE_SANDBOX_NAMESPACES=0).
MODES = ("namespaces", "landlock-only")


def use_mode(monkeypatch, mode: str) -> None:
    """Run this test's jobs sandboxed in ``mode`` (skips where this machine cannot give it)."""
    import pytest

    from diagnostics import sandbox

    if not sandbox.probe().ok:
        pytest.skip(f"no job sandbox here: {sandbox.probe().reason}")
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "1")
    if mode == "landlock-only":
        monkeypatch.setenv(sandbox.NAMESPACES_ENV, "0")
        return
    monkeypatch.delenv(sandbox.NAMESPACES_ENV, raising=False)
    ok, why = sandbox.namespace_support()
    if not ok:
        pytest.skip(f"no user namespaces here: {why}")


#: A model's forward can find its job's artifact folder (an attacker's first step): the runner's
#: AnalysisContext is an object in the same process.
FIND_FOLDER = """
import gc
folder = next(o for o in gc.get_objects() if type(o).__name__ == "AnalysisContext").artifact_dir
"""
