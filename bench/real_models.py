"""Real architectures, built from small transformers configs (no downloads): TorchScope's figures beside
an independent reference, and the ratio.

For GPT-2, BERT, ViT, T5, Llama (grouped-query attention), Mixtral (4 experts, top-2) and torch's
nn.Transformer, wrapped to take tensors and return a tensor (the logits), as a user uploads them:

* parameters: the summary analysis' ``params_total`` vs ``sum(p.numel())`` over parameters
  deduplicated by storage (tied embeddings once);
* forward FLOPs: the summary's ``flops_forward`` (diagnostics.measure.flops.FlopCounter) vs torch's
  own FlopCounterMode with the math SDPA backend (attention as plain matmuls) and, for Mixtral,
  transformers' eager experts (a loop of F.linear per expert), plus a hand count of Mixtral's expert
  FLOPs (tokens x top-k x (2 H 2I + 2 I H) per layer); also torch's FlopCounterMode as it is
  (default backends, grouped-matmul experts), what the Profiler's roofline and MFU counted before #17;
* training-step peak memory (forward, loss, backward, AdamW step, after a warm-up step): the memory
  analysis' ``peak_train_bytes`` (CPU: torch.profiler allocation events) vs a dispatch-mode tracker
  of live tensor storages (every op's new output storages added, freed storages removed through
  weak references, the peak sampled after each op) plus the bytes alive before the step (parameters,
  buffers, inputs, optimizer state).

    .venv/bin/python bench/real_models.py [--write]

``--write`` puts the table into docs/real_models.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

DOC = ROOT / "docs" / "real_models.md"
BEGIN, END = "<!-- real_models table -->", "<!-- end of table -->"
B, S = 2, 32  # batch, sequence length


# ----------------------------------------------------------------------------- the models
class Logits(nn.Module):
    """A transformers model as a user wraps it: tensors in, logits out (no cache)."""

    def __init__(self, lm: nn.Module, **kw):
        super().__init__()
        self.lm, self.kw = lm, kw

    def forward(self, *args):
        return self.lm(*args, **self.kw).logits


class T5Logits(nn.Module):
    """T5 takes the decoder's ids by keyword."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids, decoder_ids):
        return self.lm(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False).logits


class Seq2Seq(nn.Module):
    """torch's nn.Transformer with embeddings and a head, batch first."""

    def __init__(self, vocab=1000, d=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.core = nn.Transformer(d, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=128,
                                   batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        return self.head(self.core(self.emb(src), self.emb(tgt)))


def models() -> list[tuple[str, nn.Module, tuple, dict]]:
    """(name, model, example inputs, facts for the hand counts)."""
    import transformers as tf

    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (B, S))
    small = dict(vocab_size=1000)
    out = []
    out.append(("GPT-2", Logits(tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128,
                                                                 bos_token_id=0, eos_token_id=0, **small)),
                                use_cache=False), (ids,), {}))
    out.append(("BERT", Logits(tf.BertForMaskedLM(tf.BertConfig(hidden_size=64, num_hidden_layers=2,
                                                                num_attention_heads=4, intermediate_size=128,
                                                                max_position_embeddings=128, **small))),
                (ids,), {}))
    out.append(("ViT", Logits(tf.ViTForImageClassification(tf.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
        patch_size=8, num_labels=10))), (torch.randn(B, 3, 32, 32),), {}))
    t5 = tf.T5ForConditionalGeneration(tf.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                                   decoder_start_token_id=0, **small))
    out.append(("T5", T5Logits(t5), (ids, torch.randint(0, 1000, (B, S // 2))), {}))
    out.append(("Llama (GQA 4q/2kv)", Logits(tf.LlamaForCausalLM(tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, **small)), use_cache=False), (ids,), {}))
    mix_cfg = tf.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                               max_position_embeddings=128, **small)
    out.append(("Mixtral (4 experts, top-2)", Logits(tf.MixtralForCausalLM(mix_cfg), use_cache=False), (ids,),
                {"experts_flops": mix_cfg.num_hidden_layers * B * S * mix_cfg.num_experts_per_tok
                 * (2 * 64 * 2 * 128 + 2 * 128 * 64)}))
    out.append(("nn.Transformer", Seq2Seq(), (ids, torch.randint(0, 1000, (B, S // 2))), {}))
    return out


# ----------------------------------------------------------------------------- ours: the engine's analyses
def loaded_of(name: str, model: nn.Module, inputs: tuple):
    from diagnostics.intake import LoadedModel, default_loss, input_spec_of
    from diagnostics.spec import ModelSpec

    return LoadedModel(ModelSpec(name=name), model, tuple(input_spec_of(t) for t in inputs), inputs, default_loss,
                       "mse (stand-in)")


def ours(name: str, model: nn.Module, inputs: tuple) -> dict:
    from diagnostics.analyses.memory import job as memory
    from diagnostics.analyses.summary import job as summary
    from diagnostics.runner import AnalysisContext, Job
    from diagnostics.spec import ModelSpec

    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for analysis, job, opts in (("summary", summary, {}), ("memory", memory, {"timeline": False})):
            ctx = AnalysisContext(Job(analysis, ModelSpec(name=name), opts), Path(tmp))
            ctx._loaded = loaded_of(name, model, inputs)
            r = job.analyze(ctx, opts)
            figures[analysis] = r
    s, m = figures["summary"], figures["memory"]
    experts = sum(l["flops_forward"] or 0 for l in s["layers"] if l["name"].endswith(".mlp.experts"))
    return {"params": s["metrics"]["params_total"], "flops": s["metrics"]["flops_forward"],
            "experts_flops": experts, "peak": m["metrics"]["peak_train_bytes"],
            "not_counted": [n for n in s["notes"] if "not counted" in n]}


# ----------------------------------------------------------------------------- the references
def params_by_storage(model: nn.Module) -> int:
    seen = {}
    for p in model.parameters():
        seen[(p.untyped_storage().data_ptr(), p.numel())] = p.numel()
    return sum(seen.values())


def torch_flops(model: nn.Module, inputs: tuple, math_sdpa: bool) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    lm = getattr(model, "lm", None)
    moe = lm is not None and getattr(lm.config, "_experts_implementation", None) not in (None, "eager")
    before = lm.config._experts_implementation if moe else None
    fastpath = torch.backends.mha.get_fastpath_enabled()
    model.eval()
    try:
        if math_sdpa and moe:
            lm.set_experts_implementation("eager")
        torch.backends.mha.set_fastpath_enabled(False)  # the per-matmul path, as the summary counts it
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            if math_sdpa:
                with sdpa_kernel(SDPBackend.MATH):
                    model(*inputs)
            else:
                model(*inputs)
        return counter.get_total_flops()
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        if moe:
            lm.set_experts_implementation(before)
        model.train()


class LiveStorages(TorchDispatchMode):
    """Bytes of tensor storages created under it and still alive, and their peak, sampled after each op."""

    def __init__(self, before: set):
        super().__init__()
        from torch.multiprocessing.reductions import StorageWeakRef

        self._ref = StorageWeakRef
        self.before = before
        self.live: dict[int, tuple] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key, (ref, n) in list(self.live.items()):  # frees since the last op
            if ref.expired():
                del self.live[key]
                self.current -= n
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                key = st.data_ptr()
                if key in self.before or key in self.live or not st.nbytes():
                    continue
                self.live[key] = (self._ref(st), st.nbytes())
                self.current += st.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def storages_bytes(tensors) -> tuple[int, set]:
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values()), set(seen)


def reference_peak(model: nn.Module, inputs: tuple) -> int:
    """One AdamW training step after a warm-up step, as the memory analysis runs it, tracked op by op."""
    from diagnostics.intake import default_loss

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        default_loss(model(*inputs)).backward()
        opt.step()

    opt.zero_grad(set_to_none=True)
    step()
    opt.zero_grad(set_to_none=True)
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    base, keys = storages_bytes(list(model.parameters()) + list(model.buffers()) + list(inputs) + state)
    tracker = LiveStorages(keys)
    with tracker:
        step()
    opt.zero_grad(set_to_none=True)
    return base + tracker.peak


# ----------------------------------------------------------------------------- the table
def ratio(a, b) -> str:
    return "–" if not a or not b else f"{a / b:.4f}"


def nbytes(n) -> str:
    return "–" if n is None else f"{n:,}"


def run() -> tuple[str, list[str]]:
    rows, notes = [], []
    header = ("| model | params (ours) | params (by storage) | ratio | FLOPs fwd (ours) | FLOPs fwd (torch, math "
              "SDPA) | ratio | FLOPs fwd (torch as is) | ours / as is | train peak bytes (ours) | train peak "
              "bytes (live storages) | ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, model, inputs, facts in models():
        print(f"{name} ...", file=sys.stderr, flush=True)
        o = ours(name, model, inputs)
        p_ref = params_by_storage(model)
        f_ref = torch_flops(model, inputs, math_sdpa=True)
        f_asis = torch_flops(model, inputs, math_sdpa=False)
        peak_ref = reference_peak(model, inputs)
        rows.append(f"| {name} | {o['params']:,} | {p_ref:,} | {ratio(o['params'], p_ref)} | {o['flops']:,} | "
                    f"{f_ref:,} | {ratio(o['flops'], f_ref)} | {f_asis:,} | {ratio(o['flops'], f_asis)} | "
                    f"{nbytes(o['peak'])} | {nbytes(peak_ref)} | {ratio(o['peak'], peak_ref)} |")
        if "experts_flops" in facts:
            notes.append(f"{name}: expert FLOPs (forward) ours {o['experts_flops']:,}, hand count "
                         f"(tokens x top-k x (2 H 2I + 2 I H) x layers) {facts['experts_flops']:,}, ratio "
                         f"{ratio(o['experts_flops'], facts['experts_flops'])}; torch's FlopCounterMode as is "
                         f"counts {f_asis / f_ref:.3f} of the model's FLOPs (experts through aten._grouped_mm "
                         f"uncounted)")
        notes += [f"{name}: {n}" for n in o["not_counted"]]
    return header + "\n" + "\n".join(rows), notes


def write(table: str, notes: list[str], elapsed: float) -> None:
    text = DOC.read_text()
    body = (f"{BEGIN}\n{table}\n\n" + "".join(f"* {n}\n" for n in notes) +
            f"\ntorch {torch.__version__}, transformers {__import__('transformers').__version__}, "
            f"{platform.processor() or platform.machine()}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; "
            f"batch {B}, sequence {S} (decoders of T5 and nn.Transformer: {S // 2}); {elapsed:.0f} s.\n{END}")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    DOC.write_text(text[:start] + body + text[end:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write the table into {DOC.relative_to(ROOT)}")
    args = ap.parse_args()
    t0 = time.perf_counter()
    table, notes = run()
    elapsed = time.perf_counter() - t0
    print(table)
    for n in notes:
        print("*", n)
    if args.write:
        write(table, notes, elapsed)


if __name__ == "__main__":
    main()
