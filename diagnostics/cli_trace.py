"""``trace analyze PATH`` / ``trace diff A B``: diagnostics.trace_cli does the work and the text;
this adds the report folder (``--out``) and the CLI's exit codes (2 for a trace that cannot be read).

Report results are shaped like the dashboard's trace views: ``{"name", "path", "summary",
"top_operators", ...}`` for "trace" and ``{"before", "after", "diff"}`` for "trace_diff".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXIT_OK, EXIT_USAGE = 0, 2


def trace_command(trace_cli, args) -> int:
    from diagnostics.traces import TraceError

    top = args.top if args.top is not None else (10 if args.trace_command == "analyze" else 15)
    try:
        if args.trace_command == "analyze":
            if args.out or args.json:
                result = {"name": Path(args.path).name, "path": str(args.path),
                          **json.loads(trace_cli.analyze(args.path, True, top))}
            text = None if args.json else trace_cli.analyze(args.path, False, top)
            analysis = "trace"
        else:
            if args.out or args.json:
                result = {"before": str(args.a), "after": str(args.b),
                          "diff": json.loads(trace_cli.diff(args.a, args.b, True, top))}
            text = None if args.json else trace_cli.diff(args.a, args.b, False, top)
            analysis = "trace_diff"
    except TraceError as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        sys.stdout.write(text + "\n")
    if args.out:
        from diagnostics.report import write_report_folder

        title = (f"TorchScope trace: {result['name']}" if analysis == "trace"
                 else f"TorchScope trace diff: {Path(args.a).name} -> {Path(args.b).name}")
        written = write_report_folder(analysis, result, args.out, title=title)
        sys.stderr.write(f"report: {written['report.html']}\n")
    return EXIT_OK
