"""``trace analyze`` / ``trace diff``: delegate to diagnostics.trace_cli, then write a report folder."""

from __future__ import annotations


def trace_command(trace_cli, args) -> int:
    argv = [args.trace_command] + ([args.path] if args.trace_command == "analyze" else [args.a, args.b])
    if args.json:
        argv.append("--json")
    return int(trace_cli.main(argv) or 0)
