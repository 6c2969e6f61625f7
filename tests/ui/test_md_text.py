"""Text from files and runs shown as written (issue 45, item 6): ui.widgets.md_text and units.printable."""

from __future__ import annotations

import markdown_it
import pytest

from diagnostics.units import printable
from ui.widgets import md_text

HOSTILE = ["![x](http://evil.example/a.png)", "[click](javascript:alert(1))", "# heading", ":red[colour]",
           ":material/home:", "$x^2$", "**bold** _it_ `code`", "<img src=x onerror=alert(1)>", "a | b\n---|---",
           "http://evil.example/autolink", "<http://evil.example/angle>", "line\nbreak", "- item", "1. item",
           "> quote", "~~strike~~"]


@pytest.mark.parametrize("name", HOSTILE)
def test_markdown_shows_a_name_as_its_text(name):
    html = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md_text(name))
    assert "<img" not in html and "<a " not in html and "<h1" not in html and "<strong" not in html
    assert "<code" not in html and "<ul" not in html and "<ol" not in html and "<blockquote" not in html
    assert "<table" not in html and "<s>" not in html and "<em" not in html


def test_plain_names_read_the_same_and_controls_are_escapes():
    assert md_text("resnet50 trace_rank0.json") == "resnet50 trace\\_rank0\\.json"
    assert printable("plain é ü 日本") == "plain é ü 日本"
    assert printable("a\x1b[31mb\r\n\u202e\x9b") == "a\\x1b[31mb\\r\\n\\u202e\\x9b"
    assert printable(None) == ""
