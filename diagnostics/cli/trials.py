"""``python -m diagnostics run --try FIX[,FIX...] [--steps N] [--rounds R] [--warmup N] -- COMMAND``: fixes
tried on the user's own script (diagnostics.attach.trials), one line per run on stderr, the rows and the
changes to make at the end, the run in History, a report folder; ``--json``: the result as the last line of
stdout. Exit 0 when the trials ran (whatever their verdicts), 1 when the script fails as it is or the trials
were stopped, 2 for bad input (an unknown fix, a command that cannot run): nothing is started then."""

from __future__ import annotations

import json
import sys

from diagnostics.analyses.trials import DEFAULT_ROUNDS, DEFAULT_STEPS, DEFAULT_WARMUP
from diagnostics.cli.report_folder import report_dir, write_report
from diagnostics.results import to_plain

EXIT_USAGE = 2


def run_trials(args, command: list[str], stop) -> int:
    from diagnostics.analyses.attach.protocol import write_json
    from diagnostics.attach.command import check_command
    from diagnostics.attach.trials import Trials
    from diagnostics.errors import TorchScopeError
    from diagnostics.store import Store

    if args.at is not None:
        sys.stderr.write("error: --at profiles a step; it does not go with --try\n")
        return EXIT_USAGE
    status_file = args.status_file

    def progress(fraction, message, live):
        if status_file:
            write_json(status_file, {**live, "fraction": fraction, "message": message, "run_id": trials.run_id,
                                     "done": False, "mode": "trials"})
        if not args.quiet and message != "done":
            sys.stderr.write(f"[torchscope] {message}\n")
            sys.stderr.flush()

    try:
        cmd = check_command(command, args.cwd)
        out_dir = report_dir(args.out, args.no_report, "trials")
        store = Store(args.data_dir)
        trials = Trials(cmd, args.try_fixes, steps=args.steps or DEFAULT_STEPS, warmup=args.warmup or DEFAULT_WARMUP,
                        rounds=args.rounds or DEFAULT_ROUNDS, store=store,
                        source="dashboard" if args.die_with_parent else "cli", stop=stop, timeout_s=args.timeout,
                        on_progress=progress)
    except TorchScopeError as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_USAGE
    for note in store.notices:
        sys.stderr.write(f"warning: {note}\n")
    out = trials.run()
    result = out.result
    if status_file:
        write_json(status_file, {"phase": "done", "done": True, "run_id": out.run_id, "folder": out.folder,
                                 "error": out.error, "mode": "trials"})
    if out.error:
        sys.stderr.write(f"error: {out.error}\n")
    written = None
    if result is not None and out_dir is not None:
        written = write_report("trials", result, out_dir, {}, title=f"TorchScope fix trials: {cmd.label}",
                               run_id=out.run_id or "")
    if result is not None and not args.quiet:
        from diagnostics.render.charts.trials import summary_lines

        err = sys.stderr
        err.write("[torchscope] " + "\n[torchscope] ".join(summary_lines(result)) + "\n")
        for n in result.notes:
            err.write(f"[torchscope] note: {n}\n")
        if written:
            err.write(f"[torchscope] report: {written['report.html']}\n")
        err.write(f"[torchscope] run {out.run_id} (History)\n")
        err.flush()
    if args.json:
        shown = dict(to_plain(result) or {}, run_id=out.run_id,
                     report=str(written["report.html"]) if written else None, error=out.error)
        sys.stdout.flush()
        sys.stdout.write(json.dumps(shown, default=str) + "\n")
        sys.stdout.flush()
    return 0 if result is not None and result.status == "ok" else 1
