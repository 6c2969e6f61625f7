"""``history list`` / ``history compare A B`` / ``history trend``: the run store from the command line.

The same comparison and trend as the dashboard's History page (diagnostics.history), as text or JSON.
Run ids may be given by a unique prefix, as git takes commits.
"""

from __future__ import annotations

import json
import sys
import time

from diagnostics.errors import TorchScopeError
from diagnostics.history import compare_runs, trend
from diagnostics.results import to_plain
from diagnostics.store import LATEST_TIME, Store, StoreError
from diagnostics.units import format_value, human_seconds, printable


def add_parser(sub, parser_class) -> None:
    hp = sub.add_parser("history", help="list stored runs, compare two, follow a metric over runs",
                        description="The run store (the dashboard's History): 'history list', "
                                    "'history compare A B', 'history trend --analysis profile --metric ...'.")
    hsub = hp.add_subparsers(dest="history_command", metavar="{list,compare,trend}", required=True,
                             parser_class=parser_class)
    hl = hsub.add_parser("list", help="the newest runs, a line each")
    hl.add_argument("--limit", type=int, default=20, metavar="N", help="runs shown (default 20)")
    hl.add_argument("--analysis", metavar="NAME", help="only runs of this analysis")
    hc = hsub.add_parser("compare", help="two runs of one analysis side by side, metric by metric",
                         description="Compare run A (before) with run B (after): each declared metric with its "
                                     "change and a verdict (better / worse by the metric's direction, within noise "
                                     "for latencies inside the runs' own spread).")
    hc.add_argument("a", help="run A's id (or a unique prefix)")
    hc.add_argument("b", help="run B's id (or a unique prefix)")
    ht = hsub.add_parser("trend", help="one metric over a model's finished runs, oldest first")
    ht.add_argument("--analysis", required=True, metavar="NAME", help="e.g. profile, memory, checklist")
    ht.add_argument("--metric", required=True, metavar="KEY", help="a declared metric, e.g. latency_median_ms")
    ht.add_argument("--model", metavar="LABEL", help="a model label as History shows it, e.g. 'cnn (sample)' "
                                                      "(default: every model)")
    for p in (hl, hc, ht):
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        p.add_argument("--data-dir", metavar="DIR", help="run store folder (default $TORCHSCOPE_DATA_DIR or "
                                                           "~/.torchscope)")


def _find(store: Store, ref: str):
    rec = store.get(ref)
    if rec is not None:
        return rec
    matches = [r for r in store.list(limit=100_000) if r.id.startswith(ref)]
    if not matches:
        raise TorchScopeError(f"no run with id {ref!r} in {store.data_dir}")
    if len(matches) > 1:
        raise TorchScopeError(f"run id prefix {ref!r} is ambiguous: {', '.join(r.id for r in matches[:5])}")
    return store.get(matches[0].id)  # the full record (list() leaves the results out)


def _when(t) -> str:
    """A stored time as UTC text ('?' for one that is not a time: a damaged row reads 0)."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= LATEST_TIME:
        return "????-??-?? ??:??:??"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def run(args, out=None) -> int:
    """0 ok, 2 a bad id / analysis / metric (the message says which)."""
    out = out or sys.stdout
    store = Store(args.data_dir)
    p = printable  # text a run stored (a label, an id, an error) never drives the terminal
    try:
        try:  # rows left 'running' by a tool that died (kill -9) get their final status
            store.mark_interrupted()
        except StoreError:
            pass  # a read-only store is still listed
        if args.history_command == "list":
            recs = store.list(limit=args.limit, analysis=args.analysis)
            if args.json:
                out.write(json.dumps([{k: v for k, v in r.to_dict().items() if k != "result"} for r in recs],
                                     indent=1, default=str) + "\n")
            for r in recs if not args.json else ():
                out.write(f"{p(r.id)}  {_when(r.started)}  {p(r.analysis):<10} {p(r.status):<10} "
                          f"{human_seconds(r.duration_s):>8}  {p(r.model_label or '—')}"
                          + (f"  [damaged: {p(r.damaged)}]" if r.damaged else "") + "\n")
            return 0
        if args.history_command == "compare":
            c = compare_runs(_find(store, args.a), _find(store, args.b))
            if args.json:
                out.write(json.dumps(to_plain(c), indent=1, default=str) + "\n")
                return 0
            out.write(f"{p(c.analysis)}: A {p(c.a.id)} ({_when(c.a.started)}, {p(c.a.model)})"
                      f" -> B {p(c.b.id)} ({_when(c.b.started)}, {p(c.b.model)})\n")
            width = max((len(r.label) for r in c.rows), default=10)
            for r in c.rows:
                pct = "" if r.change_pct is None else f"{r.change_pct:+.1f} %"
                out.write(f"  {r.label:<{width}}  {p(r.a_text):>12} -> {p(r.b_text):<12} {pct:>9}  {r.verdict}\n")
            for s in c.settings:
                out.write(f"  changed setting {p(s.setting)}: {p(s.a)} -> {p(s.b)}\n")
            for note in c.notes:
                out.write(f"note: {note}\n")
            if c.traces:
                out.write(f"traces: python -m diagnostics trace diff {p(c.traces.a)} {p(c.traces.b)}\n")
            return 0
        t = trend(store.list(limit=100_000), args.analysis, args.metric, args.model)
        if args.json:
            out.write(json.dumps(to_plain(t), indent=1, default=str) + "\n")
            return 0
        out.write(f"{t.label} ({t.analysis}{', ' + p(t.model) if t.model else ''}): {len(t.rows)} runs"
                  + (f", {t.missing} without it" if t.missing else "")
                  + (f", {t.damaged} damaged in the store" if t.damaged else "") + "\n")
        many = len(t.series) > 1  # runs of different settings: each series on its own, never one line
        for i, series in enumerate(t.series):
            if many:
                out.write(f" series {i + 1}: {p(series.label)} ({series.runs} runs)\n")
            for r in (r for r in t.rows if r.series == i):
                out.write(f"  {_when(r.started)}  {format_value(r.value, t.unit):>12}  {p(r.id)}"
                          f"{'  (machine busy)' if r.disturbed else ''}\n")
        return 0
    except TorchScopeError as e:
        sys.stderr.write(f"error: {printable(e)}\n")
        return 2
