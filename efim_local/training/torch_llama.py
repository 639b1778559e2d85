"""A small llama-architecture model in PyTorch (RMSNorm, RoPE, SwiGLU, GQA).

RoPE rotates adjacent pairs (x[2i], x[2i+1]), which is llama.cpp's ``NORM``
mode for the llama architecture, so weights export to GGUF without permuting.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .gguf_llama import LlamaConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x, theta: float, pos0: int = 0):
    """Rotate adjacent pairs of the last dimension; x is (batch, heads, time, head_dim)."""
    t, d = x.shape[-2], x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = torch.arange(pos0, pos0 + t, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x32 = x.float().reshape(*x.shape[:-1], d // 2, 2)
    a, b = x32[..., 0], x32[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.reshape(x.shape).type_as(x)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        kv = cfg.n_head_kv * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.k = nn.Linear(cfg.n_embd, kv, bias=False)
        self.v = nn.Linear(cfg.n_embd, kv, bias=False)
        self.o = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.ffn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.gate = nn.Linear(cfg.n_embd, cfg.n_ff, bias=False)
        self.up = nn.Linear(cfg.n_embd, cfg.n_ff, bias=False)
        self.down = nn.Linear(cfg.n_ff, cfg.n_embd, bias=False)

    def forward(self, x):
        c = self.cfg
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, c.n_head, c.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, c.n_head_kv, c.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, c.n_head_kv, c.head_dim).transpose(1, 2)
        q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)
        rep = c.n_head // c.n_head_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, c.n_embd))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids):
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def gguf_tensors(self) -> dict[str, np.ndarray]:
        """Weights under their GGUF names, as float32 numpy arrays."""
        f = lambda t: t.detach().float().cpu().numpy()
        out = {"token_embd.weight": f(self.embed.weight), "output_norm.weight": f(self.norm.weight),
               "output.weight": f(self.head.weight)}
        for i, b in enumerate(self.blocks):
            p = f"blk.{i}."
            out.update({p + "attn_norm.weight": f(b.attn_norm.weight), p + "attn_q.weight": f(b.q.weight),
                        p + "attn_k.weight": f(b.k.weight), p + "attn_v.weight": f(b.v.weight),
                        p + "attn_output.weight": f(b.o.weight), p + "ffn_norm.weight": f(b.ffn_norm.weight),
                        p + "ffn_gate.weight": f(b.gate.weight), p + "ffn_up.weight": f(b.up.weight),
                        p + "ffn_down.weight": f(b.down.weight)})
        return out
