"""The thresholds the checklist and an attached run's rules both judge a training step by are declared once
(diagnostics.findings): the attach rules read the checklist's constants, never numbers of their own."""

from __future__ import annotations

import ast
import inspect

import pytest

import diagnostics.findings as findings
from diagnostics.analyses.attach import rules as attach_rules
from diagnostics.analyses.checklist import design_rules, thresholds
from diagnostics.analyses.checklist import rules as checklist_rules

SHARED = ("DATALOADER_FRACTION_MAX", "COMMUNICATION_FRACTION_MAX", "GPU_UTILIZATION_MIN", "LAUNCH_BOUND_MIN_OPS",
          "LAUNCH_BOUND_MEDIAN_US", "PREFETCH_FACTOR_MIN")
#: The attach rules' names for them (a real run's shares), and how each follows from the checklist's.
ATTACH_NAMES = {"DATA_WAIT_SHARE_MAX": "DATALOADER_FRACTION_MAX", "COMM_SHARE_MAX": "COMMUNICATION_FRACTION_MAX",
                "LAUNCH_BOUND_MIN_KERNELS": "LAUNCH_BOUND_MIN_OPS", "LAUNCH_BOUND_MEDIAN_US": "LAUNCH_BOUND_MEDIAN_US",
                "PREFETCH_FACTOR_MIN": "PREFETCH_FACTOR_MIN"}


def _numbers_assigned(source: str, names) -> list[str]:
    """The names in ``names`` that ``source`` assigns a number literal to (a threshold declared there)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, (int, float)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [t.id for t in targets if isinstance(t, ast.Name) and t.id in names]
    return out


def test_the_attach_rules_read_the_checklists_thresholds():
    for name in SHARED:
        assert getattr(thresholds, name) == getattr(findings, name), name
    for attach_name, checklist_name in ATTACH_NAMES.items():
        assert getattr(attach_rules, attach_name) == getattr(thresholds, checklist_name), attach_name
    assert attach_rules.GPU_IDLE_SHARE_MAX == pytest.approx(1 - thresholds.GPU_UTILIZATION_MIN)
    # the values the attach rules had before they read them: their behaviour is unchanged
    assert dict((n, v) for n, v, _ in attach_rules.THRESHOLDS) == {
        "DATA_WAIT_SHARE_MAX": 0.05, "HOST_SHARE_WARN": 0.30, "HOST_SHARE_FAIL": 0.50, "SYNC_MS_WARN": 0.1,
        "SYNC_SHARE_FAIL": 0.10, "COMM_SHARE_MAX": 0.10, "GPU_IDLE_SHARE_MAX": 0.50, "LAUNCH_BOUND_MIN_KERNELS": 100,
        "LAUNCH_BOUND_MEDIAN_US": 20.0, "GPU_IDLE_SHARE_LAUNCH": 0.20, "PREFETCH_FACTOR_MIN": 2}
    shown = {n: v for n, v, _ in thresholds.THRESHOLDS}
    assert {n: shown[n] for n in SHARED} == {n: getattr(findings, n) for n in SHARED}  # still listed, for the UI


def test_neither_rules_module_declares_a_shared_threshold_of_its_own():
    names = set(SHARED) | set(ATTACH_NAMES) | {"GPU_IDLE_SHARE_MAX"}
    assert _numbers_assigned(inspect.getsource(attach_rules), names) == []
    for module in (thresholds, checklist_rules, design_rules):  # where the checklist's thresholds and rules are
        assert _numbers_assigned(inspect.getsource(module), names) == [], module.__name__
    assert sorted(_numbers_assigned(inspect.getsource(findings), names)) == sorted(SHARED)


def test_the_declaration_check_sees_a_planted_number():
    assert _numbers_assigned("COMM_SHARE_MAX = 0.1\nPREFETCH_FACTOR_MIN: int = 2\nX = 3\nLAUNCH_BOUND_MIN_KERNELS = Y\n",
                             set(ATTACH_NAMES) | {"COMM_SHARE_MAX"}) == ["COMM_SHARE_MAX", "PREFETCH_FACTOR_MIN"]
