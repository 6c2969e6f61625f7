"""The headless CLI: ``python -m diagnostics <analysis> --model NAME_OR_PATH [options]``.

One subcommand per registered analysis that runs on a model (diagnostics.registry.ANALYSES, less
INTERNAL), so such an analysis gets its command the moment it is registered; ``trace analyze`` /
``trace diff`` run the "trace" / "trace_diff" analyses on trace files and ``distributed`` has its
own CLI. Every run goes through the same worker runner and SQLite store as the dashboard (source
"cli", so it shows in History; run_job_command) and writes a report folder: report.html
(self-contained, opens offline), result.json, one CSV per table and the Chrome trace when the run
made one.

Exit codes: 0 ok, 1 the job failed (error, timeout, crash, out of memory), 2 bad usage or input
(unknown model, missing file, bad shape, a model that does not load or rejects its inputs),
3 the checklist score is under --fail-under, 130 interrupted. Reasons go to stderr; with --json
stdout holds only the result as JSON.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import diagnostics.jobfiles as jobfiles
from diagnostics.cli import report_folder as cli_report
from diagnostics.cli.model_args import UsageError, add_model_args, spec_from_args
from diagnostics.cli.report_folder import add_report_args
from diagnostics.cli.trace import add_trace_options
from diagnostics.cli.options import add_options, collect_options, positive_int, score
from diagnostics.errors import TorchScopeError
from diagnostics.results import disturbance_of, metrics_of, notes_of, to_json

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_GATE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: Job errors that mean "what you gave cannot be used" (exit 2) rather than "the job failed" (exit 1).
INPUT_ERRORS = ("SpecError", "ModelLoadError", "TrustError", "ModelRunError", "UsageError", "TraceError",
                "OptionError")
#: Command names the CLI keeps for itself (an analysis declaring one of them as its command is refused).
RESERVED = ("trace", "list", "distributed", "run", "history")
#: Dashboard wording in job errors -> what to do on the command line instead.
CLI_WORDING = {
    "enter the input shapes in the sidebar": "give the input shapes with --input SHAPE[:DTYPE], e.g. --input 8,3,32,32 "
                                             "(repeat it for each input)",
}


def model_commands() -> list[str]:
    """The analyses' CLI subcommands: the ``command`` every registered analysis that has one declares
    (not its name: "batch_scan" could be "scan"). (The load check declares none; "trace" / "trace_diff"
    run under ``trace analyze`` / ``trace diff``, "distributed" / "distributed_traces" under ``distributed``.)"""
    return list(_by_command())


def analysis_of(command: str):
    """The declaration of the analysis whose CLI subcommand is ``command``."""
    return _by_command()[command]


def _by_command() -> dict:
    from diagnostics.registry import ANALYSES   # every analysis' declaration: not needed by ``trace`` (its first answer)

    commands = {a.command: a for a in ANALYSES.values() if a.command}
    clash = [c for c in commands if c in RESERVED]
    if clash:
        raise RuntimeError(f"analysis command names {clash} are kept by the CLI itself")
    return commands


def cli_message(message: str | None) -> str:
    """A job's error as the CLI says it: the dashboard's instructions replaced by the flags to use."""
    message = str(message or "")
    for dashboard, cli in CLI_WORDING.items():
        message = message.replace(dashboard, cli)
    return message


def is_input_error(error_type: str | None) -> bool:
    """A job error that means the model, inputs or options given cannot be used (exit 2)."""
    return bool(error_type) and (error_type in INPUT_ERRORS or error_type == "TorchScopeError"
                                 or error_type.endswith("OptionError"))


class ArgParser(argparse.ArgumentParser):
    """argparse that exits 2 with 'error: ...' on stderr (its default) but names the command."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# ----------------------------------------------------------------------------- progress
class ProgressBar:
    """A text progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    WIDTH = 24

    def __init__(self, label: str, stream=None, enabled: bool = True):
        self.label, self.stream, self.enabled = label, stream or sys.stderr, enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.fraction, self.message, self.t0, self._last_draw, self._last_line = 0.0, "", time.monotonic(), 0.0, None

    def update(self, fraction: float, message: str = "") -> None:
        self.fraction, self.message = fraction, message or self.message
        self._draw(force=True)

    def tick(self, _elapsed: float = 0.0) -> None:
        self._draw(force=False)

    def _draw(self, force: bool) -> None:
        if not self.enabled:
            return
        pct = int(round(100 * self.fraction))
        elapsed = time.monotonic() - self.t0
        if self.tty:
            now = time.monotonic()
            if not force and now - self._last_draw < 0.25:
                return
            self._last_draw = now
            filled = int(self.WIDTH * self.fraction)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            line = f"{self.label} [{bar}] {pct:3d}% {elapsed:6.1f}s  {self.message}"
            self.stream.write("\r" + line[:160].ljust(100))
            self.stream.flush()
        elif force:
            line = f"{self.label} [{pct:3d}%] {self.message}"
            if line != self._last_line:  # a CI log gets one line per step, not a redraw per tick
                self._last_line = line
                self.stream.write(f"{line} ({elapsed:.1f}s)\n")
                self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def above(self, text: str, out=None) -> None:
        """Write ``text`` (a line of results) to ``out`` (stdout) above the bar: on a terminal the bar's
        line is cleared first and drawn again after."""
        out = out or sys.stdout
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()
        out.write(text + "\n")
        out.flush()
        if self.enabled and self.tty:
            self._draw(force=True)


def partial_printer(name: str, bar: ProgressBar, out=None):
    """``on_partial`` for run_job: prints each line of the analysis' declared ``partial_text`` once, as it
    becomes known (Optimize: each trial once built, its verdict once final); None when it declares none.
    Returns (callback, finish): ``finish(result)`` prints the lines the final result adds."""
    from diagnostics.registry import get_analysis   # a trace file's analysis without every declaration

    decl = get_analysis(name)
    if not decl.partial_text:   # none declared
        return None, lambda result: None
    from diagnostics.declare import resolve

    # resolved alone, not through render.layouts (whose import resolves every analysis' report: plotly and
    # every chart module, a quarter of a second before a trace's first answer; tests/cli check them all)
    lines_of = resolve(decl.partial_text, what=f"the partial CLI text of {name}", takes=decl.partial)
    printed: set = set()

    def show(result) -> None:
        for key, line in lines_of(result):
            if key not in printed:
                printed.add(key)
                bar.above(line, out)

    return show, show


# ----------------------------------------------------------------------------- parser
def _add_run_args(p: argparse.ArgumentParser, name: str = "<analysis>") -> None:
    g = p.add_argument_group("run and report")
    g.add_argument("--timeout", type=float, metavar="SECONDS", help="stop the job after this long "
                                                                   "(default: the analysis' own limit)")
    add_report_args(g, name)
    g.add_argument("--json", action="store_true", help="print the result as JSON on stdout (nothing else there)")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    g.add_argument("--data-dir", metavar="DIR", help="run store folder (default $TORCHSCOPE_DATA_DIR or "
                                                     "~/.torchscope), shared with the dashboard's History")


def _add_analysis_args(p: argparse.ArgumentParser, analysis) -> None:
    add_options(p, analysis)
    if analysis.name == "checklist":  # the CLI's own gate, not an option of the analysis
        p.add_argument("--fail-under", dest="fail_under", type=score, metavar="SCORE",
                       help="exit 3 when the checklist score (0-100) is below this: a CI gate")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. Given the ``command`` the arguments start with, where that is ``trace``, only its
    subcommand is built: the model commands are the registry's analyses, and importing every declaration
    costs a trace's first answer 0.1 s (a ``trace`` argument list parses the same either way)."""
    parser = ArgParser(prog="python -m diagnostics",
                       description="TorchScope diagnostics without a browser: run an analysis on a model and "
                                   "write a shareable report folder. Runs land in the dashboard's History.",
                       epilog="Exit codes: 0 ok, 1 the job failed, 2 bad usage or input, 3 checklist score under "
                              "--fail-under, 130 interrupted.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=ArgParser)
    for name, analysis in (() if command == "trace" else _by_command().items()):
        p = sub.add_parser(name, help=analysis.title, description=f"{analysis.title}: run the "
                                                                     f"'{analysis.name}' analysis on a model and "
                                                                     "write a report folder.")
        # An analysis with an option of its own on --device (the plan's device to fit) runs its model where
        # the spec says (the CPU by default) rather than taking the model's --device.
        add_model_args(p, device=not any(o.cli_flag == "--device" for o in analysis.options))
        _add_analysis_args(p, analysis)
        _add_run_args(p, analysis.name)
    tp = sub.add_parser("trace", help="analyse or compare Chrome/Kineto trace files",
                        description="Trace files: 'trace analyze PATH' or 'trace diff A B'.")
    tsub = tp.add_subparsers(dest="trace_command", metavar="{analyze,diff}", required=True, parser_class=ArgParser)
    ta = tsub.add_parser("analyze", help="analyse one trace file (.json or .json.gz), or several ranks' traces",
                         description="Analyse one trace file (the 'trace' analysis) and write a report folder. "
                                     "Several files, or a folder, are the ranks of one job: the first is analysed "
                                     "in full, and all of them side by side (per-rank table, checks that they are "
                                     "one run, a merged timeline).")
    ta.add_argument("path", nargs="+", help="a Chrome/Kineto trace (.json or .json.gz); several files or a folder: "
                                            "one trace per rank")
    add_trace_options(ta)
    ta.add_argument("--step", type=int, metavar="N", help="the profiler step number whose critical path is "
                                                          "computed (default: the longest complete step)")
    td = tsub.add_parser("diff", help="compare two trace files",
                         description="Compare two trace files (the 'trace_diff' analysis) and write a report folder.")
    td.add_argument("a", help="the baseline trace")
    td.add_argument("b", help="the trace to compare with it")
    for t, rows in ((ta, "operators and kernels (default 10; result.json keeps 20 rows per table, or N when more)"),
                    (td, "changed operators (default 15)")):
        t.add_argument("--top", type=positive_int, metavar="N", help=f"rows shown in the text output: {rows}")
        _add_run_args(t, "trace" if t is ta else "trace_diff")
    if command == "trace":
        return parser
    sub.add_parser("distributed", add_help=False,
                   help="distributed (torchrun + DDP) runs: run / analyze / command; see its own --help")
    sub.add_parser("run", add_help=False, help="run your own training script, unmodified, and profile it: "
                                                "run [options] -- python train.py ...; see its own --help")
    sub.add_parser("list", help="list the commands and the built-in sample models")
    from diagnostics.cli import history as cli_history

    cli_history.add_parser(sub, ArgParser)
    return parser


# ----------------------------------------------------------------------------- helpers
def _distributed_main():
    """The ``distributed`` command's entry point, main(argv) -> int (diagnostics.cli.distributed)."""
    from diagnostics.cli.distributed import main as distributed_main

    return distributed_main


def _err(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def checklist_score(result) -> float | None:
    """The checklist's 0-100 score (its ``score`` metric)."""
    score = metrics_of(result).get("score")
    return float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None


def _print_human(name: str, spec, outcome, written: dict | None) -> None:
    from diagnostics.render.text import disturbance_line, metric_lines

    out = sys.stdout
    what = f" · {spec.label} · {spec.device}" if spec is not None else ""
    out.write(f"{name}{what} · ok in {outcome.duration_s:.1f} s (run {outcome.run_id})\n")
    for line in metric_lines(name, metrics_of(outcome.result)):
        out.write(f"  {line}\n")
    for note in notes_of(outcome.result):
        out.write(f"  note: {note}\n")
    line = disturbance_line(disturbance_of(outcome.result))
    if line:
        out.write(f"  machine: {line}\n")
    if written and "report.html" in written:
        out.write(f"report: {written['report.html']}\n")


# ----------------------------------------------------------------------------- commands
def report_dir(args, name: str) -> Path | None:
    """Where a command writes its report folder: none with --no-report, --out DIR, else the default."""
    return cli_report.report_dir(args.out, getattr(args, "no_report", False), name)


def run_job_command(args, name: str, spec, options: dict, *, title: str, label: str | None = None,
                    show=None, text=None, copy_artifacts: bool = True, in_process=None,
                    memo_text=None) -> tuple[int, dict | None]:
    """Run one analysis as every command does; returns (exit code, the result shown).

    The job runs in a worker through diagnostics.runner with the run store (source "cli", so it is
    in the dashboard's History), a progress bar on stderr (--quiet: none) and Ctrl-C recorded as
    cancelled; then the report folder (report_dir) and stdout (--json: only the result). ``show``
    turns the stored result into the one shown and written (default: as stored); ``text(result)``
    is the human output (default: the headline metrics); ``copy_artifacts`` copies the run's
    Chrome trace into the report folder. ``in_process(store, on_progress, cancel, on_partial)``, when given, may answer
    without a worker (a JobOutcome, its run recorded in the store) or return None (then the job runs in one).
    ``memo_text(result)``, when given, keys the report body kept in <data folder>/report_memo for a result seen
    again (diagnostics.render.report_memo: a trace reopen draws no chart again).
    """
    from diagnostics.runner import Job, run_job
    from diagnostics.store import Store

    try:
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError(f"bad --timeout {args.timeout}: must be positive seconds")
        out_dir = report_dir(args, name)
        store = Store(args.data_dir)
    except TorchScopeError as e:
        _err(str(e))
        return EXIT_USAGE, None
    for note in store.notices:  # e.g. an unreadable run store, moved aside
        sys.stderr.write(f"warning: {note}\n")
    told = len(store.notices)

    label = label or name
    bar = ProgressBar(label, enabled=not args.quiet)
    # the rows as they come (not with --json: stdout is then the result alone)
    on_partial, finish_partial = (None, None) if args.json else partial_printer(name, bar)
    cancel = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())  # Ctrl-C: stop the worker, record it
    try:
        outcome = in_process(store, bar.update, cancel, on_partial) if in_process is not None else None
        if outcome is None and in_process is not None:   # (main said it for the commands without this path)
            say_startup_notice()
        outcome = outcome or run_job(Job(name, spec, options), timeout_s=args.timeout, on_progress=bar.update,
                                     on_tick=bar.tick, store=store, source="cli", cancel=cancel,
                                     on_partial=on_partial)
    finally:
        signal.signal(signal.SIGINT, previous)
        bar.close()
    for note in store.notices[told:]:
        sys.stderr.write(f"warning: {note}\n")
    if not outcome.ok:
        if outcome.status == "cancelled" and cancel.is_set():
            _err(f"{label} interrupted; run {outcome.run_id} recorded as cancelled")
            return EXIT_INTERRUPTED, None
        _err(f"{label} failed ({outcome.status}): {cli_message(outcome.error)}")
        # Out of memory is the job failing (exit 1), even when the model's forward ran out (ModelRunError).
        bad_input = is_input_error(outcome.error_type) and outcome.status == "error"
        if not bad_input and outcome.log_tail:
            sys.stderr.write("worker output (last lines):\n" + outcome.log_tail[-1500:] + "\n")
        return (EXIT_USAGE if bad_input else EXIT_FAILED), None

    if on_partial is not None:
        finish_partial(outcome.result)  # the rows whose verdicts came with the end
    result = show(outcome.result) if show is not None else outcome.result
    written = None
    if out_dir is not None:
        artifacts = jobfiles.listing(outcome.artifact_dir) if copy_artifacts and outcome.artifact_dir else {}
        memo = {}
        if memo_text is not None:
            from diagnostics.render.report_memo import MEMO_DIR

            memo = {"memo_dir": store.data_dir / MEMO_DIR, "memo_text": memo_text(result)}
        written = cli_report.write_report(name, result, out_dir, artifacts, title=title, run_id=outcome.run_id,
                                          **memo)
        if written is None:
            return EXIT_FAILED, None
    if args.json:
        sys.stdout.write(to_json(result) + "\n")
        if written:
            sys.stderr.write(f"report: {written['report.html']}\n")
    elif text is not None:
        sys.stdout.write(text(result) + "\n")
        sys.stdout.write(f"{label} · ok in {outcome.duration_s:.1f} s (run {outcome.run_id})\n")
        if written:
            sys.stdout.write(f"report: {written['report.html']}\n")
    else:
        _print_human(label, spec, outcome, written)
    return EXIT_OK, result


def _text_of(name: str):
    """The analysis' own CLI text (its declared ``text``), or None: the headline metrics."""
    from diagnostics.render.layouts import text_of

    return text_of(name)


def run_analysis_command(args) -> int:
    analysis = analysis_of(args.command)
    name = analysis.name
    try:
        options = collect_options(analysis, args)
        spec = None
        if analysis.needs_model:
            spec = spec_from_args(args)
    except TorchScopeError as e:
        _err(str(e))
        return EXIT_USAGE

    title = f"TorchScope {analysis.title}" + (f": {spec.label}" if spec else "")
    code, result = run_job_command(args, name, spec, options, title=title, text=_text_of(name))
    if code != EXIT_OK:
        return code

    fail_under = getattr(args, "fail_under", None)
    if fail_under is not None:
        score = checklist_score(result)
        if score is None:
            _err("--fail-under: the result has no score")
            return EXIT_FAILED
        if score < fail_under:
            _err(f"checklist score {score:.1f} is below --fail-under {fail_under:g}")
            return EXIT_GATE
        sys.stderr.write(f"checklist score {score:.1f} >= {fail_under:g}: pass\n")
    return EXIT_OK


def run_trace_command(args) -> int:
    """``trace analyze`` / ``trace diff``: the "trace" / "trace_diff" analyses, run like every command."""
    from diagnostics.cli import trace as cli_trace
    try:
        name, options = cli_trace.trace_job(args)
    except TorchScopeError as e:
        _err(str(e))
        return EXIT_USAGE
    code, _ = run_job_command(args, name, None, options, label=f"trace {args.trace_command}",
                              title=cli_trace.report_title(args), show=lambda r: cli_trace.cli_result(name, r),
                              text=lambda r: cli_trace.text(args, r), copy_artifacts=False,
                              in_process=lambda store, progress, cancel, partial: cli_trace.in_process(
                                  name, options, store, progress, cancel, args.timeout, partial),
                              memo_text=cli_trace.report_memo_text)
    return code


def list_command() -> int:
    from sample_models import SAMPLES

    out = sys.stdout
    out.write("commands:\n")
    rows = [(command, analysis.title) for command, analysis in _by_command().items()]
    rows += [("trace analyze", "Trace explorer: analyse one trace file"),
             ("trace diff", "Trace diff: compare two trace files"),
             ("history", "Stored runs: list, compare two, a metric's trend"),
             ("run", "Your own script, unmodified, profiled while it runs (run -- python train.py)")]
    rows.append(("distributed", "Distributed runs (torchrun + DDP): run / analyze / command"))
    for name, title in rows:
        out.write(f"  {name:<14} {title}\n")
    out.write("sample models:\n")
    for name, s in SAMPLES.items():
        out.write(f"  {name:<18} {s.description}\n")
    return EXIT_OK


def say_startup_notice() -> None:
    """Say, before any job runs, when jobs will run without the full sandbox (sandbox.startup_notice). A
    ``trace`` command (the one whose job may be answered in this process) says it only before a worker starts:
    a trace file read here is data, with no model to confine, and the check costs an import and a process
    (0.1 s of a first answer)."""
    from diagnostics.sandbox import startup_notice

    notice = startup_notice()
    if notice:
        sys.stderr.write(f"warning: {notice}\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":  # the user's own script: no worker, no sandbox (diagnostics.attach)
        from diagnostics.cli.attach import main as run_main

        return run_main(argv[1:])
    if not (argv and argv[0] == "trace"):  # a trace job may answer here, running no model: said before a worker
        say_startup_notice()
    if argv and argv[0] == "distributed":
        return int(_distributed_main()(argv[1:]) or 0)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    if args.command == "trace":
        return run_trace_command(args)
    if args.command == "list":
        return list_command()
    if args.command == "history":
        from diagnostics.cli import history as cli_history

        return cli_history.run(args)
    return run_analysis_command(args)


if __name__ == "__main__":
    sys.exit(main())
