"""Sequence samples over token ids: a Transformer encoder LM (with attention) and an LSTM."""

import torch
from torch import nn

from sample_models import VOCAB


class TinyTransformerLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, d_model: int = 128, nhead: int = 4, layers: int = 2,
                 max_len: int = 512):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, max_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model,
                                           dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied weights, as in most LMs
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-style init keeps the tied logits small

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        return self.lm_head(self.norm(self.encoder(x)))


class LSTMClassifier(nn.Module):
    def __init__(self, vocab: int = VOCAB, d: int = 64, hidden: int = 128, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])
