"""Lightning training a small MLP regressor (a LightningModule with training_step, configure_optimizers and a
validation_step) on a synthetic in-memory dataset, on the CPU, with its seed. Lightning's automatic
optimization calls ``optimizer.step(closure)``: forward and backward run inside the optimizer's step. The
module prints each training step's loss with full precision (repr) and times each training batch with
time.perf_counter (on_train_batch_start .. on_train_batch_end) and records each optimizer step's gradient
norms (on_before_optimizer_step: after the closure's backward), written to SELF_TIMING with Lightning's own
optimizer step count. The final weights go to OUT (torch.save of the state_dict) and a checkpoint beside it;
what is left on the model and optimizer is written too.

Environment: MAX_STEPS (default 8), ACCUM (accumulate_grad_batches, default 1), VAL_EVERY (0: no validation;
N: val_check_interval=N training batches, after Lightning's sanity check of 2 validation batches), OUT
(default ./lightning_out)."""
import os
import time
import warnings

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import leftovers, save

MAX_STEPS = int(os.environ.get("MAX_STEPS", "8"))
ACCUM = int(os.environ.get("ACCUM", "1"))
VAL_EVERY = int(os.environ.get("VAL_EVERY", "0"))
OUT = os.environ.get("OUT", "lightning_out")
warnings.filterwarnings("ignore")  # Lightning's advice (num_workers, ...): not what the test compares


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        self.step_ms, self.grad_norms, self.val_batches, self._t = [], [], 0, None

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        print(f"batch {batch_idx} loss {loss.item()!r}", flush=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_batches += 1
        print(f"val {batch_idx} loss {nn.functional.mse_loss(self(x), y).item()!r}", flush=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def on_before_optimizer_step(self, optimizer):  # after the closure: the gradients the step applies
        self.grad_norms.append({n: p.grad.norm().item() for n, p in self.named_parameters()})

    def on_train_batch_start(self, batch, batch_idx):
        self._t = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.step_ms.append((time.perf_counter() - self._t) * 1e3)


def loader(n, seed, shuffle):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=shuffle, generator=torch.Generator().manual_seed(seed))


def main():
    L.seed_everything(0, verbose=False)
    model = Regressor()
    trainer = L.Trainer(max_steps=MAX_STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=ACCUM,
                        val_check_interval=VAL_EVERY or None, limit_val_batches=2 if VAL_EVERY else 0,
                        check_val_every_n_epoch=None if VAL_EVERY else 1)
    val = loader(32, 2, False) if VAL_EVERY else None
    trainer.fit(model, loader(256, 1, True), val)
    os.makedirs(OUT, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(OUT, "weights.pt"))
    trainer.save_checkpoint(os.path.join(OUT, "last.ckpt"))
    print(f"global_step {trainer.global_step}", flush=True)
    save({"optimizer_steps": trainer.global_step, "step_ms": model.step_ms, "val_batches": model.val_batches,
          "grad_norms": model.grad_norms,
          "train_batches": len(model.step_ms), "leftovers": leftovers(model, trainer.optimizers[0])})


if __name__ == "__main__":
    main()
