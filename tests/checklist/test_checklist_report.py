"""Markdown and HTML reports from a checklist result built on hand-written facts."""

import re

from diagnostics.analyses.checklist import build_result
from diagnostics.checklist.report import build_html, build_markdown
from tests.checklist.sample_facts import healthy, set_path


def result():
    facts = set_path(healthy(), "measured.profile.tensor_core_kernels", [])
    facts = set_path(facts, "forward.hidden_saturating", ["<script>alert(1)</script>"])
    return build_result(facts, "toy (sample)", "cuda:0")


def test_markdown_lists_every_finding_by_category_with_score():
    r = result()
    md = build_markdown(r)
    for f in r["findings"]:
        assert f"`{f['id']}`" in md
    for cat in ("Model design", "Memory", "Compute", "Data pipeline", "Deployment"):
        assert f"## {cat}" in md
    assert f"{r['score']:.0f} / 100" in md
    assert "❌ fail" in md and "no Tensor Core kernel" in md
    assert "`DATALOADER_FRACTION_MAX` | 0.05" in md


def test_html_is_self_contained_and_escaped():
    r = result()
    page = build_html(r)
    assert not re.search(r"https?://", page)
    assert "<script" not in page  # the evidence text is escaped, and no scripts are loaded
    assert "&lt;script&gt;" in page
    assert page.count("<tr>") >= len(r["findings"])
    assert "Tensor Cores used where eligible" in page
