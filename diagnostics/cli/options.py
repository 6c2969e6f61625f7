"""Per-analysis command-line options: flag -> key of the options dict the analysis receives.

Only the options a user actually passes go into the dict, so an analysis' own defaults apply (and
a CLI run with no options has the same cache key as the dashboard's run with defaults). Any other
key the analysis reads can be passed with ``--option key=value`` (JSON-parsed); OPTION_KEYS says
which keys each analysis reads, and an unknown key is refused (a typo must not be silently ignored).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Callable

from diagnostics.cli.model_args import UsageError


@dataclass(frozen=True)
class Opt:
    flag: str  # "--mode"
    key: str  # the analysis' option key, "mode"
    type: Callable = str
    help: str = ""
    choices: tuple | None = None
    repeat: bool = False  # may be given several times; the analysis gets a list
    flag_only: bool = False  # a switch: present -> const
    const: object = True
    required: bool = False

    @property
    def dest(self) -> str:
        return "opt_" + self.key

    def add_to(self, group) -> None:
        if self.flag_only:
            group.add_argument(self.flag, dest=self.dest, action="store_const", const=self.const, default=None,
                               help=self.help)
        elif self.repeat:
            group.add_argument(self.flag, dest=self.dest, action="append", type=self.type, default=None,
                               help=self.help, choices=self.choices)
        else:
            group.add_argument(self.flag, dest=self.dest, type=self.type, default=None, help=self.help,
                               choices=self.choices, required=self.required)


def positive_int(text: str) -> int:
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{v} must be positive")
    return v


def non_negative_int(text: str) -> int:
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must be 0 or more")
    return v


def positive_float(text: str) -> float:
    import argparse

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{v} must be positive")
    return v


def score(text: str) -> float:
    import argparse

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= v <= 100:
        raise argparse.ArgumentTypeError(f"{v:g} is not a score between 0 and 100")
    return v


#: analysis -> options it takes from the command line (keys as the analysis module reads them;
#: defaults are the analysis' own, see its DEFAULTS / validate_options).
ANALYSIS_OPTIONS: dict[str, tuple[Opt, ...]] = {
    "summary": (
        Opt("--skip-backward", "skip_backward", flag_only=True, help="count forward FLOPs only"),
    ),
    "profile": (
        Opt("--mode", "mode", choices=("inference", "train"), help="profile inference (default) or training steps"),
        Opt("--steps", "active", positive_int, help="profiled (active) steps per cycle (default 3)"),
        Opt("--warmup", "warmup", non_negative_int, help="profiler warm-up steps (default 1)"),
        Opt("--optimizer", "optimizer", choices=("sgd", "adamw"), help="optimizer of training steps (default sgd)"),
        Opt("--lr", "lr", positive_float, help="learning rate of training steps (default 0.01)"),
        Opt("--latency-iters", "latency_iters", positive_int,
            help="timed iterations outside the profiler (default 30)"),
        Opt("--latency-warmup", "latency_warmup", non_negative_int, help="untimed iterations first (default 5)"),
        Opt("--profile-memory", "profile_memory", flag_only=True, help="record memory events too"),
        Opt("--with-stack", "with_stack", flag_only=True, help="record Python stacks (slower, larger trace)"),
    ),
    "memory": (
        Opt("--optimizer", "optimizer", choices=("sgd", "adamw"), help="optimizer of the training step "
                                                                      "(default adamw)"),
        Opt("--lr", "lr", positive_float, help="learning rate (default 0.001)"),
        Opt("--no-timeline", "timeline", flag_only=True, const=False, help="skip the memory timeline"),
    ),
    "batch_scan": (
        Opt("--mode", "mode", choices=("train", "inference"), help="scan training steps (default) or inference"),
        Opt("--max-batch", "max_batch", positive_int, help="largest batch to try (default 64)"),
        Opt("--memory-budget-mb", "memory_budget_mb", positive_float,
            help="memory budget in MiB (default: the GPU's memory, or half the free RAM on the CPU)"),
        Opt("--repeats", "repeats", positive_int, help="timed passes per batch size (default 5)"),
        Opt("--optimizer", "optimizer", choices=("sgd", "adamw"), help="optimizer of training steps (default sgd)"),
    ),
    "gradients": (
        Opt("--steps", "steps", positive_int, help="training steps to watch (default 5)"),
        Opt("--optimizer", "optimizer", choices=("sgd", "adamw"), help="optimizer (default sgd)"),
        Opt("--lr", "lr", positive_float, help="learning rate (default 0.01)"),
    ),
    "checklist": (
        Opt("--purpose", "purpose", choices=("training", "inference"), help="what the model is for (default "
                                                                            "training)"),
        Opt("--iters", "iters", positive_int, help="timed repetitions, 1-100"),
        Opt("--profile-steps", "profile_steps", positive_int, help="profiled steps, 1-20"),
    ),
    "optimize": (
        Opt("--fix", "fixes", repeat=True, help="a fix id to try (repeat for several; default: every fix)"),
        Opt("--iters", "iters", positive_int, help="timed calls per trial (default 10)"),
        Opt("--warmup", "warmup", non_negative_int, help="untimed calls per trial first (default 2)"),
    ),
    "distributed": (
        Opt("--nproc", "nproc", positive_int, help="processes (ranks) to launch with torchrun (default 2)"),
        Opt("--steps", "steps", positive_int, help="profiled training steps per rank (default 5)"),
        Opt("--backend", "backend", choices=("auto", "gloo", "nccl"), help="process-group backend (default auto)"),
    ),
    "distributed_traces": (
        Opt("--trace-dir", "trace_dir", required=True, help="a folder of per-rank Chrome traces"),
    ),
}

#: Options the CLI itself uses (not passed to the analysis).
CLI_ONLY: dict[str, tuple[Opt, ...]] = {
    "checklist": (
        Opt("--fail-under", "fail_under", score, help="exit 3 when the checklist score (0-100) is below this: "
                                                     "a CI gate"),
    ),
}


#: analysis -> the option keys it reads: "module:NAME" for the keys of the analysis' own defaults dict
#: (its DEFAULTS), or the keys themselves for an analysis that checks its options in code.
OPTION_KEYS: dict[str, str | tuple[str, ...]] = {
    "summary": ("skip_backward",),
    "profile": "diagnostics.analyses.profile.job:DEFAULTS",
    "memory": "diagnostics.analyses.memory.job:DEFAULTS",
    "batch_scan": "diagnostics.analyses.batch_scan.job:DEFAULTS",
    "gradients": "diagnostics.analyses.gradients.job:DEFAULTS",
    # diagnostics.analyses.checklist.job.validate_options and diagnostics.analyses.checklist.facts.collect_facts
    "checklist": ("purpose", "iters", "profile_steps", "dataloader", "dataset_path", "skip_measured"),
    # diagnostics.analyses.optimize.job.validate_options and analyze
    "optimize": ("fixes", "params", "iters", "warmup", "save_artifacts"),
    # diagnostics.analyses.distributed.job.analyze (when the generic command runs it)
    "distributed": ("nproc", "steps", "warmup", "backend", "pg_timeout_s", "run_timeout_s", "straggler_rank",
                    "straggler_sleep_ms", "die_rank", "die_step", "die_how", "straggler_margin",
                    "straggler_min_ms", "trace_dir"),
}


def option_keys(analysis: str) -> tuple[str, ...] | None:
    """The option keys ``analysis`` reads (None: not known here, nothing is checked)."""
    where = OPTION_KEYS.get(analysis)
    if where is None or isinstance(where, tuple):
        return where
    module, _, name = where.partition(":")
    return tuple(getattr(importlib.import_module(module), name))


def check_option_keys(analysis: str, options: dict) -> None:
    """Refuse keys ``analysis`` does not read, listing the valid ones (UsageError, so exit 2)."""
    if not options:
        return
    known = option_keys(analysis)
    if known is None:
        return
    unknown = [k for k in options if k not in known]
    if unknown:
        listed = ", ".join(known) if known else "(none: it takes no options)"
        flags = {o.flag.lstrip("-").replace("-", "_"): o for o in ANALYSIS_OPTIONS.get(analysis, ())}
        hints = [f"{flags[k].flag} sets {flags[k].key!r}" for k in unknown if k in flags and flags[k].key != k]
        raise UsageError(f"unknown --option key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                         f"for {analysis}; valid keys: {listed}" + (f" ({'; '.join(hints)})" if hints else ""))


def collect_options(analysis: str, args) -> dict:
    """The options the user set for ``analysis`` (unset flags are left to the analysis' defaults)."""
    out = {}
    for o in ANALYSIS_OPTIONS.get(analysis, ()):
        v = getattr(args, o.dest, None)
        if v is not None:
            out[o.key] = v
    return out


def parse_option_pairs(pairs: list[str]) -> dict:
    """['steps=3', 'mode=train', 'sizes=[1,2]'] -> {'steps': 3, 'mode': 'train', 'sizes': [1, 2]}."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"bad --option {pair!r}: write KEY=VALUE, e.g. --option steps=3")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # a bare word: the string itself
    return out
