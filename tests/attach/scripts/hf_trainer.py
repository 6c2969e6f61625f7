"""transformers' Trainer training a tiny GPT-2 built from a config (no download) on a synthetic in-memory
dataset, on the CPU, with its seed. Its own callback prints each optimizer step's loss with full precision
(repr) and times each optimizer step with time.perf_counter (on_step_begin .. on_step_end: the micro-batches,
backward and the optimizer step), written to SELF_TIMING with the Trainer's own step count. The final weights
go to OUT (save_model: model.safetensors); what is left on the model and optimizer is written too.

Environment: MAX_STEPS (default 6), ACCUM (gradient_accumulation_steps, default 1), EVAL_STEPS (0: no
evaluation; N: eval_strategy="steps" every N steps), OUT (default ./hf_out)."""
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from common import leftovers, save

MAX_STEPS = int(os.environ.get("MAX_STEPS", "6"))
ACCUM = int(os.environ.get("ACCUM", "1"))
EVAL_STEPS = int(os.environ.get("EVAL_STEPS", "0"))
OUT = os.environ.get("OUT", "hf_out")
SEQ, VOCAB = 16, 64


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Clock(TrainerCallback):
    def __init__(self):
        self.step_ms, self.losses, self.evals, self._t = [], [], 0, None

    def on_step_begin(self, args, state, control, **kw):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.step_ms.append((time.perf_counter() - self._t) * 1e3)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])
            print(f"step {state.global_step} loss {logs['loss']!r}", flush=True)
        if logs and "eval_loss" in logs:
            self.evals += 1
            print(f"step {state.global_step} eval_loss {logs['eval_loss']!r}", flush=True)


def main():
    set_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=OUT, max_steps=MAX_STEPS, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=ACCUM, learning_rate=1e-3, report_to=[], use_cpu=True, seed=0,
        logging_strategy="steps", logging_steps=1, save_strategy="no", disable_tqdm=True,
        eval_strategy="steps" if EVAL_STEPS else "no", eval_steps=EVAL_STEPS or None,
        dataloader_num_workers=0)
    clock = Clock()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(64, 1),
                      eval_dataset=Tokens(8, 2) if EVAL_STEPS else None, callbacks=[clock])
    out = trainer.train()
    print(f"global_step {out.global_step} train_loss {out.training_loss!r}", flush=True)
    trainer.save_model(OUT)
    save({"optimizer_steps": trainer.state.global_step, "step_ms": clock.step_ms, "evaluations": clock.evals,
          "eval_batches": clock.evals * 2 if EVAL_STEPS else 0, "leftovers": leftovers(model, trainer.optimizer)})


if __name__ == "__main__":
    main()
