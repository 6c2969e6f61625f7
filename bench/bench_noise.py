"""Verdicts on a quiet and on a busy machine: the A/A control and each fix's interval.

Runs the CLI a user would run,

    python -m diagnostics optimize --model cnn --fix inference_mode --fix conv_bn_fusion --fix channels_last --json

first on the machine as it is, then with one background process spinning a Python busy loop (the
"something else is running" case of a laptop or a shared node), and reports per row the speed-up,
its 95% interval and the verdict, the run's disturbance figures, and the peer of the old way (the
baseline timed once, then each fix in turn, medians divided) measured in the same run on the same
busy machine: the figure the tool used to show.

    .venv/bin/python bench/bench_noise.py [--iters 20] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SECTION = "## Verdicts under load"
FIXES = ("inference_mode", "conv_bn_fusion", "channels_last")
BUSY = "import time\nwhile True: pass"


def optimize_cli(iters: int) -> dict:
    cmd = [sys.executable, "-m", "diagnostics", "optimize", "--model", "cnn", "--iters", str(iters), "--json",
           "--no-report"] + [a for f in FIXES for a in ("--fix", f)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TORCHSCOPE_DATA_DIR":
                                                                          os.environ.get("TORCHSCOPE_DATA_DIR",
                                                                                         "/tmp/torchscope-bench")})
    if p.returncode != 0:
        raise SystemExit(f"optimize failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def sequential_peer(iters: int) -> dict[str, float]:
    """The old way, as the peer: baseline timed `iters` calls, then each fix in turn; median ratio."""
    import copy

    import torch

    from diagnostics.analyses.optimize.catalog import get_fix
    from diagnostics.intake import load_model
    from diagnostics.measure.timer import time_calls
    from diagnostics.spec import ModelSpec

    loaded = load_model(ModelSpec(name="cnn"))
    x = loaded.inputs
    models = {"baseline": copy.deepcopy(loaded.model).eval()}
    for f in FIXES:
        fix = get_fix(f)
        models[f], _ = fix.apply(copy.deepcopy(loaded.model).eval(), x, fix.options(None))

    def call(m):
        def c():
            with torch.no_grad():
                m(*x)
        return c

    med = {}
    for k, m in models.items():
        s = sorted(time_calls(call(m), "cpu", iters, 3))
        med[k] = s[len(s) // 2]
    return {f: med["baseline"] / med[f] for f in FIXES}


def table(label: str, r: dict, peer: dict[str, float]) -> list[str]:
    d = r.get("disturbance") or {}
    lines = [f"| {label} | other processes' cores: {d.get('other_processes_cores', 0):.2f}, disturbed: "
             f"{d.get('disturbed')} | | | |"]
    for row in r["rows"]:
        if row["fix"] == "baseline":
            continue
        ci = row.get("speedup_ci")
        old = peer.get(row["fix"])
        lines.append(f"| {label} | {row['fix']} | x{row['speedup']:.2f} | "
                     f"{'–' if not ci else f'[{ci[0]:.2f}, {ci[1]:.2f}]'} | {row['verdict']}"
                     f"{' (low confidence)' if row.get('confidence') == 'low' else ''} | "
                     f"{'–' if old is None else f'x{old:.2f}'} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--write", action="store_true", help=f"replace the '{SECTION}' section of docs/BENCHMARKS.md")
    a = ap.parse_args()
    lines = ["| machine | row | speed-up | 95% interval | verdict | old way (sequential medians) |",
             "|---|---|---|---|---|---|"]
    t0 = time.perf_counter()
    quiet = optimize_cli(a.iters)
    lines += table("quiet", quiet, sequential_peer(a.iters))
    spin = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(1.0)
        busy = optimize_cli(a.iters)
        peer = sequential_peer(a.iters)
    finally:
        spin.kill()
        spin.wait()
    lines += table("1 busy process", busy, peer)
    wall = time.perf_counter() - t0
    cmd = f".venv/bin/python bench/bench_noise.py --iters {a.iters}"
    text = (f"{SECTION}\n\n`{cmd}` ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d')}, {wall:.0f} s). The CLI's `optimize --model cnn` with three fixes and "
            f"{a.iters} interleaved rounds, on the machine as it was and with one Python busy loop beside it; "
            "the last column is the peer, the old sequential way (baseline timed, then each fix in turn, "
            "medians divided), measured in the same run.\n\n" + "\n".join(lines) + "\n")
    print(text)
    if a.write:
        doc = ROOT / "docs" / "BENCHMARKS.md"
        body = doc.read_text()
        if SECTION in body:
            head, _, rest = body.partition(SECTION)
            nxt = rest.find("\n## ")
            body = head + text + (rest[nxt:] if nxt >= 0 else "")
        else:
            body = body.rstrip() + "\n\n" + text
        doc.write_text(body)


if __name__ == "__main__":
    main()
