"""Two optimizers per iteration (a GAN's discriminator and generator), each stepping once per
iteration after ACCUM micro-batches of gradient accumulation. The script counts its iterations and
its optimizer steps."""
import os

import torch
from torch import nn

from common import save

ITERS = int(os.environ.get("ITERS", "16"))
ACCUM = int(os.environ.get("ACCUM", "3"))


def main():
    gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(disc.parameters(), lr=1e-2)
    steps = {"d": 0, "g": 0}
    for _ in range(ITERS):
        opt_d.zero_grad()
        for _ in range(ACCUM):
            fake = gen(torch.randn(16, 4)).detach()
            (disc(fake).mean() - disc(torch.randn(16, 8)).mean()).backward()
        opt_d.step()
        steps["d"] += 1
        opt_g.zero_grad()
        for _ in range(ACCUM):
            (-disc(gen(torch.randn(16, 4))).mean()).backward()
        opt_g.step()
        steps["g"] += 1
    save({"iterations": ITERS, "optimizer_steps": steps, "micro_batches": 2 * ITERS * ACCUM})


if __name__ == "__main__":
    main()
