"""A real Llama-shaped ``nn.Module`` built from a :class:`~devtools.scale.shapes.LlamaShape`.

Used at small sizes only: to save a real checkpoint the generator is compared with, and to let
torch itself produce the optimizer's param groups (names in parameter order, every AdamW
field in torch's order). Its parameters are exactly ``shape.parameters()``, in that order.
"""

from __future__ import annotations

import torch
from torch import nn

from devtools.scale.shapes import LlamaShape


class Attention(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.wq = nn.Linear(s.dim, s.dim, bias=False)
        self.wk = nn.Linear(s.dim, s.kv_dim, bias=False)
        self.wv = nn.Linear(s.dim, s.kv_dim, bias=False)
        self.wo = nn.Linear(s.dim, s.dim, bias=False)
        self.repeat = s.n_heads // s.n_kv_heads
        self.head_dim = s.head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).repeat_interleave(self.repeat, dim=2).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).repeat_interleave(self.repeat, dim=2).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(s.dim, s.ffn_dim, bias=False)
        self.w2 = nn.Linear(s.ffn_dim, s.dim, bias=False)
        self.w3 = nn.Linear(s.dim, s.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.attention = Attention(s)
        self.feed_forward = FeedForward(s)
        self.attention_norm = nn.RMSNorm(s.dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(s.dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(s.vocab_size, s.dim)
        self.layers = nn.ModuleList([Block(s) for _ in range(s.n_layers)])
        self.norm = nn.RMSNorm(s.dim, eps=1e-5)
        self.output = nn.Linear(s.dim, s.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))
