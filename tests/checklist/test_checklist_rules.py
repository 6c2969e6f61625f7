"""Each rule on hand-written facts: one set that passes it, one that fails (or warns) it,
and, where it has one, the reason it does not apply."""

import json

import msgspec
import pytest

from diagnostics.analyses.checklist import rules as R
from diagnostics.analyses.checklist.rules import RULES, Finding, score
from diagnostics.results import to_plain
from tests.checklist.sample_facts import GiB, healthy, set_path


def run(rule_id: str, facts: dict) -> Finding:
    return next(r for r in RULES if r.id == rule_id)(facts)


# rule id -> list of (path, value) edits that make it fail or warn, and the expected status
BREAKERS = {
    "dataloader_time": ([("dataloader.loader_fraction", 0.2), ("dataloader.loader_s_per_batch", 0.0025)], "fail"),
    "communication": ([("measured.profile.communication_fraction", 0.25)], "warn"),
    "gpu_utilization": ([("measured.profile.gpu_busy_fraction", 0.3)], "warn"),
    "tensor_cores": ([("measured.profile.tensor_core_kernels", [])], "fail"),
    "peak_memory": ([("measured.peak_bytes", 75 * GiB)], "fail"),
    "data_parallel": ([("static.data_parallel", True), ("static.data_parallel_devices", 4)], "fail"),
    "ddp_backend": ([("static.dist_backend", "gloo")], "fail"),
    "hidden_activations": ([("forward.hidden_saturating", ["body.1"])], "warn"),
    "layer_widths": ([("forward.widths_not_multiple_of_8", [{"name": "fc1", "side": "out", "dim": 100}])], "warn"),
    "weight_init": ([("static.init", [{"name": "fc", "type": "Linear", "fan_in": 64, "std": 1.5, "gain": 12.0}])],
                    "warn"),
    "dropout_bn_mode": ([("purpose", "inference")], "fail"),
    "gradients_finite": ([("measured.gradients.nonfinite", 1)], "fail"),
    "gradient_flow": ([("measured.gradients.vanishing", 2),
                       ("measured.gradients.flagged", [{"layer": "fc1", "status": "vanishing", "reason": "tiny"}])],
                      "fail"),
    "dead_units": ([("forward.dead_relu_units", 80)], "warn"),
    "saved_activations": ([("measured.saved_activation_bytes", 40 * GiB)], "warn"),
    "memory_growth": ([("measured.memory_growth_bytes_per_step", 50 * 2**20)], "fail"),
    "inplace_activations": ([("static.inplace_activations", 0), ("static.not_inplace_activations", ["a", "b"])],
                            "warn"),
    "sync_points": ([("measured.profile.sync_points_per_step", 12),
                     ("measured.profile.sync_per_step", {"aten::item": 12})], "fail"),
    "launch_bound": ([("measured.profile.kernels_per_step", 900), ("measured.profile.median_kernel_us", 4.0)],
                     "warn"),
    "torch_compile": ([("static.compiled", False)], "warn"),
    "channels_last": ([("static.channels_last", False)], "warn"),
    "cudnn_benchmark": ([("env.cudnn_benchmark", False)], "warn"),
    "tf32": ([("env.matmul_allow_tf32", False)], "warn"),
    "mixed_precision": ([("static.param_dtypes", {"float32": 2000})], "warn"),
    "batch_size": ([("measured.batch_probe.throughput_gain_2x", 1.8),
                    ("measured.batch_probe.throughput_gain_ci", [1.7, 1.9])], "warn"),
    "conv_bn_fusion": ([("forward.conv_bn_pairs", [["conv1", "bn1"], ["conv2", "bn2"]])], "warn"),
    "inference_mode": ([("measured.inference.speedup", 1.6), ("measured.inference.eval_inference_forward_s", 0.00625),
                        ("measured.inference.speedup_ci", [1.5, 1.7])], "warn"),
    "num_workers": ([("dataloader.described.num_workers", 0)], "warn"),
    "pin_memory": ([("dataloader.described.pin_memory", False)], "warn"),
    "prefetch": ([("dataloader.described.persistent_workers", False)], "warn"),
    "redundant_layers": ([("forward.redundant_layers", [{"layers": ["a", "b"], "why": "ReLU applied twice in a row"}])],
                         "warn"),
    "tensor_copies": ([("measured.profile.layout_copy_fraction", 0.3)], "warn"),
    "python_loops": ([("measured.profile.element_ops_per_step", {"aten::select": 64, "aten::item": 64})], "warn"),
    "graph_breaks": ([("measured.compile", {"graph_count": 3, "graph_break_count": 2, "breaks": [
        {"location": "model.py:12", "reason": "Unsupported Tensor.item() call", "count": 1},
        {"location": "model.py:14", "reason": "Data dependent operator", "count": 1}]})], "warn"),
}

# rule id -> (path, value) that makes it not applicable, and a word its reason must contain
NOT_APPLICABLE = {
    "dataloader_time": ("dataloader", None, "no DataLoader"),
    "gpu_utilization": ("env.device_type", "cpu", "no CUDA"),
    "tensor_cores": ("env.compute_capability", 6.1, "no Tensor Cores"),
    "peak_memory": ("env.device_type", "cpu", "no CUDA"),
    "ddp_backend": ("static.ddp", False, "not wrapped"),
    "tf32": ("env.compute_capability", 7.0, "no TF32"),
    "memory_growth": ("env.device_type", "cpu", "no CUDA"),
    "num_workers": ("dataloader", None, "no DataLoader"),
    "pin_memory": ("env.device_type", "cpu", "no CUDA"),
    "prefetch": ("dataloader.described.num_workers", 0, "num_workers > 0"),
    "conv_bn_fusion": ("static.n_batchnorm", 0, "no BatchNorm"),
    "channels_last": ("static.n_conv2d", 0, "no 2-D convolutions"),
    "gradient_flow": ("measured.gradients", None, "not measured"),
    "sync_points": ("env.device_type", "cpu", "no GPU"),
    "redundant_layers": ("forward", None, "could not be traced"),
    "tensor_copies": ("measured.profile", None, "not profiled"),
    "python_loops": ("measured.profile", None, "not profiled"),
    "graph_breaks": ("measured.compile", None, "not checked"),
}


def test_there_are_at_least_twenty_rules_with_unique_ids():
    ids = [r.id for r in RULES]
    assert len(ids) >= 20 and len(set(ids)) == len(ids)
    assert set(BREAKERS) == set(ids), "every rule needs a failing case in this test"


@pytest.mark.parametrize("rule_id", [r.id for r in RULES])
def test_rule_passes_on_healthy_facts(rule_id):
    f = run(rule_id, healthy())
    assert f.status == "pass", (f.id, f.evidence)
    assert f.fix is None  # a fix is offered only for a problem


@pytest.mark.parametrize("rule_id", [r.id for r in RULES])
def test_rule_flags_the_broken_facts(rule_id):
    edits, expected = BREAKERS[rule_id]
    facts = healthy()
    for path, value in edits:
        facts = set_path(facts, path, value)
    f = run(rule_id, facts)
    assert f.status == expected, (f.id, f.status, f.evidence)
    assert f.suggestion, "a flagged rule must suggest something"
    rule = next(r for r in RULES if r.id == rule_id)
    # the fix of the checklist's purpose (the sample facts' purpose is training)
    assert f.fix == (rule.fix.replace("purpose:", "train:") if rule.fix else None)


@pytest.mark.parametrize("rule_id", sorted(NOT_APPLICABLE))
def test_rule_says_why_it_does_not_apply(rule_id):
    path, value, word = NOT_APPLICABLE[rule_id]
    f = run(rule_id, set_path(healthy(), path, value))
    assert f.status == "not_applicable"
    assert word in f.evidence


def test_evidence_carries_the_numbers():
    f = run("dataloader_time", set_path(set_path(healthy(), "dataloader.loader_fraction", 0.2),
                                        "dataloader.loader_s_per_batch", 0.0025))
    assert "2.50 ms" in f.evidence and "20.0%" in f.evidence and f.numbers["fraction"] == 0.2
    f = run("peak_memory", set_path(healthy(), "measured.peak_bytes", 75 * GiB))
    assert f.numbers["fraction"] == pytest.approx(75 / 80) and "93.8%" in f.evidence


def test_new_rule_thresholds_are_the_boundaries():
    at = set_path(healthy(), "measured.profile.layout_copy_fraction", R.TENSOR_COPY_FRACTION_MAX)
    assert run("tensor_copies", at).status == "pass"
    assert run("tensor_copies", set_path(at, "measured.profile.layout_copy_fraction", 0.1001)).status == "warn"
    # python_loops needs both many element ops and a large share of the step's ops
    top = healthy().measured.profile.ops_per_step  # 50
    n = R.PYTHON_LOOP_MIN_OPS
    f = set_path(set_path(healthy(), "measured.profile.ops_per_step", n / R.PYTHON_LOOP_MIN_SHARE),
                 "measured.profile.element_ops_per_step", {"aten::select": n})
    assert run("python_loops", f).status == "warn"
    f = set_path(f, "measured.profile.element_ops_per_step", {"aten::select": n - 1})
    assert run("python_loops", f).status == "pass"
    f = set_path(set_path(healthy(), "measured.profile.ops_per_step", 10 * n),
                 "measured.profile.element_ops_per_step", {"aten::select": n})
    assert top < 10 * n and run("python_loops", f).status == "pass"  # many ops, but a small share


def test_thresholds_are_the_boundaries():
    # exactly at the threshold passes; just over fails
    at = set_path(healthy(), "dataloader.loader_fraction", R.DATALOADER_FRACTION_MAX)
    assert run("dataloader_time", at).status == "pass"
    over = set_path(healthy(), "dataloader.loader_fraction", R.DATALOADER_FRACTION_MAX + 1e-6)
    assert run("dataloader_time", over).status == "fail"
    f = set_path(healthy(), "measured.profile.sync_points_per_step", R.SYNC_POINTS_WARN)
    assert run("sync_points", f).status == "warn"
    f = set_path(healthy(), "measured.gradients.exploding", 1)
    assert run("gradient_flow", f).status == "fail" and "exploding" in run("gradient_flow", f).evidence


def test_a_rule_that_crashes_is_an_error_that_counts_as_failed():
    """A broken rule says so with its message and lowers the score like a failure; it must not drop
    out of the denominator (one crashing rule used to move a score from 97.0 to 100.0)."""
    import dataclasses

    facts = healthy()
    good = [r(facts) for r in RULES]
    i = next(i for i, f in enumerate(good) if f.status == "pass")

    def crash(_facts):
        return _facts.measured.no_such_probe  # a bug in a rule: it reads what is not there

    rules = list(RULES)
    rules[i] = dataclasses.replace(RULES[i], check=crash)
    findings = [r(facts) for r in rules]
    assert len(findings) == len(RULES)  # the others still ran
    broken = findings[i]
    assert broken.status == "error"
    assert broken.evidence == "the rule crashed: AttributeError: 'MeasuredFacts' object has no attribute 'no_such_probe'"
    assert broken.fix is None and "bug in TorchScope's rule" in broken.suggestion
    n = sum(f.status in ("pass", "warn", "fail", "error") for f in findings)
    assert n == sum(f.status != "not_applicable" for f in good)  # still in the denominator
    assert score(findings) == pytest.approx(score(good) - 100.0 / n)  # one pass became a failure


def test_finding_round_trip_and_validation():
    f = run("tensor_cores", set_path(healthy(), "measured.profile.tensor_core_kernels", []))
    assert msgspec.convert(json.loads(json.dumps(to_plain(f))), Finding) == f  # the one serialisation
    assert f.fix == "train:amp"  # a training checklist hands AMP to a training-step trial ...
    f = run("tensor_cores", set_path(set_path(healthy(), "measured.profile.tensor_core_kernels", []), "purpose",
                                     "inference"))
    assert f.fix == "amp"  # ... an inference checklist to an inference trial
    with pytest.raises(ValueError, match="unknown status"):
        Finding("x", "x", "compute", "maybe", "")


def test_score_formula():
    def mk(status):
        return Finding("x", "x", "compute", status, "")

    assert score([mk("pass"), mk("warn"), mk("fail"), mk("not_applicable")]) == pytest.approx(100 * 1.5 / 3)
    assert score([mk("pass")] * 4) == 100.0
    assert score([mk("fail")] * 2) == 0.0
    assert score([mk("not_applicable")]) is None
    assert score([mk("warn"), mk("warn")]) == 50.0
    assert score([mk("pass"), mk("error")]) == 50.0  # a crashed rule counts as failed


def test_a_gradient_failure_from_a_stand_in_loss_is_a_low_confidence_warning():
    from tests.checklist.sample_facts import healthy, set_path

    f = healthy()
    for path, value in (("measured.gradients.vanishing", 3), ("measured.gradients.flagged",
                                                             [{"layer": "a", "status": "vanishing", "reason": "r"}])):
        f = set_path(f, path, value)
    assert R.check_gradient_flow(f)[0] == "fail"  # a declared loss: as before
    f = set_path(set_path(f, "measured.gradients.loss_stand_in", True), "measured.gradients.loss",
                 "mean square of the output (no loss declared)")
    status, evidence, suggestion, _ = R.check_gradient_flow(f)
    assert status == "warn" and evidence.endswith("(measured with a stand-in loss, mean square of the output "
                                                  "(no loss declared): low confidence)")
    assert suggestion.startswith("Declare loss_fn(output) in the model file")


def test_measured_probes_never_call_a_slower_time_a_speed_up():
    """The times shown are the ones the ratio is made of: a slower eval forward reads 'slow-down'; the
    batch line's gain is the ratio of its two throughputs, with the interval beside it."""
    f = healthy()
    f = set_path(f, "measured.inference", {"train_grad_forward_s": 0.02638, "eval_inference_forward_s": 0.02841,
                                       "speedup": 0.02638 / 0.02841, "speedup_ci": [0.85, 1.01],
                                       "verdict": "within noise", "control_ci": [0.97, 1.03], "rounds": 6})
    ev = run("inference_mode", f).evidence
    assert "26.38 ms" in ev and "28.41 ms" in ev and "slow-down x0.93 [0.85, 1.01], within noise" in ev
    assert "speed-up" not in ev
    f = set_path(f, "measured.batch_probe", {"points": [{"batch_size": 8, "median_s": 8 / 82, "samples_per_s": 82},
                                                    {"batch_size": 16, "median_s": 16 / 184, "samples_per_s": 184}],
                                         "throughput_gain_2x": 184 / 82, "throughput_gain_ci": [1.1, 3.0],
                                         "control_ci": [0.9, 1.1], "rounds": 6})
    ev = run("batch_size", f).evidence
    assert "82 samples/s" in ev and "184 samples/s" in ev and "throughput x2.24 [1.10, 3.00]" in ev


def test_a_gain_inside_the_control_spread_is_not_beyond_the_noise():
    """The low end must clear the threshold scaled by the A/A control's high end: x1.25 [1.15, 1.40] beside a
    control of [0.90, 1.05] is not surely above x1.1 (1.15 < 1.1 x 1.05 = 1.155)."""
    f = healthy()
    f = set_path(f, "measured.inference", {"train_grad_forward_s": 0.0125, "eval_inference_forward_s": 0.01,
                                       "speedup": 1.25, "speedup_ci": [1.15, 1.40], "verdict": "faster",
                                       "control_ci": [0.90, 1.05], "rounds": 6})
    assert run("inference_mode", f).status == "pass"
    f = set_path(f, "measured.inference.control_ci", [0.95, 1.02])  # a tighter noise floor: 1.15 > 1.1 x 1.02
    assert run("inference_mode", f).status == "warn"
    f = set_path(f, "measured.inference.speedup_ci", None)  # no interval: never "beyond the noise"
    assert run("inference_mode", f).status == "pass"


def test_stored_checklist_facts_decode_to_facts_and_judge_as_they_did():
    """Checklist runs stored by older code (tests/data/stored): their facts decode into the typed Facts, the
    same JSON comes back out, and today's rules judge them as the stored findings did."""
    import json
    from pathlib import Path

    from diagnostics.analyses.checklist import Facts
    from diagnostics.analyses.checklist.rules import evaluate
    from diagnostics.registry import get_analysis
    from diagnostics.results import decode, to_plain

    rows = [r for r in json.loads((Path(__file__).parents[1] / "data" / "stored" / "runs-fc36ebc.json").read_text())
            if r["analysis"] == "checklist"]
    assert len(rows) == 2
    for row in rows:
        plain = json.loads(row["result_json"])
        result = decode(get_analysis("checklist"), plain)
        assert isinstance(result.facts, Facts) and to_plain(result.facts) == plain["facts"]
        stored = {f["id"]: f["status"] for f in plain["findings"]}
        now = {f.id: f.status for f in evaluate(result.facts)}
        assert {k: now[k] for k in stored if k in now} == stored and len(set(stored) & set(now)) >= 20
