"""Fix trials against the hand edit: does ``run --try FIX`` say what making the change by hand buys?

    .venv/bin/python bench/bench_trials_hand_edit.py --script NAME [--mingpt DIR] [--rounds 6] [--steps 10]
                                                     [--out FILE]
    .venv/bin/python bench/bench_trials_hand_edit.py --write FILE [FILE ...]

Two public training scripts (``--script``):

* ``mingpt-adder``: karpathy/minGPT's ``projects/adder/adder.py`` (MIT licence; github.com/karpathy/minGPT, read
  at 37baab7; not vendored: DIR is a checkout, ``--mingpt``), a GPT learning to add, its data generated in the
  script; run with ``--data.ndigit=3 --trainer.batch_size=16 --trainer.num_workers=0`` so a step takes tens of
  ms on a CPU and its start-up evaluation 10 batches;
* ``word-language-model``: pytorch/examples' ``word_language_model/main.py`` (BSD-3, vendored in
  tests/data/pytorch_examples, see its SOURCE.md), its Transformer with ``--use-optimizer`` (AdamW) on a
  corpus generated here in wikitext's layout (``--corpus-words`` words in ``--vocab`` kinds: one epoch holds
  more batches than a run steps, so no evaluation or checkpoint falls inside the timed steps).

For each fix, two measurements on the same machine, in the same session:

1. ``Trials`` (what ``run --try`` runs): the script as it is and with the fix applied by the bootstrap, in
   interleaved rounds with the A/A control: the fix's speed-up and its 95 % interval;
2. the hand edit: a copy of the script's folder with the change written into its source (the ``changes`` line
   ``--try`` prints, made by hand), its runs against the unedited script's in interleaved rounds of their
   own (measure.compare.Rounds, one run each per round, a fresh random order, the unedited script run twice:
   the second is this arm's A/A control), each run timed as the trials time a run (the trial guest with no
   fix: the same steps, the same end).

Agreement (``agreement``): the hand edit's speed-up lies within the fix's interval. ``--out`` writes the
figures as JSON; ``--write`` renders the JSON of one or more runs (one per script) into docs/BENCHMARKS.md's
section, keeping the section's hand-written ``### Reading`` as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.doc_section import BENCHMARKS, replace_section  # noqa: E402

TITLE = "## Fix trials against the hand edit (issue 40)"
READING = "### Reading"
EXAMPLES = ROOT / "tests" / "data" / "pytorch_examples"


@dataclass(frozen=True)
class Script:
    """A public training script: where it comes from, how it is run (``{corpus}``: the generated corpus) and,
    per fix, the hand edit: (file, the text as it is, the text as the hand edit writes it), the text there once."""
    name: str
    title: str
    argv: tuple
    edits: dict
    pythonpath: bool = False  # the script imports its package from its checkout


SCRIPTS = {s.name: s for s in (
    Script("mingpt-adder",
           "karpathy/minGPT (MIT, 37baab7) projects/adder/adder.py",
           ("projects/adder/adder.py", "--data.ndigit=3", "--trainer.batch_size=16", "--trainer.num_workers=0"),
           {"foreach_optimizer": ("mingpt/model.py",
                                  "optimizer = torch.optim.AdamW(optim_groups, lr=train_config.learning_rate, "
                                  "betas=train_config.betas)",
                                  "optimizer = torch.optim.AdamW(optim_groups, lr=train_config.learning_rate, "
                                  "betas=train_config.betas, foreach=True)"),
            "amp_bf16": ("mingpt/trainer.py",
                         "            logits, self.loss = model(x, y)\n",
                         "            with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                         "                logits, self.loss = model(x, y)\n")},
           pythonpath=True),
    Script("word-language-model",
           "pytorch/examples (BSD-3, 77f55b9) word_language_model/main.py",
           ("main.py", "--data", "{corpus}", "--model", "Transformer", "--use-optimizer", "--lr", "0.001",
            "--emsize", "128", "--nhid", "256", "--nlayers", "2", "--nhead", "2", "--batch_size", "16",
            "--bptt", "32", "--epochs", "1", "--save", "model.pt"),
           {"foreach_optimizer": ("main.py", "optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)",
                                  "optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=True)"),
            "fused_optimizer": ("main.py", "optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)",
                                "optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)"),
            # the training loop's call (12 spaces; evaluate's, 16, is not the one --try names)
            "amp_bf16": ("main.py", "\n            output = model(data)\n",
                         "\n            with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                         "                output = model(data)\n")}),
)}


def write_corpus(folder: Path, words: int, vocab: int, seed: int = 0) -> Path:
    """A generated corpus in wikitext's layout (train / valid / test), the same for a seed."""
    rng = random.Random(seed)
    kinds = [f"w{i}" for i in range(vocab)]
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", words), ("valid", words // 10), ("test", words // 10)):
        lines, left = [], n
        while left > 0:
            k = min(left, rng.randint(5, 20))
            lines.append(" ".join(rng.choice(kinds) for _ in range(k)))
            left -= k
        (folder / f"{name}.txt").write_text("\n".join(lines) + "\n")
    return folder


def edited_copy(src: Path, script: Script, fix: str, dest: Path) -> Path:
    """A copy of the script's folder with the hand edit for ``fix`` written into it."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git", "out", "__pycache__", "*.pt"))
    rel, old, new = script.edits[fix]
    text = (dest / rel).read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{rel}: the text to edit for {fix} is not there once: {old!r}")
    (dest / rel).write_text(text.replace(old, new))
    return dest


def agreement(tried: dict, hand: dict) -> dict:
    """Whether the hand edit's speed-up (``hand``: ratio_summary's dict) lies within the interval ``--try``
    gave the fix (``tried``: speedup, speedup_ci, applicable). ``agree`` is None where there is nothing to
    compare (the fix not applicable, no interval, no hand speed-up); ``why`` says which, or by how much."""
    ci, s = tried.get("speedup_ci"), hand.get("speedup")
    if tried.get("applicable") is False:
        return {"agree": None, "why": "--try found the fix not applicable: no speed-up to compare"}
    if not ci:
        return {"agree": None, "why": "--try gave no interval (too few rounds)"}
    if s is None:
        return {"agree": None, "why": "the hand edit has no speed-up (its runs failed)"}
    lo, hi = ci
    if lo <= s <= hi:
        return {"agree": True, "why": f"x{s:.2f} by hand within [{lo:.2f}, {hi:.2f}]"}
    side = "below" if s < lo else "above"
    return {"agree": False, "why": f"x{s:.2f} by hand {side} [{lo:.2f}, {hi:.2f}]"}


def measure(script: Script, folder: Path, args) -> dict:
    from diagnostics.attach.command import check_command
    from diagnostics.attach.trials import Trials
    from diagnostics.measure.compare import Rounds, ratio_summary

    fixes = args.fixes.split(",") if args.fixes else list(script.edits)
    unknown = [f for f in fixes if f not in script.edits]
    if unknown:
        raise SystemExit(f"no hand edit for {', '.join(unknown)} in {script.name}: {', '.join(script.edits)}")
    work = Path(tempfile.mkdtemp(prefix="bench-trials-hand-"))
    src = work / "script"
    shutil.copytree(folder, src, ignore=shutil.ignore_patterns(".git", "out", "__pycache__", "*.pt"))
    corpus = write_corpus(work / "corpus", args.corpus_words, args.vocab)
    argv = [a.format(corpus=corpus) for a in script.argv]
    # every run's environment, both arms alike: its thread count (the script sees it as torch's default)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    load0 = os.getloadavg()
    t0 = time.monotonic()

    def command(where: Path):
        if script.pythonpath:
            os.environ["PYTHONPATH"] = str(where)
        return check_command([sys.executable, *argv], str(where))

    # 1. run --try
    trials = Trials(command(src), ",".join(fixes), steps=args.steps, warmup=args.warmup, rounds=args.rounds,
                    folder=str(work / "trials"), combine=False,
                    on_progress=lambda f, m, live: print(f"[try] {m}", file=sys.stderr, flush=True))
    res = trials.run().result
    rows = {r.fix: r for r in res.trials}

    # 2. the hand edits, against the unedited script
    # "again": the unedited script once more, the hand arm's own A/A control (its luck, as the try's control shows)
    runners = {name: Trials(command(src), fixes[0], steps=args.steps, warmup=args.warmup, rounds=1,
                            folder=str(work / f"hand-{name}")) for name in ("bare", "again")}
    for fix in fixes:
        copy = edited_copy(folder, script, fix, work / f"edit-{fix}")
        runners[fix] = Trials(command(copy), fixes[0], steps=args.steps, warmup=args.warmup, rounds=1,
                              folder=str(work / f"hand-{fix}"))
    for t in runners.values():
        t.folder = Path(t._folder)
        t.folder.mkdir(parents=True, exist_ok=True)

    def timer(name):
        def run():
            if script.pythonpath:
                os.environ["PYTHONPATH"] = runners[name].command.cwd
            print(f"[hand] {name}", file=sys.stderr, flush=True)
            return runners[name]._run_once("baseline", (), 0)
        return run

    r = Rounds({name: timer(name) for name in runners}, baseline="bare", reverse=False)
    for _ in range(args.rounds):
        r.run()
    control = rows["control"]
    out = {"script": script.name, "title": script.title,
           "argv": [a.replace("{corpus}", "CORPUS") for a in script.argv],
           "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "cpus": os.cpu_count(),
           "threads": args.threads,
           "date": time.strftime("%Y-%m-%d"), "load_avg_start": load0, "load_avg_end": os.getloadavg(),
           "control": {"speedup": control.speedup, "speedup_ci": control.speedup_ci, "verdict": control.verdict,
                       "step_ms": control.step_ms, "round_ms": list(control.round_ms)},
           "baseline_step_ms": rows["baseline"].step_ms, "baseline_round_ms": list(rows["baseline"].round_ms),
           "hand_bare_ms": r.round_ms["bare"],
           "hand_control": {**ratio_summary(r.round_ms["bare"], r.round_ms["again"]), "round_ms": r.round_ms["again"]},
           "fixes": {}}
    for fix in fixes:
        hand = ratio_summary(r.round_ms["bare"], r.round_ms[fix])
        row = rows[fix]
        tried = {"speedup": row.speedup, "speedup_ci": row.speedup_ci, "verdict": row.verdict,
                 "applicable": row.applicable, "reason": row.reason, "change": row.change,
                 "step_ms": row.step_ms, "loss_max_rel_diff": row.loss_max_rel_diff, "round_ms": list(row.round_ms),
                 # the same runs against the A/A control's (the unchanged script too): how much of a speed-up is
                 # the baseline's own luck in these rounds
                 "vs_control": (ratio_summary(control.round_ms, row.round_ms)
                                if len(row.round_ms) == len(control.round_ms) else None)}
        out["fixes"][fix] = {"try": tried, "hand_edit": {**hand, "round_ms": r.round_ms[fix]},
                             "edit": script.edits[fix][0], **agreement(tried, hand)}
    out["wall_s"] = time.monotonic() - t0
    return out


def _x(s, ci=None) -> str:
    if s is None:
        return "-"
    return f"x{s:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def render(results: list[dict]) -> str:
    """The figures of one run per script as the section's tables (its fixed text above them)."""
    out = [TITLE, "",
           "`.venv/bin/python bench/bench_trials_hand_edit.py --script NAME [--mingpt DIR] --rounds R --steps S "
           "--out FILE`, then `... --write FILE [FILE ...]`: does `run --try FIX` say what the change made by hand "
           "buys? For each fix, `Trials` (the fix applied by the bootstrap, interleaved rounds with the A/A "
           "control: the speed-up and its 95 % interval), then a copy of the script's folder with the change "
           "written into its source (the `changes` line `--try` prints) timed against the unedited script in "
           "interleaved rounds of its own, each run timed as a trial's run is (the guest with no fix: the same "
           "steps, the same end). Agreement: the hand edit's speed-up lies within the fix's interval. The last "
           "column is the same try runs against the A/A control's (per round, control / fix): the unchanged script "
           "too, so where it differs from the `--try` column the baseline's runs were lucky or unlucky.", "",
           "Scripts: `mingpt-adder` is karpathy/minGPT's projects/adder/adder.py (MIT; not vendored: DIR is a "
           "checkout of github.com/karpathy/minGPT, read at 37baab7, e.g. `git archive` of it); "
           "`word-language-model` is pytorch/examples' word_language_model/main.py (BSD-3, vendored in "
           "tests/data/pytorch_examples), run on a corpus the bench generates (40 000 words of 2 000 kinds: an "
           "epoch holds more batches than a run steps, so no evaluation or checkpoint falls in a timed step). "
           "Every run has `OMP_NUM_THREADS=1` (`--threads`): on a shared machine a run's threads otherwise stall "
           "at each barrier whenever another process holds a core.", ""]
    for res in results:
        load = (f"load {res['load_avg_start'][0]:.1f} at the start, {res['load_avg_end'][0]:.1f} at the end")
        out += [f"**{res['title']}** `{' '.join(res['argv'])}`: {res['rounds']} rounds of {res['warmup']} warm-up + "
                f"{res['steps']} timed steps, OMP_NUM_THREADS={res.get('threads')} ({res['date']}, {res['cpus']} "
                f"cores, {load}, {res['wall_s']:.0f} s). "
                f"Baseline step {res['baseline_step_ms']:.1f} ms; A/A control "
                f"{_x(res['control']['speedup'], res['control']['speedup_ci'])} ({res['control']['verdict']})"
                + (f"; the hand arm's A/A control (the unedited script again) {_x(hc['speedup'], hc['speedup_ci'])}"
                   if (hc := res.get("hand_control")) else "") + ".", "",
                "| fix | the change `--try` names | `--try` (95 % interval) | verdict | by hand (95 % interval) | "
                "loss diff | agrees | `--try`'s runs against the control's |",
                "|---|---|---|---|---|---|---|---|"]
        for fix, f in res["fixes"].items():
            t, h = f["try"], f["hand_edit"]
            vc = t.get("vs_control") or {}
            agree = {True: "yes", False: "**no**", None: "-"}[f["agree"]]
            loss = "-" if t["loss_max_rel_diff"] is None else f"{t['loss_max_rel_diff']:.1e}"
            out.append(f"| {fix} | {t['change'] or t['reason']} | {_x(t['speedup'], t['speedup_ci'])} | "
                       f"{t['verdict']} | {_x(h['speedup'], h.get('speedup_ci'))} | {loss} | {agree}: {f['why']} | "
                       f"{_x(vc.get('speedup'), vc.get('speedup_ci'))} |")
        out.append("")
    return "\n".join(out)


def write_section(results: list[dict], path: Path = BENCHMARKS) -> None:
    """Replace the section, keeping its ``### Reading`` (written by hand) when it has one."""
    text = path.read_text()
    reading = ""
    if TITLE in text:
        start = text.index(TITLE)
        nxt = text.find("\n## ", start + len(TITLE))
        old = text[start:nxt if nxt != -1 else len(text)]
        if READING in old:
            reading = old[old.index(READING):].rstrip() + "\n"
    replace_section(TITLE, render(results) + ("\n" + reading if reading else "") + "\n", path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", choices=sorted(SCRIPTS))
    ap.add_argument("--mingpt", type=Path, help="a checkout of karpathy/minGPT (for --script mingpt-adder)")
    ap.add_argument("--examples", type=Path, default=EXAMPLES, help="pytorch/examples' scripts")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fixes", default="", help="comma-separated; default: every fix with a hand edit")
    ap.add_argument("--corpus-words", type=int, default=40000)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of every run (1: a shared machine's load slows a run, it does not stall "
                         "its threads' barriers)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--write", type=Path, nargs="+", metavar="FILE",
                    help="render these runs' JSON into docs/BENCHMARKS.md (nothing is measured)")
    args = ap.parse_args()
    if args.write:
        write_section([json.loads(p.read_text()) for p in args.write])
        return 0
    if not args.script:
        ap.error("--script is required (or --write FILE ...)")
    script = SCRIPTS[args.script]
    if script.name == "mingpt-adder":
        if not args.mingpt or not (args.mingpt / "projects" / "adder" / "adder.py").is_file():
            ap.error("--script mingpt-adder needs --mingpt DIR, a checkout of karpathy/minGPT "
                     "(DIR/projects/adder/adder.py)")
        folder = args.mingpt
    else:
        folder = args.examples / "word_language_model"
    out = measure(script, folder, args)
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
