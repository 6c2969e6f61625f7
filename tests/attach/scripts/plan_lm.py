"""A tiny causal language model called transformers-style, by keyword (``model(input_ids=..., attention_mask=...)``),
its loss computed by the script outside the model (cross-entropy over a 2,000-token vocabulary: the log-softmax
of the logits is a large part of the step), trained with Adam (run --plan's keyword-input, sequence-length,
sharding and loss test, tests/attach/test_attach_plan.py). ``build()`` and ``step_loss()`` are imported by that
test to run the same step for real at another length. The script's own seed; a loss printed every 5 steps."""
import sys

import torch
from torch import nn

VOCAB, WIDTH, LAYERS, BATCH, SEQ = 2000, 64, 2, 8, 64


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, h, keep):
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5
        causal = torch.ones(h.shape[1], h.shape[1], dtype=torch.bool, device=h.device).tril()
        scores = scores.masked_fill(~(causal & keep[:, None, :]), float("-inf"))
        h = h + self.out(scores.softmax(-1) @ v)
        return h + self.mlp(h)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids, attention_mask):
        h, keep = self.embed(input_ids), attention_mask.bool()
        for b in self.blocks:
            h = b(h, keep)
        return self.head(h)


def build() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


def batch(seq: int = SEQ, n: int = BATCH):
    ids = torch.randint(0, VOCAB, (n, seq))
    return ids, torch.ones(n, seq, dtype=torch.long), torch.randint(0, VOCAB, (n, seq))


def step_loss(model, ids, mask, labels):
    logits = model(input_ids=ids, attention_mask=mask)
    return nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))


if __name__ == "__main__":
    torch.set_num_threads(1)
    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
        ids, mask, labels = batch()
        opt.zero_grad()
        loss = step_loss(model, ids, mask, labels)
        loss.backward()
        opt.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
