"""Fix trials against the hand edit: does ``run --try FIX`` say what making the change by hand buys?

    .venv/bin/python bench/bench_trials_hand_edit.py --mingpt DIR [--rounds 6] [--steps 10] [--out FILE]

DIR is a checkout of karpathy/minGPT (MIT licence; github.com/karpathy/minGPT, read at 37baab7): its public
training script ``projects/adder/adder.py`` (a GPT learning to add, its data generated in the script; run
here with ``--data.ndigit=3 --trainer.batch_size=16 --trainer.num_workers=0`` so a step takes tens of ms
on a CPU and its start-up evaluation 10 batches).

For each fix, two measurements on the same machine, in the same session:

1. ``Trials`` (what ``run --try`` runs): the script as it is and with the fix applied by the bootstrap, in
   interleaved rounds with the A/A control: the fix's speed-up and its 95 % interval;
2. the hand edit: a copy of the checkout with the change written into its source (the ``changes`` line
   ``--try`` prints, made by hand), its runs against the unedited script's in interleaved rounds of their
   own (measure.compare.Rounds, one run each per round, a fresh random order), each run timed as the
   trials time a run (the trial guest with no fix: the same steps, the same end).

Agreement: the hand edit's speed-up lies within the fix's interval. Writes the figures as JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCRIPT = ["projects/adder/adder.py", "--data.ndigit=3", "--trainer.batch_size=16", "--trainer.num_workers=0"]
#: fix -> (file, the line as it is, the line as the hand edit writes it)
EDITS = {
    "foreach_optimizer": ("mingpt/model.py",
                          "optimizer = torch.optim.AdamW(optim_groups, lr=train_config.learning_rate, "
                          "betas=train_config.betas)",
                          "optimizer = torch.optim.AdamW(optim_groups, lr=train_config.learning_rate, "
                          "betas=train_config.betas, foreach=True)"),
    "amp_bf16": ("mingpt/trainer.py",
                 "            logits, self.loss = model(x, y)\n",
                 "            with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                 "                logits, self.loss = model(x, y)\n"),
}


def edited_copy(src: Path, fix: str, dest: Path) -> Path:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git", "out"))
    rel, old, new = EDITS[fix]
    text = (dest / rel).read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{rel}: the line to edit for {fix} is not there once: {old!r}")
    (dest / rel).write_text(text.replace(old, new))
    return dest


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mingpt", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fixes", default=",".join(EDITS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from diagnostics.attach.command import check_command
    from diagnostics.attach.trials import Trials
    from diagnostics.measure.compare import Rounds, ratio_summary

    fixes = args.fixes.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-trials-"))
    src = work / "mingpt"
    shutil.copytree(args.mingpt, src, ignore=shutil.ignore_patterns(".git", "out"))
    t0 = time.monotonic()

    def command(folder: Path):
        os.environ["PYTHONPATH"] = str(folder)  # the script imports its package from its checkout
        return check_command([sys.executable, *SCRIPT], str(folder))

    # 1. run --try
    trials = Trials(command(src), ",".join(fixes), steps=args.steps, warmup=args.warmup, rounds=args.rounds,
                    folder=str(work / "trials"), combine=False,
                    on_progress=lambda f, m, live: print(f"[try] {m}", file=sys.stderr, flush=True))
    res = trials.run().result
    rows = {r.fix: r for r in res.trials}

    # 2. the hand edits, against the unedited script
    runners = {"bare": Trials(command(src), fixes[0], steps=args.steps, warmup=args.warmup, rounds=1,
                              folder=str(work / "hand-bare"))}
    for fix in fixes:
        copy = edited_copy(args.mingpt, fix, work / f"edit-{fix}")
        runners[fix] = Trials(command(copy), fixes[0], steps=args.steps, warmup=args.warmup, rounds=1,
                              folder=str(work / f"hand-{fix}"))
    for name, t in runners.items():
        t.folder = Path(t._folder)
        t.folder.mkdir(parents=True, exist_ok=True)

    def timer(name):
        def run():
            os.environ["PYTHONPATH"] = runners[name].command.cwd
            print(f"[hand] {name}", file=sys.stderr, flush=True)
            return runners[name]._run_once("baseline", (), 0)
        return run

    r = Rounds({name: timer(name) for name in runners}, baseline="bare", reverse=False)
    for _ in range(args.rounds):
        r.run()
    out = {"script": "karpathy/minGPT projects/adder/adder.py " + " ".join(SCRIPT[1:]), "rounds": args.rounds,
           "steps": args.steps, "warmup": args.warmup, "cpus": os.cpu_count(),
           "load_avg": os.getloadavg(), "control": {"speedup": rows["control"].speedup,
                                                  "speedup_ci": rows["control"].speedup_ci,
                                                  "verdict": rows["control"].verdict}, "fixes": {}}
    for fix in fixes:
        hand = ratio_summary(r.round_ms["bare"], r.round_ms[fix])
        row = rows[fix]
        ci = row.speedup_ci
        out["fixes"][fix] = {
            "try": {"speedup": row.speedup, "speedup_ci": ci, "verdict": row.verdict, "applicable": row.applicable,
                    "reason": row.reason, "change": row.change, "loss_max_rel_diff": row.loss_max_rel_diff},
            "hand_edit": hand,
            "agree": bool(ci and hand["speedup"] and ci[0] <= hand["speedup"] <= ci[1])}
    out["wall_s"] = time.monotonic() - t0
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
