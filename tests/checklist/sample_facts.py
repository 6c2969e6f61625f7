"""Hand-written checklist facts shared by the rule and report tests."""

import msgspec

from diagnostics.analyses.checklist import Facts
from diagnostics.results import to_plain
from tests.typed_samples import filled

GiB = 2**30


def healthy() -> Facts:
    """Facts of a healthy CUDA training run with a well-configured DataLoader: every rule passes."""
    return facts_of({
        "purpose": "training", "batch_size": 64, "task": "classification", "errors": {},
        "static": {
            "model_type": "Net", "n_conv": 2, "n_conv2d": 2, "n_batchnorm": 2, "n_dropout": 1, "n_linear": 2,
            "n_rnn": 0, "activations": {"ReLU": 3}, "inplace_activations": 3, "not_inplace_activations": [],
            "training": True, "dropout_bn_train": ["bn1", "bn2", "drop"], "dropout_bn_eval": [],
            "param_dtypes": {"float32": 1000, "bfloat16": 1000}, "param_bytes": 6000, "channels_last": True,
            "compiled": True, "torchscript": False, "data_parallel": False, "data_parallel_devices": 0,
            "ddp": True, "dist_backend": "nccl", "dropout_p0": [],
            "init": [{"name": "fc", "type": "Linear", "fan_in": 64, "std": 0.07, "gain": 0.56}],
        },
        "env": {"device_type": "cuda", "compute_capability": 8.0, "device_memory_bytes": 80 * GiB,
                "cudnn_benchmark": True, "matmul_allow_tf32": True, "cudnn_allow_tf32": True, "cpu_count": 16,
                "cxx_compiler": True, "world_size": 2},
        "forward": {"conv_bn_pairs": [], "hidden_saturating": [], "inner_dims": 4, "widths_not_multiple_of_8": [],
                    "relu_units": 100, "dead_relu_units": 3, "conv_input_channels_last": True,
                    "redundant_layers": []},
        "measured": {
            "train_step": {"median_s": 0.010},
            "profile": {"sync_per_step": {"aten::item": 0, "cudaStreamSynchronize": 0}, "sync_points_per_step": 0,
                        "ops_per_step": 50, "median_op_us": 40.0, "kernels_per_step": 60, "median_kernel_us": 50.0,
                        "eligible_ops": ["aten::addmm"], "tensor_core_kernels": ["sm80_xmma_gemm_bf16"],
                        "gpu_busy_fraction": 0.9, "communication_fraction": 0.02,
                        "layout_copies_per_step": 2, "layout_copy_us_per_step": 150.0, "op_time_us_per_step": 9000.0,
                        "layout_copy_fraction": 150 / 9000, "layout_copy_time_kind": "GPU kernel",
                        "element_ops_per_step": {"aten::select": 2}, "element_ops_total_per_step": 2},
            "peak_bytes": 10 * GiB, "saved_activation_bytes": 2 * GiB, "memory_growth_bytes_per_step": 0,
            "gradients": {"verdict": "healthy", "layers": 4, "vanishing": 0, "exploding": 0, "dead": 0,
                          "nonfinite": 0, "global_norm_first": 3.0, "global_norm_max": 3.0, "min_ratio": 0.2,
                          "flagged": []},
            "inference": {"train_grad_forward_s": 0.010, "eval_inference_forward_s": 0.0099, "speedup": 1.01,
                          "speedup_ci": [0.97, 1.05], "verdict": "within noise", "control_ci": [0.98, 1.02],
                          "rounds": 6},
            "batch_probe": {"points": [{"batch_size": 64, "median_s": 0.01, "samples_per_s": 6400},
                                       {"batch_size": 128, "median_s": 0.02, "samples_per_s": 6400}],
                            "throughput_gain_2x": 1.0, "throughput_gain_ci": [0.95, 1.05], "control_ci": [0.98, 1.02],
                            "rounds": 6},
            "compile": {"graph_count": 1, "graph_break_count": 0, "breaks": []},
        },
        "dataloader": {"described": {"batch_size": 64, "num_workers": 4, "pin_memory": True, "prefetch_factor": 2,
                                     "persistent_workers": True},
                       "loader_s_per_batch": 0.0002, "step_time_s": 0.010, "loader_fraction": 0.0002 / 0.0102,
                       "note": None},
    })


def facts_of(plain: dict) -> Facts:
    """Facts from their plain form (checked like a stored checklist's); a field a hand-written section leaves
    out gets an empty value of its type (tests.typed_samples.filled: 0, "", False, (), None where allowed)."""
    return msgspec.convert(filled(Facts, plain), Facts)


def set_path(facts: Facts, path: str, value) -> Facts:
    """A copy of ``facts`` with the value at "section.key.key" set (made through the plain form)."""
    f = to_plain(facts)
    cur = f
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur[k]
    cur[keys[-1]] = value
    return facts_of(f)
