"""The plan's accuracy corpus: models nobody here tuned the planner on (transformers architectures from
small configs) and the samples, at several batches, sequence lengths, dtypes, optimizers and
checkpointing. Each case is planned on fake tensors and measured for real on this CPU by the Memory
analysis' protocol (analyses/plan/measured.py); tests/analyses/plan/test_accuracy.py runs the quick
ones, bench/bench_plan.py all of them and writes the table into docs/BENCHMARKS.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnostics.analyses.plan.configs import Config, Setting
from diagnostics.hf import HFSettings
from diagnostics.spec import ModelSpec

HF = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 1000},
    "llama": {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},
    "bert": {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
             "intermediate_size": 256, "vocab_size": 1000},
    "t5": {"model_type": "t5", "num_layers": 2, "num_decoder_layers": 2, "d_model": 128, "d_ff": 256, "num_heads": 4,
           "d_kv": 32, "vocab_size": 1000},
    "mixtral": {"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "num_local_experts": 4},
    "qwen2": {"model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},
    "vit": {"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "image_size": 32, "patch_size": 8},
}


@dataclass(frozen=True)
class Case:
    model: str  # a sample name or a key of HF
    batch: int
    seq: int | None = None
    setting: dict = field(default_factory=dict)
    quick: bool = False  # in the test run (a few seconds each); the rest in the benchmark and slow tests

    @property
    def id(self) -> str:
        s = self.setting
        parts = [self.model, f"b{self.batch}"] + ([f"s{self.seq}"] if self.seq else [])
        parts += [s.get("dtype", "fp32"), "inference" if s.get("mode") == "inference" else s.get("optimizer", "adamw")]
        if s.get("checkpointing", "none") != "none":
            parts.append("ckpt")
        return "-".join(parts)

    def spec(self) -> ModelSpec:
        if self.model in HF:
            return ModelSpec(source="hf", name=self.model, hf=HFSettings(HF[self.model], seq_len=self.seq or 64).to_json(),
                             batch_size=self.batch)
        return ModelSpec(source="sample", name=self.model, batch_size=self.batch)

    def config(self) -> Config:
        return Config(self.batch, self.seq, Setting(**self.setting))


def _c(model, batch, seq=None, quick=False, **setting):
    return Case(model, batch, seq, setting, quick)


CASES = [
    # the samples
    _c("mlp", 32, quick=True), _c("mlp", 128, optimizer="sgd"), _c("mlp", 32, dtype="bf16"),
    _c("cnn", 8, quick=True), _c("cnn", 16, optimizer="sgd"), _c("cnn", 8, dtype="amp_bf16"),
    _c("resnet", 8), _c("resnet", 16, optimizer="adam"), _c("resnet", 8, checkpointing="blocks"),
    _c("transformer", 8, 64, quick=True), _c("transformer", 16, 128, optimizer="sgd"),
    _c("transformer", 8, 64, checkpointing="blocks"), _c("transformer", 8, 64, dtype="amp_fp16"),
    _c("lstm", 16), _c("lstm", 32, optimizer="sgd"),
    _c("graph_break_mlp", 32),  # data-dependent branch: the whole model is estimated analytically
    # transformers architectures from small configs
    _c("gpt2", 4, 64, quick=True), _c("gpt2", 8, 128, optimizer="adafactor"), _c("gpt2", 4, 64, dtype="bf16"),
    _c("gpt2", 4, 64, checkpointing="blocks"), _c("gpt2", 4, 64, optimizer="adamw_fused"),
    _c("llama", 4, 64, quick=True), _c("llama", 8, 128, optimizer="sgd_nomomentum"),
    _c("llama", 4, 64, checkpointing="blocks", quick=True), _c("llama", 4, 64, dtype="amp_bf16"),
    _c("llama", 2, 256, dtype="bf16", optimizer="adam"),
    _c("bert", 4, 64), _c("bert", 8, 128, optimizer="sgd"),
    _c("t5", 4, 64), _c("t5", 2, 128, optimizer="adafactor"),
    _c("mixtral", 4, 64), _c("mixtral", 4, 64, dtype="bf16", quick=True),
    _c("qwen2", 4, 64), _c("qwen2", 4, 128, checkpointing="blocks"),
    _c("vit", 8), _c("vit", 16, optimizer="sgd"),
    # inference: a prompt into a KV cache, then one token
    _c("llama", 4, 128, quick=True, dtype="bf16", optimizer="none", mode="inference"),
    _c("gpt2", 4, 64, optimizer="none", mode="inference"), _c("qwen2", 8, 256, dtype="bf16", optimizer="none",
                                                              mode="inference"),
]


def measure(case: Case, loaded) -> int:
    """The case measured for real on this CPU (analyses/plan/measured.py), training or inference."""
    from diagnostics.analyses.plan.measured import measured_inference_peak, measured_peak

    fn = measured_inference_peak if case.setting.get("mode") == "inference" else measured_peak
    return fn(loaded, case.config())["peak_bytes"]
