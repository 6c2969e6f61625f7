"""Fix trials on real scripts (tests/attach/scripts), each run a process of its own: the issue's data-bound
script in one round (channels_last not applicable, AMP measured with its loss difference, the control's losses;
the speed-ups, loader_workers beyond 1.3x and the A/A control within noise, are
bench/bench_trials_data_bound.py's), a fix that breaks the script (its row failed with the script's message, the
others measured), Stop (every process tree ended, the rounds measured kept), bad input (exit 2, nothing started),
the run stored in History."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import psutil
import pytest

from diagnostics.attach.command import UsageError, check_command
from diagnostics.attach.trials import Trials
from diagnostics.results import decode, to_plain
from diagnostics.registry import get_analysis
from diagnostics.store import Store
from tests.attach.harness import SCRIPTS, env_for

#: The data-bound script's batch: 16 samples, each sleeping 2 ms while it is read.
BATCH_SLEEP_MS = 16 * 2.0


def _cmd(script, *args):
    return check_command([sys.executable, str(SCRIPTS / script), *args], str(SCRIPTS))


@pytest.mark.slow
def test_the_data_bound_script_reads_as_the_issue_says(tmp_path):
    """One round (the speed-ups and their intervals, 6 rounds, are bench/bench_trials_data_bound.py's): the
    worker fix's change at the script's line, channels_last not applicable after one run, AMP's loss difference,
    the losses the script printed itself, the control's identical losses, the run in History."""
    store = Store(str(tmp_path / "store"))
    t = Trials(_cmd("data_bound.py"), "loader_workers=2,channels_last,amp_bf16", steps=3, warmup=3, rounds=1,
               store=store)
    out = t.run()
    res = out.result
    rows = {r.fix: r for r in res.trials}
    assert res.status == "ok", res.notes
    assert rows["loader_workers=2"].change == "DataLoader(..., num_workers=2) at data_bound.py:30"
    cl = rows["channels_last"]
    assert cl.applicable is False and cl.verdict == "not applicable" and "no 4-D tensor" in cl.reason
    assert cl.rounds == 0  # it left after its first run
    amp = rows["amp_bf16"]
    assert amp.rounds == 1 and 0 < amp.loss_max_rel_diff < 0.05 and amp.speedup is not None
    # independent figures: the baseline's step is at least its batch's sleeps; its first loss is the one the
    # script printed itself (step 0) in its own output
    assert rows["baseline"].step_ms >= BATCH_SLEEP_MS
    base_run = next(r for r in json.loads((tmp_path / "store").glob("artifacts/*/trials.json").__next__().read_text())
                    ["runs"] if r["key"] == "baseline")
    printed = re.search(r"epoch 0 step 0 loss ([0-9.]+)", open(f"{base_run['dir']}/output.log").read()).group(1)
    assert f"{rows['baseline'].losses[0]:.4f}" == printed
    assert rows["control"].loss_max_rel_diff == 0.0  # the script's own seed: the same losses to the last digit
    # stored in History, and read back as the same typed result
    rec = store.get(out.run_id)
    assert rec.analysis == "trials" and rec.status == "ok"
    assert to_plain(decode(get_analysis("trials"), rec.result)) == to_plain(res)


@pytest.mark.slow
def test_a_fix_that_breaks_the_script_is_that_row_failed_and_the_others_measured(tmp_path):
    t = Trials(_cmd("data_bound.py", "--fail-workers"), "loader_workers=2,fused_optimizer", steps=4, warmup=2,
               rounds=1, folder=str(tmp_path / "t"))
    res = t.run().result
    rows = {r.fix: r for r in res.trials}
    assert rows["loader_workers=2"].verdict == "failed"
    assert "the script exited with code 1" in rows["loader_workers=2"].reason
    assert "this dataset cannot be read from a worker process" in rows["loader_workers=2"].reason
    assert rows["fused_optimizer"].step_ms is not None and rows["fused_optimizer"].verdict == "within noise"
    assert rows["fused_optimizer"].change.startswith("SGD(..., fused=True) at data_bound.py:")
    assert res.metrics.fixes_failed == 1


@pytest.mark.slow
def test_stop_ends_every_runs_process_tree_and_keeps_what_was_measured(tmp_path):
    stop = threading.Event()
    seen = []

    def progress(fraction, message, live):
        seen.append(message)
        if live.get("round") == 2 and not stop.is_set() and not seen_stop:  # round 1 done, round 2's first run on
            seen_stop.append(1)
            threading.Timer(1.5, stop.set).start()

    seen_stop: list = []
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    t = Trials(_cmd("data_bound.py"), "loader_workers=2", steps=60, warmup=2, rounds=6,
               folder=str(tmp_path / "t"), stop=stop, on_progress=progress, run_timeout_s=120)
    res = t.run().result
    assert res.status == "stopped" and "every run's process tree was ended" in res.notes[0]
    rows = {r.fix: r for r in res.trials}
    assert rows["baseline"].rounds == rows["loader_workers=2"].rounds == rows["control"].rounds == 1
    assert rows["loader_workers=2"].speedup is not None  # the round measured before Stop is kept
    assert len(t.runs) == 4 and t.runs[-1]["error"].startswith("stopped (")
    assert not _new_processes(before)


def _new_processes(before: set[int]) -> list[str]:
    """This process's descendants started since ``before`` and still alive, less multiprocessing's own helpers
    (a resource tracker or forkserver another test of the session may start; in CI one was this test's only
    "leftover")."""
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            line = " ".join(c.cmdline())
            if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE and "from multiprocessing." not in line:
                out.append(f"{c.pid}: {line}")
        except psutil.Error:  # ended while we looked
            pass
    return out


def test_an_unknown_fix_lists_the_known_ones_and_starts_nothing(tmp_path):
    with pytest.raises(UsageError, match="unknown fix 'warp_speed'; known fixes: amp_bf16.*tf32"):
        Trials(_cmd("data_bound.py"), "warp_speed", folder=str(tmp_path / "t"))
    p = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--no-report", "--try", "amp_bf16,nope", "--",
                        sys.executable, str(SCRIPTS / "data_bound.py")], cwd=tmp_path, env=env_for(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown fix 'nope'; known fixes:" in p.stderr
    assert not (tmp_path / "store").exists() or not Store(str(tmp_path / "store")).list()


@pytest.mark.slow
def test_the_cli_prints_the_rows_and_the_json_result(tmp_path):
    p = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--json", "--no-report", "--try",
                        "channels_last,checkpointing,fused_optimizer,set_to_none", "--rounds", "1", "--steps", "3",
                        "--warmup", "2", "--", sys.executable, str(SCRIPTS / "conv_blocks.py")],
                       cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    rows = {r["fix"]: r for r in res["trials"]}
    assert all(rows[k]["applicable"] for k in ("channels_last", "checkpointing", "fused_optimizer", "set_to_none"))
    assert "3 Block blocks of Net.blocks" in rows["checkpointing"]["change"]
    line = next(i for i, text in enumerate((SCRIPTS / "conv_blocks.py").read_text().splitlines(), 1)
                if "zero_grad(set_to_none=False)" in text)
    assert re.fullmatch(rf"zero_grad\(set_to_none=True\) at \S*conv_blocks\.py:{line}", rows["set_to_none"]["change"])
    assert "[torchscope] fused_optimizer: " in p.stderr and res["run_id"]
