"""Fully connected samples: a healthy MLP and two sick ones."""

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
