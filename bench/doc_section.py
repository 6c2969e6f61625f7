"""docs/BENCHMARKS.md sections rewritten in place by the benchmarks that own them."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "BENCHMARKS.md"


def replace_section(title: str, body: str, path: Path = BENCHMARKS) -> None:
    """``body`` (starting with ``title``, a '## ' heading) in place of that section up to the next '## '
    heading, or appended when the file has no such section."""
    text = path.read_text()
    if title in text:
        start = text.index(title)
        nxt = text.find("\n## ", start + len(title))
        text = text[:start] + body + (text[nxt + 1:] if nxt != -1 else "")
    else:
        text = text.rstrip() + "\n\n" + body
    path.write_text(text)
