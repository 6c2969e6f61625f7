"""Markdown and HTML reports from a checklist result built on hand-written facts."""

import re

from diagnostics.analyses.checklist.job import build_result
from diagnostics.analyses.checklist.report import build_markdown
from diagnostics.render.html import build_report
from tests.checklist.sample_facts import healthy, set_path


def result():
    facts = set_path(healthy(), "measured.profile.tensor_core_kernels", [])
    facts = set_path(facts, "forward.hidden_saturating", ["<script>alert(1)</script>"])
    return build_result(facts, "toy (sample)", "cuda:0")


def test_markdown_lists_every_finding_by_category_with_score():
    r = result()
    md = build_markdown(r)
    for f in r.findings:
        assert f"`{f.id}`" in md
    for cat in ("Model design", "Memory", "Compute", "Data pipeline", "Deployment"):
        assert f"## {cat}" in md
    assert f"{r.score:.0f} / 100" in md
    assert "❌ fail" in md and "no Tensor Core kernel" in md
    assert "`DATALOADER_FRACTION_MAX` | 0.05" in md


def test_html_is_the_shared_report_by_category_self_contained_and_escaped():
    r = result()
    page = build_report("checklist", r, "checklist")
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js is inlined, nothing is fetched
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Tensor Cores used where eligible" in page
    # One section per category that has applicable findings, in the registry's order.
    heads = re.findall(r"<h2[^>]*>([^<]+)</h2>", page)
    cats = [c for c in ("Model design", "Memory", "Compute", "Data pipeline", "Deployment") if c in heads]
    assert cats and [h for h in heads if h in cats] == cats
    failing = [f for f in r.findings if f.status == "fail"]
    assert failing and all(f.evidence.split("<")[0][:30] in page for f in failing)
