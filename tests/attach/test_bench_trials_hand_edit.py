"""bench/bench_trials_hand_edit.py's own logic on fixed numbers (no timing): the agreement rule, the hand
edits against the vendored script, the corpus' size, the section it writes into BENCHMARKS.md."""

from __future__ import annotations

import math

import pytest

from diagnostics.measure.compare import ratio_summary

from bench.bench_trials_hand_edit import (EXAMPLES, READING, SCRIPTS, TITLE, agreement, edited_copy, render,
                                          write_corpus, write_section)

WLM = SCRIPTS["word-language-model"]


@pytest.mark.parametrize("hand,agree,why", [
    (1.10, True, "x1.10 by hand within [1.05, 1.20]"),
    (1.05, True, "within"),  # the ends belong to the interval
    (1.20, True, "within"),
    (1.04, False, "x1.04 by hand below [1.05, 1.20]"),
    (1.21, False, "x1.21 by hand above [1.05, 1.20]"),
])
def test_agreement_is_the_hand_speedup_inside_the_try_interval(hand, agree, why):
    got = agreement({"speedup": 1.1, "speedup_ci": [1.05, 1.20], "applicable": True}, {"speedup": hand})
    assert got["agree"] is agree and why in got["why"]


@pytest.mark.parametrize("tried,hand,why", [
    ({"speedup": None, "speedup_ci": None, "applicable": False}, {"speedup": 1.0}, "not applicable"),
    ({"speedup": 1.1, "speedup_ci": None, "applicable": True}, {"speedup": 1.1}, "no interval"),
    ({"speedup": 1.1, "speedup_ci": [1.0, 1.2], "applicable": True}, {"speedup": None}, "runs failed"),
])
def test_agreement_is_undecided_where_there_is_nothing_to_compare(tried, hand, why):
    got = agreement(tried, hand)
    assert got["agree"] is None and why in got["why"]


def test_each_hand_edit_is_made_once_in_the_vendored_script(tmp_path):
    src = EXAMPLES / "word_language_model"
    before = (src / "main.py").read_text()
    for fix, (rel, old, new) in WLM.edits.items():
        out = edited_copy(src, WLM, fix, tmp_path / fix)
        text = (out / rel).read_text()
        assert text == before.replace(old, new) and text != before
        compile(text, str(out / rel), "exec")  # still Python
    amp = (tmp_path / "amp_bf16" / "main.py").read_text()
    # the training loop's call is wrapped, evaluate's (under no_grad) is not
    assert amp.index("with torch.autocast") > amp.index("def train():")
    assert "\n                output = model(data)\n                output = output.view" in amp  # evaluate's
    assert (src / "main.py").read_text() == before  # the vendored file untouched


def test_a_hand_edit_whose_text_is_not_there_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print('no optimizer here')\n")
    with pytest.raises(SystemExit, match="main.py: the text to edit for fused_optimizer is not there once"):
        edited_copy(tmp_path / "src", WLM, "fused_optimizer", tmp_path / "copy")


def test_the_corpus_holds_more_batches_than_a_run_steps(tmp_path):
    """One epoch is longer than warm-up + timed steps, so no evaluation or checkpoint falls in a timed step:
    main.py's batches (tokens + one <eos> a line, batchify, range(0, rows - 1, bptt)) computed here."""
    data = write_corpus(tmp_path / "c", words=40000, vocab=2000)
    lines = (data / "train.txt").read_text().splitlines()
    assert sum(len(ln.split()) for ln in lines) == 40000
    assert len({w for ln in lines for w in ln.split()}) <= 2000
    argv = list(WLM.argv)
    bsz, bptt = int(argv[argv.index("--batch_size") + 1]), int(argv[argv.index("--bptt") + 1])
    rows = (40000 + len(lines)) // bsz
    assert math.ceil((rows - 1) / bptt) > 3 + 10 + 50
    assert write_corpus(tmp_path / "d", 40000, 2000).joinpath("train.txt").read_text() == \
        (data / "train.txt").read_text()  # the same corpus for the same seed


def _result(title, agree_hand):
    fix = {"try": {"speedup": 1.5, "speedup_ci": [1.4, 1.6], "verdict": "faster", "applicable": True,
                   "reason": None, "change": "AdamW(..., fused=True) at main.py:111", "step_ms": 20.0,
                   "loss_max_rel_diff": 0.0},
           "hand_edit": {"speedup": agree_hand, "speedup_ci": [1.3, 1.7]}, "edit": "main.py",
           **agreement({"speedup_ci": [1.4, 1.6], "applicable": True}, {"speedup": agree_hand})}
    return {"script": "s", "title": title, "argv": ["main.py", "--x"], "rounds": 6, "steps": 10, "warmup": 3,
            "cpus": 2, "threads": 1, "date": "2026-12-06", "load_avg_start": [1.0, 1, 1], "load_avg_end": [2.0, 1, 1],
            "control": {"speedup": 1.01, "speedup_ci": [0.98, 1.03], "verdict": "within noise"},
            "baseline_step_ms": 30.0, "wall_s": 100.0, "fixes": {"fused_optimizer": fix}}


def test_the_section_is_rewritten_and_its_reading_kept(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# B\n\n{TITLE}\n\nold figures\n\n{READING}\n\nwritten by hand\n\n## Next\n\nkept\n")
    write_section([_result("first script", 1.5), _result("second script", 1.2)], doc)
    text = doc.read_text()
    assert "old figures" not in text and text.count(TITLE) == 1
    assert "written by hand" in text and text.index(READING) > text.index("second script")
    assert text.rstrip().endswith("## Next\n\nkept")
    assert "| fused_optimizer | AdamW(..., fused=True) at main.py:111 | x1.50 [1.40, 1.60] | faster | " \
           "x1.50 [1.30, 1.70] | 0.0e+00 | yes: x1.50 by hand within [1.40, 1.60] | - |" in text
    assert "| **no**: x1.20 by hand below [1.40, 1.60] | - |" in text
    # a run that kept its rounds: the fix's runs against the control's, per round (control / fix)
    res = _result("t", 1.5)
    res["fixes"]["fused_optimizer"]["try"]["vs_control"] = ratio_summary([10.0] * 6, [5.0] * 6)
    assert "| yes: x1.50 by hand within [1.40, 1.60] | x2.00 [2.00, 2.00] |" in render([res])
    assert "A/A control x1.01 [0.98, 1.03] (within noise)." in render([_result("t", 1.5)])
    res["hand_control"] = ratio_summary([10.0] * 6, [10.0, 12.5, 8.0, 10.0, 10.0, 10.0])
    assert ("A/A control x1.01 [0.98, 1.03] (within noise); the hand arm's A/A control (the unedited script again) "
            "x1.00 [0.80, 1.25].") in render([res])
