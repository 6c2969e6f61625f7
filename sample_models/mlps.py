"""Fully connected samples: a healthy MLP and two sick ones."""

import numpy as np
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 64, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.act2(self.fc2(self.act1(self.fc1(x)))))


class DeepSigmoidMLP(nn.Module):
    """Many sigmoid layers: the derivative (<= 0.25) shrinks gradients layer after layer."""

    def __init__(self, d_in: int = 64, width: int = 64, depth: int = 20, classes: int = 10):
        super().__init__()
        layers = []
        for i in range(depth):
            layers += [nn.Linear(d_in if i == 0 else width, width), nn.Sigmoid()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.body(x))


class BadInitMLP(nn.Module):
    """ReLU layers with weights of std 1.5 (He init would be ~0.18): activations and gradients blow up."""

    def __init__(self, d_in: int = 64, width: int = 64, depth: int = 8, classes: int = 10, std: float = 1.5):
        super().__init__()
        layers = []
        for i in range(depth):
            lin = nn.Linear(d_in if i == 0 else width, width)
            with torch.no_grad():
                lin.weight.normal_(0.0, std)
                lin.bias.zero_()
            layers += [lin, nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)
        with torch.no_grad():
            self.head.weight.normal_(0.0, std)

    def forward(self, x):
        return self.head(self.body(x))


class GraphBreakMLP(nn.Module):
    """An MLP written the way that breaks torch.compile's graph: a Python branch on a value read
    from a tensor (Tensor.item()), and numpy on a tensor's data turned into a Python float."""

    def __init__(self, d_in: int = 64, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        h = self.act(self.fc1(x))
        if h.mean().item() > 0.5:  # a data-dependent Python branch: Dynamo must leave the graph here
            h = h * 0.5
        scale = float(np.abs(h.detach().cpu().numpy()).mean())  # numpy on the tensor's data, back to Python
        h = self.act(self.fc2(h)) / (1.0 + scale)
        return self.head(h)
