"""Training without torch.optim (word_language_model's way): forward, backward, p.data.add_(p.grad,
alpha=-lr); after each epoch an evaluation loop (model.eval(), torch.no_grad()) of EVAL_BATCHES
forwards. Each forward sleeps FORWARD_MS inside the model; the script times each training batch
itself (from the batch's start to after its update)."""
import os
import time

import torch
from torch import nn

from common import save

FORWARD_MS = float(os.environ.get("FORWARD_MS", "10"))
EPOCHS, BATCHES, EVAL_BATCHES = 2, int(os.environ.get("BATCHES", "12")), int(os.environ.get("EVAL_BATCHES", "8"))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        time.sleep(FORWARD_MS / 1e3)
        return self.fc(x)


def main():
    torch.manual_seed(0)
    model, criterion, lr = Net(), nn.CrossEntropyLoss(), 0.1
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    batch_ms, eval_ms = [], []
    for epoch in range(EPOCHS):
        model.train()
        for _ in range(BATCHES):
            t = time.perf_counter()
            model.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            batch_ms.append((time.perf_counter() - t) * 1e3)
        print(f"epoch {epoch} loss {loss.item():.10f}", flush=True)
        t = time.perf_counter()
        model.eval()
        with torch.no_grad():
            for _ in range(EVAL_BATCHES):
                criterion(model(x), y)
        eval_ms.append((time.perf_counter() - t) * 1e3)
    save({"batches": EPOCHS * BATCHES, "batch_ms": sorted(batch_ms)[len(batch_ms) // 2],
          "eval_forwards": EPOCHS * EVAL_BATCHES, "eval_ms": sum(eval_ms)})


if __name__ == "__main__":
    main()
