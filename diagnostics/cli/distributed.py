"""``python -m diagnostics distributed ...``: launch and analyse distributed runs from a terminal.

    distributed run --model mlp --nproc 2 --steps 5 [--straggler-rank 1 --straggler-ms 200] [--json]
    distributed analyze DIR [--json]              one trace per rank, e.g. copied from several nodes
    distributed command --nnodes 2 --nproc 8 --rdzv-endpoint HOST:29400 --out DIR
                                                  write job.json and print the torchrun line per node

Exit codes: 0 ok, 1 the run or analysis failed, 2 bad usage or input (unknown model, missing folder,
a folder without traces, options that do not fit), 130 interrupted.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from pathlib import Path

from diagnostics.cli.model_args import add_model_args, build_spec
from diagnostics.cli.report_folder import add_report_args, report_dir, write_report
from diagnostics.analyses.distributed import DISTRIBUTED, DISTRIBUTED_TRACES
from diagnostics.analyses.distributed.result import DistributedResult
from diagnostics.cli.options import add_option, dest
from diagnostics.results import to_json
from diagnostics.units import human_bytes

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: Job errors that mean "what you gave cannot be used" (exit 2) rather than "the run failed" (exit 1).
INPUT_ERRORS = ("DistributedInputError", "TorchScopeError", "SpecError", "ModelLoadError", "TrustError",
                "UsageError", "TraceError")
#: Of ``--timeout``, the launch gets all but this many seconds (model load, analysis, report)...
LAUNCH_RESERVE_S = 30.0
#: ...and never less than this share of it, so a short --timeout still leaves the run its time.
LAUNCH_MIN_SHARE = 0.8
#: How long an injected straggler sleeps per step when --straggler-rank is given without --straggler-ms.
DEFAULT_STRAGGLER_MS = 150.0
#: The declared options each subcommand offers as flags (the declaration gives type, bounds, help, default).
MODEL_OPTIONS = ("nproc", "steps", "warmup", "backend")
INJECT_OPTIONS = ("straggler_rank", "straggler_sleep_ms", "die_rank", "die_step", "die_how")
THRESHOLD_OPTIONS = ("straggler_margin", "straggler_min_ms", "comm_kernels")


def launch_timeout_s(total_s: float) -> float:
    """Seconds the torchrun launch may take within a job timeout of ``total_s``: 600 -> 570, 20 -> 16."""
    return max(total_s - LAUNCH_RESERVE_S, LAUNCH_MIN_SHARE * total_s)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # exit 2 with the message, as argparse does, but testable
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m diagnostics distributed",
                description="Distributed (torchrun + DDP) runs: per-rank step time, computation vs "
                            "communication, collectives, stragglers.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    def declared(q, analysis, keys):
        g = q.add_argument_group(f"{analysis.name} options")
        for key in keys:
            add_option(g, analysis.option(key))

    def thresholds(q, analysis):  # and the run and report options
        declared(q, analysis, THRESHOLD_OPTIONS)
        q.add_argument("--json", action="store_true", help="print the result as JSON")
        add_report_args(q, analysis.name)

    def model(q):  # the model description of the other commands (diagnostics.cli.model_args.build_spec)
        add_model_args(q, default_model="mlp", per_rank=True, device=False)
        declared(q, DISTRIBUTED, MODEL_OPTIONS)

    r = sub.add_parser("run", help="launch DDP training with torchrun here and analyse every rank")
    model(r)
    declared(r, DISTRIBUTED, INJECT_OPTIONS)
    r.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before the run is stopped (default 600; the torchrun launch gets all but 30 s "
                        "of it, and at least 80 %%)")
    thresholds(r, DISTRIBUTED)
    a = sub.add_parser("analyze", help="analyse a folder of per-rank traces (one file per rank)")
    a.add_argument("dir", help="folder with rank*.pt.trace.json(.gz) files")
    thresholds(a, DISTRIBUTED_TRACES)
    c = sub.add_parser("command", help="write job.json and print the torchrun command for a multi-node run")
    model(c)
    c.add_argument("--nnodes", type=int, default=1)
    c.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous (node 0); required with --nnodes > 1, "
                                                "omit for one machine")
    c.add_argument("--out", required=True, help="folder every rank writes its trace to (the same path on each "
                                                "node, e.g. a shared file system)")
    return p


def _options(args, keys) -> dict:
    """The declared options given on the command line (the declaration fills in the rest)."""
    return {k: getattr(args, dest(DISTRIBUTED.option(k))) for k in keys
            if getattr(args, dest(DISTRIBUTED.option(k)), None) is not None}


def _spec(args):
    """The same ModelSpec the other commands build (a sample or a model file), device by --backend."""
    return build_spec(args.model, kind=args.kind, weights=args.weights, trust=args.trust, inputs=args.inputs,
                      batch_size=args.batch_size, device="cuda:0" if args.opt_backend == "nccl" else "cpu",
                      seed=args.seed)


def format_result(res: DistributedResult) -> str:
    m = res.metrics
    lines = [f"{m.ranks_loaded} of {m.world_size} ranks, backend {res.backend}, {res.device_kind}, "
             f"{m.steps_per_rank} profiled steps per rank",
             f"median step {m.median_step_ms:.2f} ms; communication {100 * m.comm_fraction:.1f} % of step "
             f"time, exposed {100 * m.exposed_comm_fraction:.1f} %; overlap ratio "
             + ("n/a" if m.overlap_ratio is None else f"{100 * m.overlap_ratio:.1f} %"),
             "",
             f"{'rank':>4} {'step ms':>9} {'busy ms':>9} {'compute':>9} {'comm':>9} {'overlap':>9} "
             f"{'exposed':>9} {'other':>9} {'limit ms':>9}  straggler"]
    for r in res.ranks:
        limit = r.threshold_ms
        lines.append(f"{r.rank:>4} {r.step_ms:>9.2f} {r.busy_ms:>9.2f} {r.compute_ms:>9.2f} "
                     f"{r.comm_ms:>9.2f} {r.overlap_ms:>9.2f} {r.exposed_comm_ms:>9.2f} "
                     f"{r.other_ms:>9.2f} {'-' if limit is None else f'{limit:.2f}':>9}  "
                     f"{'YES' if r.straggler else ''}")
    lines += ["", straggler_line(res), "", "collectives:"]
    for c in res.collectives[:15]:
        size = human_bytes(c.mean_bytes) if c.mean_bytes is not None else "size not recorded"
        lines.append(f"  {c.name:<32} {c.where:<4} {c.calls:>6} calls  total {c.total_ms:>9.3f} ms  "
                     f"mean {c.mean_ms:>8.3f} ms  {size}")
    lines += [f"note: {n}" for n in res.notes]
    files = [r.file for r in res.ranks if r.file]
    if res.folder and files:
        shown = ", ".join(files[:4]) + (f", ... ({len(files)} files)" if len(files) > 4 else "")
        lines += ["", f"per-rank traces: {res.folder} ({shown}); open one in https://ui.perfetto.dev, or "
                      f"analyse them again: python -m diagnostics distributed analyze {shlex.quote(res.folder)}"]
    return "\n".join(lines)


def straggler_line(res: DistributedResult) -> str:
    """'stragglers: rank 1 (...)' with the leave-one-out rule and the busiest rank's figures."""
    t, ranks = res.thresholds, res.ranks
    names = ", ".join(f"rank {r}" for r in res.stragglers) or "none"
    if len(ranks) < 2:
        return f"stragglers: {names} (one rank: nothing to compare with)"
    rule = (f"a rank straggles when its busy time is over the median of the other ranks + max({t.margin:.0%}, "
            f"{t.min_excess_ms:g} ms)")
    cr = t.compared_rank
    busy = next((r.busy_ms for r in ranks if r.rank == cr), None)
    if busy is None:
        return f"stragglers: {names} (busy time over {t.threshold_ms:.2f} ms; {rule})"
    verdict = "over" if busy > t.threshold_ms else "within"
    return (f"stragglers: {names} (busiest rank {cr}: {busy:.2f} ms, {verdict} {t.threshold_ms:.2f} ms = the "
            f"other ranks' median {t.median_ms:.2f} ms + {t.threshold_ms - t.median_ms:.2f} ms; {rule})")


def _emit(res: DistributedResult, as_json: bool) -> None:
    sys.stdout.write((to_json(res, indent=1) if as_json else format_result(res)) + "\n")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C outside the job (parsing, imports, writing the job): one line, 130
        sys.stderr.write("\nerror: interrupted (Ctrl-C)\n")
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_OK if e.code in (0, None) else EXIT_USAGE
    from diagnostics.errors import TorchScopeError

    try:
        if args.cmd == "command":
            return _command(args)
        if args.cmd == "run" and not args.timeout > 0:
            raise SystemExit(f"bad --timeout {args.timeout:g}: must be positive seconds")
        from diagnostics.runner import Job, run_job
        from diagnostics.store import Store

        options = _options(args, THRESHOLD_OPTIONS)
        if args.cmd == "analyze":
            if not Path(args.dir).expanduser().is_dir():
                raise SystemExit(f"trace folder not found: {args.dir}")
            job = Job("distributed_traces", None, {"trace_dir": args.dir, **options})
            timeout = None
        else:
            options.update(_options(args, MODEL_OPTIONS + INJECT_OPTIONS), run_timeout_s=launch_timeout_s(args.timeout))
            if options.get("straggler_rank") is not None:
                options.setdefault("straggler_sleep_ms", DEFAULT_STRAGGLER_MS)
            job = Job("distributed", _spec(args), options)
            timeout = args.timeout
        out_dir = report_dir(args.out, args.no_report, job.analysis)
        store = Store()
        for note in store.notices:  # e.g. an unreadable run store, moved aside
            sys.stderr.write(f"warning: {note}\n")
    except SystemExit as e:
        sys.stderr.write(f"error: {e.code}\n")
        return EXIT_USAGE
    except TorchScopeError as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_USAGE
    # Ctrl-C: stop the worker (which kills torchrun and every rank), record the run as cancelled.
    cancel = threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set()) if in_main else None
    try:
        outcome = run_job(job, store=store, timeout_s=timeout, source="cli", cancel=cancel,
                          on_progress=lambda f, m: sys.stderr.write(f"[{100 * f:3.0f} %] {m}\n"))
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    if cancel.is_set():
        sys.stderr.write(f"error: distributed {args.cmd} interrupted (Ctrl-C)"
                         + (f"; run {outcome.run_id} recorded as cancelled" if outcome.status == "cancelled" else "")
                         + "\n")
        return EXIT_INTERRUPTED
    if not outcome.ok:
        sys.stderr.write(f"error: {outcome.error}\n")
        return EXIT_USAGE if outcome.error_type in INPUT_ERRORS and outcome.status == "error" else EXIT_FAILED
    written = None
    if out_dir is not None:
        written = write_report(job.analysis, outcome.result, out_dir, _rank_traces(job, outcome),
                               title=_report_title(job), run_id=outcome.run_id)
        if written is None:
            return EXIT_FAILED
    _emit(outcome.result, args.json)
    if written:
        (sys.stderr if args.json else sys.stdout).write(f"report: {written['report.html']}\n")
    return EXIT_OK


def _rank_traces(job, outcome) -> dict:
    """A launched run's per-rank traces, copied into its report folder (``analyze`` reads the user's own)."""
    if job.analysis != "distributed":
        return {}
    ranks = Path(outcome.artifact_dir or "") / "distributed"  # where the ranks wrote them
    return {p.name: str(p) for p in sorted(ranks.glob("rank*"))}


def _report_title(job) -> str:
    if job.analysis == "distributed":
        return "TorchScope distributed run"
    return f"TorchScope distributed traces: {Path(job.options['trace_dir']).name}"


def _command(args) -> int:
    from diagnostics.analyses.distributed.dist_job import DistJob
    from diagnostics.analyses.distributed.launch import torchrun_command

    if args.nnodes < 1:
        raise SystemExit(f"bad --nnodes {args.nnodes}: must be at least 1")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise SystemExit(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (node 0's address, reachable from "
                         "every node); without it torchrun runs one standalone node")
    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    o = DISTRIBUTED.validate(_options(args, MODEL_OPTIONS))
    job = DistJob(spec=_spec(args).to_dict(), out_dir=str(out), steps=o["steps"], warmup=o["warmup"],
                  backend=o["backend"])
    (out / "job.json").write_text(job.to_json())
    cmd = torchrun_command(out / "job.json", o["nproc"], nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint,
                           python="python")
    spec = job.spec
    need = "" if spec.get("source") == "sample" else "".join(
        f"note: every node reads {what} at {spec[key]}: it must be there on each node\n"
        for key, what in (("path", "the model file"), ("weights_path", "the weights")) if spec.get(key))
    sys.stdout.write(f"wrote {out / 'job.json'}\n{need}run on every node (from the TorchScope folder):\n  "
                     f"{shlex.join(cmd)}\nthen: python -m diagnostics distributed analyze {out}\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
