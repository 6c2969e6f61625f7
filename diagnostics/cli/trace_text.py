"""The text of `trace analyze` / `trace diff`, and a bare in-process version of both.

``python -m diagnostics trace ...`` runs the registered "trace" / "trace_diff" analyses in a worker
(run store, report folder; see diagnostics.cli.trace) and prints with format_analysis / format_diff.
``python -m diagnostics.cli.trace_text analyze PATH [--json] [--top N]`` / ``diff A B`` reads the traces
in this process and writes nothing: main(argv) -> exit code: 0 done, 1 a trace could not be read
(the message says why), 2 usage. argv may start with "trace" or directly with the subcommand.
"""

from __future__ import annotations

import argparse
import json
import sys

from diagnostics.trace import (
    TraceError, diff_traces, load_trace, summary, temporal_breakdown, top_operators,
)
from diagnostics.trace.views import idle_time, launch_stats


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m diagnostics trace",
                                 description="Analyse or compare torch.profiler trace files.")
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="summary and top operators of one trace")
    a.add_argument("path", help="a trace (.json, .json.gz, *.pt.trace.json.gz)")
    a.add_argument("--json", action="store_true", help="print the full result as JSON")
    a.add_argument("--top", type=int, default=10, metavar="N", help="operators shown (10)")
    d = sub.add_parser("diff", help="operators added, removed, faster, slower from A to B")
    d.add_argument("a", help="the baseline trace (before)")
    d.add_argument("b", help="the trace to compare (after)")
    d.add_argument("--json", action="store_true", help="print the full result as JSON")
    d.add_argument("--top", type=int, default=15, metavar="N", help="rows shown (15)")
    return ap


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1000:.3f} ms"


def _table(rows: list, cols: list) -> str:
    """A plain text table: cols is [(header, key, formatter)]."""
    cells = [[h for h, _, _ in cols]] + [[f(r.get(k)) for _, k, f in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths))) for row in cells]
    return "\n".join(lines)


def _clip(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def analysis_result(trace, top: int | None = None) -> dict:
    """What ``trace analyze --json`` prints: summary, top operators/kernels, per-step breakdown,
    idle time and launch statistics of a loaded trace."""
    ops = top_operators(trace) if top is None else top_operators(trace, n=top)
    return {"summary": summary(trace), "top_operators": ops, "temporal_breakdown": temporal_breakdown(trace),
            "idle_time": idle_time(trace), "launch_stats": launch_stats(trace)}


def format_analysis(result: dict, top: int) -> str:
    """The text of ``trace analyze``: a result with "summary" and "top_operators" (at most ``top`` rows each)."""
    s, ops = result["summary"], result["top_operators"]
    out = [f"{s['source']}: {s['events']:,} events, {s['bytes'] / 1e6:.1f} MB, "
           f"duration {_ms(s['duration_us'])}, {s['n_steps']} steps, "
           f"rank {s['rank'] if s['rank'] is not None else '-'}, "
           f"{'GPU' if s['has_gpu'] else 'CPU only'}"]
    for w in s["warnings"]:
        out.append(f"warning: {w}")
    out += ["", "Events by category:",
            _table(s["categories"], [("category", "cat", str), ("events", "events", "{:,}".format),
                                     ("total", "total_us", _ms)])]
    if s["streams"]:
        out += ["", "GPU streams:", _table(s["streams"], [
            ("device", "device", str), ("stream", "stream", str), ("kernels", "kernels", str),
            ("memcpy", "memcpy", str), ("memset", "memset", str), ("busy", "busy_us", _ms)])]
    rows = [dict(r, name=_clip(r["name"])) for r in ops["operators"][:top]]
    out += ["", f"Top {len(rows)} of {ops['n_operators']} operators by self time:",
            _table(rows, [("operator", "name", str), ("calls", "calls", str),
                          ("self", "self_us", _ms), ("total", "total_us", _ms),
                          ("self %", "self_pct", "{:.1f}".format)])]
    if ops["kernels"]:
        rows = [dict(r, name=_clip(r["name"])) for r in ops["kernels"][:top]]
        out += ["", f"Top {len(rows)} of {ops['n_kernels']} GPU kernels:",
                _table(rows, [("kernel", "name", str), ("kind", "kind", str),
                              ("calls", "calls", str), ("total", "total_us", _ms),
                              ("%", "pct", "{:.1f}".format)])]
    return "\n".join(out)


def analyze(path: str, as_json: bool, top: int) -> str:
    result = analysis_result(load_trace(path), top)
    return json.dumps(result, indent=2) if as_json else format_analysis(result, top)


def format_diff(r: dict, a: str, b: str, top: int) -> str:
    """The text of ``trace diff``: ``r`` is diff_traces' result, its first ``top`` rows shown."""
    c = r["counts"]
    rows = [dict(x, name=_clip(x["name"]), ratio=x["ratio"]) for x in r["rows"][:top]]
    return "\n".join([
        f"{a} -> {b} ({r['unit']}): {_ms(r['time_us_before'])} -> {_ms(r['time_us_after'])}; "
        f"{c['added']} added, {c['removed']} removed, {c['faster']} faster, "
        f"{c['slower']} slower, {c['unchanged']} unchanged", "",
        _table(rows, [("name", "name", str), ("kind", "kind", str), ("status", "status", str),
                      ("before", "time_us_before", _ms), ("after", "time_us_after", _ms),
                      ("delta", "delta_us", _ms),
                      ("ratio", "ratio", lambda v: "-" if v is None else f"{v:.2f}x")])])


def diff(a: str, b: str, as_json: bool, top: int) -> str:
    r = diff_traces(load_trace(a), load_trace(b))
    return json.dumps(r, indent=2) if as_json else format_diff(r, a, b, top)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trace"]:
        argv = argv[1:]
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        if args.command == "analyze":
            text = analyze(args.path, args.json, args.top)
        else:
            text = diff(args.a, args.b, args.json, args.top)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
