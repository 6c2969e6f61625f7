"""Fix trials on the user's own script: ``python -m diagnostics run --try FIX[,FIX...] -- COMMAND``.

Each run is the script started afresh (an attached run whose folder holds a trial.json: the bootstrap loads
the trial guest, diagnostics/attach/fixes.py, which applies the candidate's fixes, times the steps after the
warm-up and ends the script at a step boundary). The candidates (the baseline, the A/A ``control``, which is
the baseline once more, and each fix) run in interleaved rounds, each round in a fresh random order
(measure.compare.Rounds, one run per candidate per round: nothing carries over between processes, so no
palindrome is needed to cancel a neighbour's carry-over); a run's time is the mean of its timed steps. A fix
found not applicable, or whose run crashed, leaves the rounds at once (its row says why); the others go on.
When two or more fixes come out faster, they are tried together in rounds of their own against the
baseline. Stop (the event, SIGTERM, Ctrl-C) ends the current run's whole process tree and keeps every round
measured until then. The record (``trials.json``) is written after every round; the analysis
(diagnostics/analyses/trials/job.py) reads it into the result, which is stored in History.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from diagnostics.analyses.attach.protocol import AttachConfig, read_json
from diagnostics.analyses.trials import DEFAULT_ROUNDS, DEFAULT_STEPS, DEFAULT_WARMUP
from diagnostics.analyses.trials.job import BASELINE, RECORD, build_result
from diagnostics.analyses.trials.protocol import OUTCOME_PREFIX, OUTPUT, TrialConfig, parse_fixes
from diagnostics.analyses.trials.result import TrialsResult
from diagnostics.attach.command import Command, UsageError
from diagnostics.attach.session import Session
from diagnostics.measure.compare import CONTROL, SEED, Rounds

#: Seconds one run of the script may take before it is stopped and its row marked failed.
RUN_TIMEOUT_S = 300.0
#: Lines of the script's output kept in a failed row's reason (its traceback's end).
FAILURE_LINES = 6


class Stopped(Exception):
    """Stop, Ctrl-C or SIGTERM during the trials."""


class BaselineFailed(Exception):
    """The script fails as it is: nothing can be compared with it."""


class _TrialSession(Session):
    """One run of the script: its output into the run folder's output.log (its traceback is a failed row's
    reason), nothing analysed or stored per run."""

    def _stdio(self) -> dict:
        self._log = open(Path(self.run_dir) / OUTPUT, "wb")
        return {"stdin": subprocess.DEVNULL, "stdout": self._log, "stderr": subprocess.STDOUT}

    def _finish(self, out):
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
        return out


@dataclass
class TrialsOutcome:
    run_id: str | None
    folder: str
    result: TrialsResult | None
    error: str | None = None
    notes: list = field(default_factory=list)


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", key)[:60]


def _tail(path: Path, lines: int = FAILURE_LINES) -> str:
    try:
        text = path.read_bytes()[-16384:].decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [ln for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(kept)


def read_outcome(run_dir: Path) -> dict | None:
    """The guest's outcome from the process that stepped the most (DataLoader workers write none that step)."""
    best = None
    for p in Path(run_dir).glob(f"{OUTCOME_PREFIX}*.json"):
        o = read_json(str(p), None)
        if o and (best is None or o.get("steps_seen", 0) > best.get("steps_seen", 0)):
            best = o
    return best


class Trials:
    """Try ``fixes`` on ``command``: ``rounds`` rounds of ``steps`` timed steps after ``warmup`` per run.
    ``store``: a diagnostics.store.Store (the run lands in History) or None (``folder``, or a temporary one);
    ``on_progress(fraction, message, live)`` after each run; ``stop`` ends it as Stop does."""

    def __init__(self, command: Command, fixes, *, steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
                 rounds: int = DEFAULT_ROUNDS, seed: int = SEED, store=None, source: str = "cli",
                 folder: str | None = None, stop: threading.Event | None = None, timeout_s: float | None = None,
                 run_timeout_s: float = RUN_TIMEOUT_S, compile_backend: str = "inductor", combine: bool = True,
                 on_progress: Callable[[float, str, dict], None] | None = None):
        try:
            self.fixes = parse_fixes(fixes)
        except ValueError as e:
            raise UsageError(str(e)) from None
        for name, v, lo in (("--steps", steps, 1), ("--warmup", warmup, 1), ("--rounds", rounds, 1)):
            if int(v) < lo:
                raise UsageError(f"{name} must be at least {lo}, got {v}")
        self.command, self.steps, self.warmup, self.rounds = command, int(steps), int(warmup), int(rounds)
        self.seed, self.store, self.source, self.compile_backend = seed, store, source, compile_backend
        self.stop = stop or threading.Event()
        self.timeout_s, self.run_timeout_s, self.combine = timeout_s, run_timeout_s, combine
        self.on_progress = on_progress or (lambda f, m, live: None)
        self.run_id = None
        self._folder = folder
        self.runs: list[dict] = []
        self.notes: list[str] = []
        self.dead: set[str] = set()  # keys out of the rounds: not applicable or failed
        self.status = "ok"
        self.live = {"phase": "starting", "round": 0, "rounds": self.rounds, "candidate": None, "runs": 0}

    # ------------------------------------------------------------------ one run
    def _run_once(self, key: str, fixes: tuple[str, ...], round_no: int) -> float:
        if self.stop.is_set():
            raise Stopped()
        d = self.folder / "runs" / f"{len(self.runs):03d}-{_slug(key)}"
        d.mkdir(parents=True, exist_ok=True)
        TrialConfig(fixes=fixes, warmup=self.warmup, steps=self.steps, compile_backend=self.compile_backend,
                    label=key).write(str(d))
        self.live.update(phase="trying", candidate=key, round=round_no)
        self.on_progress(self._fraction(), f"round {round_no}/{self.rounds}: {key}", dict(self.live))
        session = _TrialSession(self.command, AttachConfig(), run_dir=str(d), stop=self.stop,
                                timeout_s=self.run_timeout_s)
        out = session.run()
        o = read_outcome(d)
        run = {"key": key, "fixes": list(fixes), "round": round_no, "dir": str(d), "exit_code": out.exit_code,
               "duration_s": out.duration_s, "outcome": o, "error": None}
        self.runs.append(run)
        self.live["runs"] = len(self.runs)
        timed_out = out.stop_reason.startswith("stopped after the --timeout")
        if out.interrupted and not timed_out:
            run.update(error=f"stopped ({out.stop_reason})", stopped=True)
            self.stop.set()
            raise Stopped()
        done = bool(o and o.get("done"))
        not_applicable = bool(o and o.get("ended_by_us") and not done)
        if not done and not not_applicable:
            seen = (o or {}).get("steps_seen", 0)
            if timed_out:
                why = f"the run took longer than {self.run_timeout_s:g} s and was stopped after {seen} steps"
            elif out.exit_code not in (0, None):
                why = f"the script exited with code {out.exit_code} after {seen} steps"
            elif out.error:
                why = out.error
            else:
                why = (f"the script ended after {seen} steps, before the {self.warmup} warm-up and {self.steps} timed "
                       "steps were done (give it more steps, or lower --steps)")
            tail = _tail(d / OUTPUT)
            run["error"] = why + (f": {tail}" if tail else "")
            self.dead.add(key)
            if key == BASELINE:
                raise BaselineFailed()
            return math.nan
        if not_applicable:
            self.dead.add(key)
            return math.nan
        ms = o.get("step_ms") or []
        return sum(ms) / len(ms) if ms else math.nan

    def _fraction(self) -> float:
        per_round = 2 + len(self.fixes)
        return min(0.99, len(self.runs) / max(1, per_round * self.rounds))

    # ------------------------------------------------------------------ the rounds
    def _timer(self, key: str, fixes: tuple[str, ...]):
        def run():
            return self._run_once(key, fixes, self._round_no())
        return run

    def _round_no(self) -> int:
        """The round being run (1-based) of the rounds running now (the main ones, then the combination's)."""
        return self._current.done + 1

    # ------------------------------------------------------------------ the record
    def _record(self) -> dict:
        main = getattr(self, "_main_rounds", None)
        rec = {"command": list(self.command.argv), "cwd": self.command.cwd, "fixes": list(self.fixes),
               "steps": self.steps, "warmup": self.warmup, "rounds": self.rounds, "seed": self.seed,
               "status": self.status, "notes": list(self.notes), "folder": str(self.folder),
               "round_ms": _round_ms(main) if main else {}, "orders": main.orders if main else [],
               "runs": self.runs, "combination": None}
        combo = getattr(self, "_combo", None)
        if combo:
            rec["combination"] = {"key": combo["key"], "fixes": combo["fixes"],
                                  "round_ms": _round_ms(combo["rounds"]) if combo.get("rounds") else {}}
        return rec

    def _write(self) -> None:
        tmp = self.folder / f"{RECORD}.tmp"
        tmp.write_text(json.dumps(self._record(), default=str))
        tmp.replace(self.folder / RECORD)

    # ------------------------------------------------------------------ the whole
    def run(self) -> TrialsOutcome:
        if self.store is not None:
            self.run_id = self.store.create_run(
                "trials", spec=None, options={"command": list(self.command.argv), "cwd": self.command.cwd,
                                              "fixes": list(self.fixes), "steps": self.steps, "warmup": self.warmup,
                                              "rounds": self.rounds},
                cache_key=None, model_label=self.command.label, device=None, source=self.source)
            self.folder = Path(self.store.artifact_dir(self.run_id))
        else:
            import tempfile

            self.folder = Path(self._folder or tempfile.mkdtemp(prefix="torchscope-trials-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, lambda s, f: self.stop.set()) if in_main else None
        timer = None
        if self.timeout_s:
            timer = threading.Timer(self.timeout_s, self._time_up)
            timer.daemon = True
            timer.start()
        t0 = time.monotonic()
        error = None
        try:
            timers = {BASELINE: self._timer(BASELINE, ()), CONTROL: self._timer(CONTROL, ())}
            for f in self.fixes:
                timers[f] = self._timer(f, (f,))
            try:
                self._main_rounds = None
                r = Rounds(timers, baseline=BASELINE, seed=self.seed, reverse=False)
                self._main_rounds = r
                self._current = r
                try:
                    self._loop(r)
                except BaselineFailed:
                    pass
                if BASELINE in self.dead:
                    self.status = "failed"
                    error = "the script fails as it is (the baseline run): " + next(
                        x["error"] for x in self.runs if x["key"] == BASELINE and x["error"])
                elif self.combine:
                    self._combination()
            except (Stopped, KeyboardInterrupt):
                self.status = "stopped"
                self.notes.insert(0, getattr(self, "_stop_why", "stopped by the user") +
                                  ": every run's process tree was ended; the rounds measured until then are kept")
            self._write()
            result = build_result(self._record(), str(self.folder))
        finally:
            if timer is not None:
                timer.cancel()
            if in_main and previous is not None:
                signal.signal(signal.SIGTERM, previous)
        self.live.update(phase="done")
        self.on_progress(1.0, "done", dict(self.live))
        if self.store is not None:
            status = {"ok": "ok", "stopped": "cancelled", "failed": "error"}[self.status]
            self.store.finish_run(self.run_id, status, result=result,
                                  error=error or ("the trials were stopped" if self.status == "stopped" else None),
                                  artifacts={RECORD: str(self.folder / RECORD)})
        return TrialsOutcome(self.run_id, str(self.folder), result, error)

    def _time_up(self) -> None:
        self._stop_why = f"stopped after the --timeout of {self.timeout_s:g} s"
        self.stop.set()

    def _loop(self, r: Rounds) -> None:
        for i in range(self.rounds):
            if self.fixes and all(f in self.dead for f in self.fixes) and i > 0:
                self.notes.append(f"every fix left the rounds after round {i} (not applicable or failed): the "
                                  "later rounds were not run")
                break
            r.run()
            for k in r.running:
                if k in self.dead:
                    r.decided[k] = {}  # out of the later rounds; its row says why
            self._write()
            if BASELINE in self.dead:
                return

    def _combination(self) -> None:
        partial = build_result(self._record(), str(self.folder))
        faster = [t.fix for t in partial.trials[2:] if t.verdict == "faster"]
        if len(faster) < 2:
            return
        key = "+".join(faster)
        self._combo = {"key": key, "fixes": faster, "rounds": None}
        timers = {BASELINE: self._timer(BASELINE, ()), key: self._timer(key, tuple(faster))}
        r = Rounds(timers, baseline=BASELINE, seed=self.seed + 1, reverse=False)
        self._combo["rounds"] = r
        self._current = r
        for _ in range(self.rounds):
            try:
                r.run()
            except BaselineFailed:
                self.notes.append("the baseline failed during the combination's rounds: they were cut short")
                self.dead.discard(BASELINE)
                break
            self._write()
            if key in self.dead:
                break


def _round_ms(r: Rounds) -> dict:
    return {k: [None if (v is None or not math.isfinite(v)) else v for v in vs] for k, vs in r.round_ms.items()}
