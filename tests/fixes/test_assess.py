"""What a trial buys and costs: flags and ranking (issue #19 item 7: a 0.024x int8 row or a pruned
model with top-1 agreement 0 must not read as a plain "ok")."""

from diagnostics.analyses.optimize.assess import assess, ranked

BASE = {"fix": "baseline", "status": "ok", "peak_bytes": 100, "size_ratio": 1.0}
CONTROL = {"fix": "control", "status": "ok", "verdict": "within noise", "speedup": 1.0}


def row(fix, **kw):
    r = {"fix": fix, "status": "ok", "verdict": "within noise", "speedup": 1.0, "size_ratio": 1.0,
         "peak_bytes": 100, "cosine": 1.0, "top1_agreement": 1.0}
    r.update(kw)
    return r


def test_flags_and_reasons_carry_the_numbers():
    rows = ranked(assess([BASE, CONTROL,
                   row("int8", verdict="slower", speedup=0.024, speedup_ci=[0.02, 0.03], size_ratio=0.31, cosine=0.9999),
                   row("prune", top1_agreement=0.0, cosine=0.84),
                   row("compile", verdict="faster", speedup=1.3, speedup_ci=[1.2, 1.4]),
                   row("fusion"),
                   row("half", verdict="slower", speedup=0.5),
                   {"fix": "boom", "status": "failed"}]))
    by = {r["fix"]: r for r in rows}
    assert by["int8"]["flag"] == "trade_off" and by["int8"]["assessment"] == ["slower x0.02 [0.02, 0.03]", "size x0.31"]
    assert by["prune"]["flag"] == "fidelity_loss"
    assert by["prune"]["assessment"] == ["outputs moved: cosine 0.8400 < 0.999", "top-1 agreement 0.0% < 99%"]
    assert by["compile"]["flag"] == "gain" and by["compile"]["assessment"] == ["faster x1.30 [1.20, 1.40]"]
    assert by["fusion"]["flag"] == "neutral" and by["half"]["flag"] == "regression"
    assert by["boom"]["flag"] is None and by["baseline"]["flag"] is None
    # ranked by what they buy: gains (fastest first), trade-offs, regressions / fidelity losses, failures
    assert [r["fix"] for r in rows] == ["baseline", "control", "compile", "fusion", "int8", "prune", "half", "boom"] \
        or [r["fix"] for r in rows] == ["baseline", "control", "compile", "fusion", "int8", "half", "prune", "boom"]


def test_thresholds_are_the_users():
    r = row("amp", cosine=0.9995)
    assert assess([BASE, dict(r)], min_cosine=0.999)[1]["flag"] == "neutral"
    assert assess([BASE, dict(r)], min_cosine=0.9999)[1]["flag"] == "fidelity_loss"


def test_training_rows_judge_gradients_and_memory():
    ck = row("activation_checkpointing", verdict="slower", speedup=0.78, speedup_ci=[0.7, 0.85], peak_bytes=60,
             grad_cosine=0.999999)
    bad = row("qat", grad_cosine=0.95)
    rows = {r["fix"]: r for r in assess([BASE, ck, bad], mode="train")}
    assert rows["activation_checkpointing"]["flag"] == "trade_off"
    assert rows["activation_checkpointing"]["assessment"] == ["slower x0.78 [0.70, 0.85]", "peak memory x0.60"]
    assert rows["qat"]["assessment"] == ["gradients moved: cosine 0.9500 < 0.999"]


def test_a_label_never_claims_a_gain_its_timing_contradicts():
    """With --iters 3 there is no interval and no verdict; DETR's int8_dynamic measured x0.21 and was
    labelled "gain" for its size alone."""
    int8 = row("int8_dynamic", speedup=0.21, speedup_ci=None, rounds=3, size_ratio=0.3)
    r = assess([BASE, dict(int8)])[1]
    assert r["flag"] == "trade_off"
    assert r["assessment"] == ["slower x0.21 by its point estimate alone (3 rounds, too few for an interval: no verdict)",
                               "size x0.30"]
    # without the size gain it is a cost alone; at x0.95 the point estimate is within the noise it could be
    assert assess([BASE, dict(int8, size_ratio=1.0)])[1]["flag"] == "regression"
    assert assess([BASE, dict(int8, speedup=0.95)])[1]["flag"] == "gain"
    # with an interval the verdict decides, as before: within noise is no cost
    assert assess([BASE, dict(int8, speedup_ci=[0.05, 1.2])])[1]["flag"] == "gain"
    # a fast point estimate without a verdict is no gain either
    assert assess([BASE, dict(int8, speedup=3.0, size_ratio=1.0)])[1]["flag"] == "neutral"
