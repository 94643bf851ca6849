"""Transformer families written the way their Hugging Face originals compute, so that exports look
like what users export: GPT-2 (learned positions, LayerNorm, tanh-GELU, fused c_attn stored
[in, out] as Conv1D, causal mask from a bool buffer via Where, tied LM head), BERT (post-LN,
erf-GELU, bidirectional attention with an additive padding mask), LLaMA (RMSNorm, rotary
positions, SwiGLU, grouped-query attention, untied head). Options mix the parts.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    family: str = "gpt2"          # gpt2 | bert | llama
    vocab: int = 256
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 0             # 0: same as heads
    ffn: int = 0                  # 0: 4*hidden (gpt2/bert) or ~8/3*hidden (llama)
    max_pos: int = 128
    positions: str = ""           # learned | rotary ("" = family default)
    norm: str = ""                # layernorm | rmsnorm
    act: str = ""                 # gelu | gelu_tanh | swiglu | relu
    tied: bool = None             # tie the LM head to the token embedding
    causal: bool = None
    loss_inside: bool = False     # the graph takes labels and returns the mean cross-entropy
    dropout: float = 0.0
    eps: float = 1e-5

    def resolved(self):
        c = Config(**self.__dict__)
        fam = c.family
        c.kv_heads = c.kv_heads or c.heads
        c.positions = c.positions or ("rotary" if fam == "llama" else "learned")
        c.norm = c.norm or ("rmsnorm" if fam == "llama" else "layernorm")
        c.act = c.act or {"gpt2": "gelu_tanh", "bert": "gelu", "llama": "swiglu"}[fam]
        if c.tied is None:
            c.tied = fam != "llama"
        if c.causal is None:
            c.causal = fam != "bert"
        if c.family == "gpt2" and c.act == "swiglu":
            raise ValueError("act swiglu needs separate gate/up projections: use family llama or bert")
        if c.kv_heads != c.heads and c.family == "gpt2":
            raise ValueError("grouped-query attention (kv_heads < heads) needs separate q/k/v: use family llama or bert")
        if c.heads % c.kv_heads or c.hidden % c.heads:
            raise ValueError(f"heads {c.heads} must divide hidden {c.hidden} and be a multiple of kv_heads {c.kv_heads}")
        if not c.ffn:
            c.ffn = 4 * c.hidden if c.act != "swiglu" else int(8 * c.hidden / 3 + 7) // 8 * 8
        return c


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class NewGELU(nn.Module):
    """GPT-2's gelu_new, written out as Hugging Face does."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight stored [in, out]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        return x @ self.weight + self.bias


def norm_layer(c):
    return RMSNorm(c.hidden, c.eps) if c.norm == "rmsnorm" else nn.LayerNorm(c.hidden, eps=c.eps)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.hd = c.hidden // c.heads
        if c.family == "gpt2":
            self.c_attn = Conv1D(3 * c.hidden, c.hidden)
            self.c_proj = Conv1D(c.hidden, c.hidden)
        else:
            bias = c.family == "bert"
            self.q_proj = nn.Linear(c.hidden, c.heads * self.hd, bias=bias)
            self.k_proj = nn.Linear(c.hidden, c.kv_heads * self.hd, bias=bias)
            self.v_proj = nn.Linear(c.hidden, c.kv_heads * self.hd, bias=bias)
            self.o_proj = nn.Linear(c.heads * self.hd, c.hidden, bias=bias)
        if c.causal and c.family == "gpt2":
            self.register_buffer("bias", torch.tril(torch.ones(c.max_pos, c.max_pos, dtype=torch.bool)).view(1, 1, c.max_pos, c.max_pos),
                                 persistent=False)
        self.drop = nn.Dropout(c.dropout)

    def heads(self, x, cos=None, sin=None):
        """q, k, v as [B, heads, T, head dim] (rotary applied, key/value heads repeated)."""
        c = self.c
        B, T, C = x.shape
        if c.family == "gpt2":
            q, k, v = self.c_attn(x).split(c.hidden, dim=2)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, T, c.heads, self.hd).transpose(1, 2)
        k = k.view(B, T, c.kv_heads, self.hd).transpose(1, 2)
        v = v.view(B, T, c.kv_heads, self.hd).transpose(1, 2)
        if cos is not None:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if c.kv_heads != c.heads:  # repeat_kv as LLaMA does
            rep = c.heads // c.kv_heads
            k = k[:, :, None, :, :].expand(B, c.kv_heads, rep, T, self.hd).reshape(B, c.heads, T, self.hd)
            v = v[:, :, None, :, :].expand(B, c.kv_heads, rep, T, self.hd).reshape(B, c.heads, T, self.hd)
        return q, k, v

    def attend(self, q, k, v, add_mask=None):
        """softmax(q kᵀ / √d + masks) v, [B, heads, T, head dim]."""
        c = self.c
        T = q.size(2)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
        if c.causal:
            if c.family == "gpt2":
                mask = self.bias[:, :, :T, :T]
                w = torch.where(mask, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
            else:
                causal = torch.full((T, T), torch.finfo(w.dtype).min).triu(1)
                w = w + causal
        if add_mask is not None:
            w = w + add_mask
        w = F.softmax(w, dim=-1)
        w = self.drop(w)
        return torch.matmul(w, v)

    def forward(self, x, cos=None, sin=None, add_mask=None):
        B, T, C = x.shape
        q, k, v = self.heads(x, cos, sin)
        o = self.attend(q, k, v, add_mask).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(o) if self.c.family == "gpt2" else self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        if c.family == "gpt2":
            self.c_fc = Conv1D(c.ffn, c.hidden)
            self.c_proj = Conv1D(c.hidden, c.ffn)
        else:
            bias = c.family == "bert"
            if c.act == "swiglu":
                self.gate_proj = nn.Linear(c.hidden, c.ffn, bias=bias)
            self.up_proj = nn.Linear(c.hidden, c.ffn, bias=bias)
            self.down_proj = nn.Linear(c.ffn, c.hidden, bias=bias)
        self.gelu_new = NewGELU()
        self.drop = nn.Dropout(c.dropout)

    def act(self, x):
        a = self.c.act
        if a == "gelu_tanh":
            return self.gelu_new(x)
        if a == "gelu":
            return F.gelu(x)
        if a == "relu":
            return F.relu(x)
        raise ValueError(a)

    def forward(self, x):
        c = self.c
        if c.family == "gpt2":
            h = self.c_proj(self.act(self.c_fc(x)))
        elif c.act == "swiglu":
            h = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        else:
            h = self.down_proj(self.act(self.up_proj(x)))
        return self.drop(h)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.ln_1 = norm_layer(c)
        self.attn = Attention(c)
        self.ln_2 = norm_layer(c)
        self.mlp = MLP(c)

    def forward(self, x, cos=None, sin=None, add_mask=None):
        if self.c.family == "bert":  # post-LN
            x = self.ln_1(x + self.attn(x, cos, sin, add_mask))
            return self.ln_2(x + self.mlp(x))
        x = x + self.attn(self.ln_1(x), cos, sin, add_mask)
        return x + self.mlp(self.ln_2(x))


class TransformerLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg.resolved()
        self.c = c
        self.wte = nn.Embedding(c.vocab, c.hidden)
        if c.positions == "learned":
            self.wpe = nn.Embedding(c.max_pos, c.hidden)
        else:
            hd = c.hidden // c.heads
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            t = torch.arange(c.max_pos).float()
            freqs = torch.outer(t, inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos_cached", emb.cos(), persistent=False)
            self.register_buffer("sin_cached", emb.sin(), persistent=False)
        self.emb_ln = norm_layer(c) if c.family == "bert" else None
        self.h = nn.ModuleList([Block(c) for _ in range(c.layers)])
        self.ln_f = norm_layer(c) if c.family != "bert" else None
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        self.apply(self._init)
        if c.tied:
            self.lm_head.weight = self.wte.weight

    @staticmethod
    def _init(m):
        # Biases are small random values, not zeros as in the originals: real tests of the bias
        # paths, and no two parameters are byte-identical (the TorchScript exporter would merge
        # them into one initializer, breaking the parameter ↔ initializer mapping).
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.normal_(m.bias, std=0.02)
        if isinstance(m, Conv1D):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.normal_(m.bias, std=0.02)
        if isinstance(m, nn.LayerNorm):
            # non-trivial affine parameters, so gradients and fusions are really tested
            nn.init.normal_(m.weight, mean=1.0, std=0.1)
            nn.init.normal_(m.bias, std=0.1)
        if isinstance(m, RMSNorm):
            nn.init.normal_(m.weight, mean=1.0, std=0.1)

    def body(self, input_ids, attention_mask=None):
        """The embeddings and the blocks: the hidden states before the final norm."""
        c = self.c
        B, T = input_ids.shape
        x = self.wte(input_ids)
        cos = sin = None
        if c.positions == "learned":
            pos = torch.arange(0, T, dtype=torch.long, device=input_ids.device).unsqueeze(0)
            x = x + self.wpe(pos)
        else:
            cos = self.cos_cached[:T][None, None, :, :]
            sin = self.sin_cached[:T][None, None, :, :]
        if self.emb_ln is not None:
            x = self.emb_ln(x)
        add_mask = None
        if attention_mask is not None:
            add_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for blk in self.h:
            x = blk(x, cos, sin, add_mask)
        return x

    def forward(self, input_ids, attention_mask=None, labels=None):
        c = self.c
        x = self.body(input_ids, attention_mask)
        if self.ln_f is not None:
            x = self.ln_f(x)
        logits = self.lm_head(x)
        if labels is not None:
            return F.cross_entropy(logits.reshape(-1, c.vocab), labels.reshape(-1))
        return logits
