"""``python -m diagnostics run [options] -- COMMAND [ARGS...]`` (also ``torchscope run -- ...``): run the
user's own training script, unmodified, and profile it while it runs (diagnostics.attach).

    python -m diagnostics run -- python train.py --epochs 1
    python -m diagnostics run --steps 10 --at 50 -- python -m mypkg.train
    python -m diagnostics run --json -- torchrun --nproc-per-node 2 train.py

The script runs as it would bare: same argv, working folder, environment (plus the bootstrap on
PYTHONPATH), stdin, stdout and stderr; this command exits with the script's exit code (128 + N
after signal N). The summary goes to stderr; with ``--json`` the result is printed on stdout after
the script's own output, as its last line, also when the script failed. Exit 2 for a command that
cannot run (not found, not Python, bad torchrun arguments): nothing is started then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from diagnostics.analyses.attach import DEFAULT_STEPS
from diagnostics.analyses.attach.result import AttachResult
from diagnostics.cli.report_folder import add_report_args, report_dir, write_report
from diagnostics.results import to_plain

EXIT_USAGE = 2
PROG = "python -m diagnostics run"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def positive(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a {'whole' if kind is int else ''} number, got {text!r}")
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
        return v
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, usage=f"{PROG} [options] -- COMMAND [ARGS...]",
                description="Run your own training script, unmodified, and profile it while it runs: step time and "
                            "its parts (data wait, forward, backward, optimizer, communication, device syncs, host), "
                            "a torch.profiler trace of a few steps after warm-up, DataLoader workers, gradients, "
                            "memory, findings. COMMAND is `python train.py ...`, `python -m pkg.train ...` or "
                            "`torchrun [its args] train.py ...`.",
                epilog="Exit code: the script's own (2 when the command cannot run). The run lands in the "
                       "dashboard's History.")
    g = p.add_argument_group("what to profile")
    g.add_argument("--steps", type=positive(int), default=None,
                   help=f"steps to profile with torch.profiler (default {DEFAULT_STEPS})")
    g.add_argument("--at", type=positive(int), metavar="K",
                   help="profile from step K (at least 2) instead of after the automatic warm-up")
    g.add_argument("--stacks", action="store_true", help="record Python stacks in the trace (slower profiled steps)")
    g.add_argument("--shapes", action="store_true",
                   help="record the operators' input shapes in the trace (not used by the run's views; a larger trace, "
                        "slower window)")
    g.add_argument("--no-grads", action="store_true", help="no gradient statistics in the profiled steps")
    g.add_argument("--max-warmup", type=positive(int), default=50, metavar="N",
                   help="profile after N steps even if step times have not settled (default 50)")
    g.add_argument("--fallback-after", type=positive(float), default=3.0, metavar="S",
                   help="seconds of forwards without an optimizer step or a backward before steps end at the "
                        "model's forward (an inference loop), or of batches with no model at DataLoader batches "
                        "(default 3)")
    g.add_argument("--plan", nargs="?", const="", default=None, metavar="SPEC",
                   help="plan the script's own job's memory: at its first optimizer step's end, the model, optimizer, "
                        "batch and dtype it really uses are planned on fake copies (nothing allocated), the 1x row "
                        "set beside the peak the run measured; SPEC adds rows: batch=2x,4x (or sizes) ; seq=2x,1024 "
                        "(token inputs, each from its own length; seq=NAME=2x for one input) ; dtype=bf16 ; "
                        "shard=zero1,zero2,zero3|fsdp,ranks=8 ; device=H100-80GB ; probe=yes (kernel scratch measured "
                        "on real tensors), e.g. --plan 'batch=2x,4x;seq=2x;dtype=bf16;shard=zero3,ranks=8' "
                        "(docs/attach.md, 'Planning the job's memory')")
    t = p.add_argument_group("try fixes (instead of profiling: docs/attach.md, 'Trying fixes')")
    t.add_argument("--try", dest="try_fixes", metavar="FIX[,FIX...]",
                   help="run the script as it is and with each fix (no edit of the script), in interleaved rounds "
                        "with an A/A control, and report each fix's speed-up with its interval and its cost in loss "
                        "and memory; fixes: amp_bf16, amp_fp16, compile, channels_last, loader_workers=N, pin_memory, "
                        "persistent_workers, prefetch=N, fused_optimizer, foreach_optimizer, set_to_none, "
                        "checkpointing, cudnn_benchmark, tf32. --steps is then the timed steps per run (default 10)")
    t.add_argument("--rounds", type=positive(int), default=None, metavar="R",
                   help="with --try: rounds, each running the script once per candidate (default 6, the fewest "
                        "that give a 95%% interval)")
    t.add_argument("--warmup", type=positive(int), default=None, metavar="N",
                   help="with --try: untimed steps per run, whose losses and gradient norms are compared (default 3)")
    r = p.add_argument_group("run and report")
    r.add_argument("--cwd", metavar="DIR", help="the script's working folder (default: this one)")
    r.add_argument("--timeout", type=positive(float), metavar="SECONDS",
                   help="stop the script after this long, as Ctrl-C does (what was measured is kept)")
    add_report_args(r, "attach")
    r.add_argument("--json", action="store_true", help="print the result as JSON on stdout, after the script's output")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    r.add_argument("--data-dir", metavar="DIR", help="run store folder (default $TORCHSCOPE_DATA_DIR or ~/.torchscope)")
    r.add_argument("--status-file", metavar="PATH", help=argparse.SUPPRESS)  # the dashboard's live view
    r.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)  # ... and its Stop at exit
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our options, the command): the command is everything after the first ``--``; without one, from
    the first word that is not an option of ours."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    with_value = {"--steps", "--at", "--try", "--rounds", "--warmup", "--max-warmup", "--fallback-after", "--cwd",
                  "--timeout", "--out", "-o", "--data-dir", "--status-file"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            break
        # --plan's SPEC is optional: the next word is it when it is KEY=VALUE (a command is never that)
        spec = a == "--plan" and i + 1 < len(argv) and "=" in argv[i + 1] and not argv[i + 1].startswith("-")
        i += 2 if a in with_value or spec else 1
    return argv[:i], argv[i:]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, command = split_argv(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(ours)
    except SystemExit as e:
        return int(e.code or 0)
    stop = threading.Event()
    if args.die_with_parent:  # started by the dashboard: its end is our Stop
        threading.Thread(target=_watch_parent, args=(os.getppid(), stop), daemon=True).start()
    from diagnostics.analyses.attach.protocol import AttachConfig
    from diagnostics.attach.command import check_command
    from diagnostics.attach.session import Session
    from diagnostics.errors import TorchScopeError
    from diagnostics.store import Store

    if args.plan is not None:
        from diagnostics.analyses.plan.attached import parse_spec
        from diagnostics.declare import OptionError

        try:
            parse_spec(args.plan)
        except OptionError as e:
            sys.stderr.write(f"error: {e}\n")
            return EXIT_USAGE
        if args.try_fixes is not None:
            sys.stderr.write("error: --plan goes with a profiled run, not with --try\n")
            return EXIT_USAGE
    if args.try_fixes is not None:  # issue 40: fix trials instead of a profiled run
        from diagnostics.cli.trials import run_trials

        return run_trials(args, command, stop)
    if args.rounds is not None or args.warmup is not None:
        sys.stderr.write("error: --rounds and --warmup go with --try\n")
        return EXIT_USAGE
    args.steps = DEFAULT_STEPS if args.steps is None else args.steps
    try:
        if args.at is not None and args.at < 2:
            raise TorchScopeError(f"--at {args.at}: the first step starts with the script; profile from step 2 on")
        cmd = check_command(command, args.cwd)
        out_dir = report_dir(args.out, args.no_report, "attach")
        store = Store(args.data_dir)
    except TorchScopeError as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_USAGE
    for note in store.notices:
        sys.stderr.write(f"warning: {note}\n")
    config = AttachConfig(steps=args.steps, at=args.at, stacks=args.stacks, shapes=args.shapes, grads=not args.no_grads,
                          max_warmup=args.max_warmup, fallback_after_s=args.fallback_after, plan=args.plan)
    status_file = args.status_file
    said = {"phase": None}

    def on_live(live):
        if status_file:
            _write_status(status_file, {**live.to_dict(), "run_id": session.run_id, "run_dir": str(session.run_dir),
                                        "done": False})
        if args.quiet or live.phase == said["phase"]:
            return
        said["phase"] = live.phase
        if live.phase == "profiling" and live.window:
            line = f"profiling steps {live.window[0]}-{live.window[1]}"
        elif live.phase == "running":
            line = f"profiled; the script runs on (step {live.step})"
        else:
            line = live.phase
        sys.stderr.write(f"[torchscope] {line}\n")
        sys.stderr.flush()

    # The dashboard's SIGTERM is its Stop button: a deliberate stop, said as such.
    session = Session(cmd, config, store=store, source="dashboard" if args.die_with_parent else "cli",
                      on_live=on_live, timeout_s=args.timeout, stop=stop,
                      sigterm_reason="stopped by the user (Stop)" if args.die_with_parent else None)
    outcome = session.run()
    result = outcome.result
    if status_file:
        _write_status(status_file, {"phase": "done", "done": True, "run_id": outcome.run_id,
                                    "run_dir": outcome.run_dir, "exit_code": outcome.exit_code,
                                    "error": outcome.error, "stop_reason": outcome.stop_reason})
    if outcome.error:  # ours: a note; the script's exit code is still the command's
        from diagnostics.units import printable

        sys.stderr.write(f"[torchscope] note: {printable(outcome.error)}\n")
    written = None
    if result is not None and out_dir is not None:
        from pathlib import Path

        try:
            artifacts = {p.name: str(p) for p in Path(outcome.run_dir).iterdir() if p.is_file()}
            written = write_report("attach", result, out_dir, artifacts, title=f"TorchScope run: {cmd.label}",
                                   run_id=outcome.run_id or "")
        except OSError as e:
            sys.stderr.write(f"[torchscope] note: the report could not be written: {e}\n")
    if result is not None and not args.quiet:
        _summary(result, outcome, written)
    if args.json:  # the result's one plain form, with where the run and its report are
        shown = dict(to_plain(result) or {}, run_id=outcome.run_id, run_dir=outcome.run_dir,
                     report=str(written["report.html"]) if written else None)
        if result is None:
            shown.update(exit_code=outcome.exit_code, error=outcome.error)
        sys.stdout.flush()
        sys.stdout.write(json.dumps(shown, default=str) + "\n")
        sys.stdout.flush()
    if outcome.exit_code is None:
        return 1
    return outcome.exit_code


def _write_status(path: str, data: dict) -> None:
    """The dashboard's live status file: its folder made again if it was deleted; a failure is ours, never
    the run's (the script runs on, the run is still stored)."""
    from diagnostics.analyses.attach.protocol import write_json

    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_json(path, data)
    except OSError as e:
        if not _STATUS_FAILED:
            _STATUS_FAILED.append(e)
            sys.stderr.write(f"[torchscope] note: the status file could not be written ({e}); the run goes on\n")


_STATUS_FAILED: list = []


def _watch_parent(parent: int, stop: threading.Event) -> None:
    """Set ``stop`` when the process that started us is gone (PR_SET_PDEATHSIG would fire when its
    starting *thread* ends: a dashboard's script run ends after every rerun)."""
    import time

    while os.getppid() == parent:
        time.sleep(0.5)
    stop.set()


def _summary(result: AttachResult, outcome, written) -> None:
    from diagnostics.render.charts.attach import summary_lines, trace_paths

    from diagnostics.units import printable as p  # notes quote names the script chose: never terminal codes

    err = sys.stderr
    err.write("[torchscope] " + "\n[torchscope] ".join(p(line) for line in summary_lines(result)) + "\n")
    for f in result.fix_first:
        if f.est_saving_ms:
            err.write(f"[torchscope] fix first: {p(f.title)}: {f.est_saving_ms:.2f} ms per step: {p(f.detail)}\n")
    for n in result.notes:
        err.write(f"[torchscope] note: {p(n)}\n")
    paths = trace_paths(result)
    if paths:
        err.write(f"[torchscope] trace: {p(', '.join(paths))}\n")
    if written:
        err.write(f"[torchscope] report: {written['report.html']}\n")
    err.write(f"[torchscope] run {outcome.run_id} (History)\n")
    err.flush()


if __name__ == "__main__":
    sys.exit(main())
