"""Model spec x sub-graph variant -> compact torch modules of ONE device's share of a layer.

Families: BERT encoder (post-norm, learned positions, GELU), GPT decoder (pre-norm, learned
positions, GELU), Llama decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention) and Mixtral MoE
decoder (router + top-k SwiGLU experts). Embedding, each block, and final norm + LM head + loss are
separate layer modules. Every variant is built as the transformed module a device runs, not a
scaled copy: Megatron column/row-split weights (Shoeybi et al. 2019, section 3) with the f / g
collectives inserted, sequence parallelism (Korthikanti et al. 2022, section 4.2.2: norms and
dropout on s/t tokens, all-gather / reduce-scatter), expert parallelism (E/e local experts, token
all-to-alls each way) and context parallelism (s/c local tokens, K/V all-gathered around the ring).

Modelling choices, all stated:
* bf16 parameters and activations; layouts are sequence-first [s, b, h] as in Megatron-LM.
* Kernels that production stacks fuse are one autograd.Function each, so that what they save for
  backward is what the fused kernel saves: RMSNorm (input + fp32 rstd, like LayerNorm), SwiGLU
  (its input only), RoPE (writes Q, K, V into one packed buffer; saves nothing), vocab-parallel
  cross-entropy (fp32 softmax + targets, Megatron-LM).
* The attention core is the unfused Korthikanti core (scores -> softmax -> dropout -> x V) so that
  "no recomputation" saves what their formula counts; selective recomputation re-runs this core.
* MoE routing is BALANCED: each expert receives exactly T*k/E tokens (no drops, no padding), the
  assumption behind every static cost model; token order comes from an argsort of the top-k ids.
  The routing weights travel with the token copies and multiply the experts' activation (one
  fused kernel that keeps its input and the weights), and the combine sums a token's k copies
  unweighted, as Megatron-Core >= 0.13 runs it (`_WeightedGLU`); no expert output is kept.
* Collectives are single-process stand-ins with the right output shapes; each call records
  (kind, phase, group, bytes) in the active `CommLog`. A gather flagged `keep_shard` is saved for
  backward as its local shard and gathered again in backward (Megatron's sequence-parallel
  linears and ring attention), which the extractor's saved-tensor hooks implement.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import Function

from nest.graph.fx_batch import expert_slots
from nest.graph.layer_graph import Variant
from nest.spec.catalog import ModelSpec

DTYPE = torch.bfloat16
_PHASES = ("fwd", "bwd")
DROPOUT_P = 0.1  # BERT and GPT-3 train with dropout 0.1 (Devlin et al. 2019; Brown et al. 2020)

# --------------------------------------------------------------------------------------------
# Communication log and simulated collectives
# --------------------------------------------------------------------------------------------


class CommLog:
    """Collectives issued while active: records (kind, phase, group, bytes); gathered tensors
    that backward re-gathers from their shard (storage key -> shard tensor)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, str, float]] = []
        self.raw: list[tuple[str, str, str, int, int]] = []  # bytes as (integer, divisor)
        self.regather: dict[int, tuple[torch.Tensor, str]] = {}  # key -> (shard, group)
        self.alive: list[torch.Tensor] = []

    def add(self, kind: str, phase: str, group: str, nbytes: int, shard: int = 1) -> None:
        """A collective of nbytes / shard bytes (nbytes: a tensor's size)."""
        self.records.append((kind, phase, group, nbytes / shard))
        self.raw.append((kind, phase, group, nbytes, shard))


_LOG: CommLog | None = None


@contextlib.contextmanager
def comm_log():
    global _LOG
    prev, _LOG = _LOG, CommLog()
    try:
        yield _LOG
    finally:
        _LOG = prev


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _record(kind: str, phase: str, group: str, t: torch.Tensor) -> None:
    if _LOG is not None:
        _LOG.add(kind, phase, group, _nbytes(t))


class _AllReduceFwd(Function):  # Megatron "g": all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, x, group):
        _record("all_reduce", "fwd", group, x)
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class _AllReduceBwd(Function):  # Megatron "f": identity forward, all-reduce backward
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        _record("all_reduce", "bwd", ctx.group, dy)
        return dy.clone(), None


def _scaled(shape, dim: int, factor: float) -> list[int]:
    shape = list(shape)
    shape[dim] = int(shape[dim] * factor)
    return shape


class _Gather(Function):  # all-gather forward along `dim`, reduce-scatter backward
    @staticmethod
    def forward(ctx, x, dim, n, group, keep_shard):
        out = x.new_empty(_scaled(x.shape, dim, n))
        _record("all_gather", "fwd", group, out)
        if keep_shard and _LOG is not None:
            _LOG.regather[storage_key(out)] = (x, group)
            _LOG.alive.append(out)  # keeps the key unique while the log lives
        ctx.dim, ctx.n, ctx.group = dim, n, group
        return out

    @staticmethod
    def backward(ctx, dy):
        _record("reduce_scatter", "bwd", ctx.group, dy)
        return dy.new_empty(_scaled(dy.shape, ctx.dim, 1 / ctx.n)), None, None, None, None


class _ReduceScatter(Function):  # reduce-scatter forward along `dim`, all-gather backward
    @staticmethod
    def forward(ctx, x, dim, n, group):
        _record("reduce_scatter", "fwd", group, x)
        ctx.dim, ctx.n, ctx.group = dim, n, group
        return x.new_empty(_scaled(x.shape, dim, 1 / n))

    @staticmethod
    def backward(ctx, dy):
        out = dy.new_empty(_scaled(dy.shape, ctx.dim, ctx.n))
        _record("all_gather", "bwd", ctx.group, out)
        return out, None, None, None


class _AllToAll(Function):  # expert dispatch / combine: same bytes each way
    # `shard` = t with sequence parallelism: a rank sends only its own sequence shard's tokens
    # (1/t of the [E, cap, h] buffer this single-process stand-in holds), see MoE below
    @staticmethod
    def forward(ctx, x, out_shape, group, shard):
        if _LOG is not None:
            _LOG.add("all_to_all", "fwd", group, _nbytes(x), shard)
        ctx.in_shape, ctx.group, ctx.shard = tuple(x.shape), group, shard
        return x.new_empty(out_shape)

    @staticmethod
    def backward(ctx, dy):
        if _LOG is not None:
            _LOG.add("all_to_all", "bwd", ctx.group, _nbytes(dy), ctx.shard)
        return dy.new_empty(ctx.in_shape), None, None, None


class _Relayout(Function):  # a tensor moved as another's all-to-all moves it, not recorded
    @staticmethod
    def forward(ctx, x, out_shape):
        ctx.in_shape = tuple(x.shape)
        return x.new_empty(out_shape)

    @staticmethod
    def backward(ctx, dy):
        return dy.new_empty(ctx.in_shape), None


class _Marked(Function):  # a collective whose full-size buffer is this tensor, shape unchanged
    @staticmethod
    def forward(ctx, x, fwd_kind, bwd_kind, group):
        _record(fwd_kind, "fwd", group, x)
        ctx.bwd_kind, ctx.group = bwd_kind, group
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        _record(ctx.bwd_kind, "bwd", ctx.group, dy)
        return dy.clone(), None, None, None


class Comm(nn.Module):
    """One inserted collective (a leaf node of the traced graph)."""

    op_kind = "comm"

    def __init__(self, kind: str, group: str, n: int, dim: int = 0, keep_shard: bool = False,
                 out_shape: tuple[int, ...] = (), shard: int = 1):
        super().__init__()
        self.kind, self.group, self.n, self.dim = kind, group, n, dim
        self.keep_shard, self.out_shape, self.shard = keep_shard, out_shape, shard
        self.op_name = f"{kind}_{group}"

    def forward(self, x):
        if self.kind == "f":
            return _AllReduceBwd.apply(x, self.group)
        if self.kind == "g":
            return _AllReduceFwd.apply(x, self.group)
        if self.kind == "gather":
            return _Gather.apply(x, self.dim, self.n, self.group, self.keep_shard)
        if self.kind == "scatter":
            return _ReduceScatter.apply(x, self.dim, self.n, self.group)
        if self.kind == "etp_gather":  # all-gather forward, reduce-scatter backward
            return _Marked.apply(x, "all_gather", "reduce_scatter", self.group)
        if self.kind == "etp_scatter":  # reduce-scatter forward, all-gather backward
            return _Marked.apply(x, "reduce_scatter", "all_gather", self.group)
        if self.kind == "relayout":
            return _Relayout.apply(x, self.out_shape)
        return _AllToAll.apply(x, self.out_shape, self.group, self.shard)


# --------------------------------------------------------------------------------------------
# Fused kernels (what they save for backward is what the fused production kernel saves)
# --------------------------------------------------------------------------------------------


class _RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return (xf * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        dyw = dy.float() * w.float()
        dx = rstd * (dyw - xhat * (dyw * xhat).mean(-1, keepdim=True))
        dw = (dy.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(w.dtype), None


class _SwiGLU(Function):
    @staticmethod
    def forward(ctx, gu):
        ctx.save_for_backward(gu)
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dy):
        (gu,) = ctx.saved_tensors
        g, u = gu.float().chunk(2, dim=-1)
        return _swiglu_grad(g, u, dy).to(gu.dtype)


def _swiglu_grad(g, u, dy):
    """d(silu(g) * u) for fp32 g, u; each use of dy reads it (an unfused dy is read twice)."""
    sg = torch.sigmoid(g)
    dg = dy * u * sg * (1 + g * (1 - sg))
    du = dy * g * sg
    return torch.cat([dg, du], dim=-1)


def _rotate(x, cos, sin, sign: float):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * (sin * sign)


class _PackQKV(Function):
    """[s, b, kv*(g+2)*d] QKV projection -> one buffer [b*kv, (g+2)*s, d] (per KV group: its g
    query heads, K, V), RoPE applied to Q and K when cos/sin are given (Su et al. 2021)."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, kv, g, d):
        s, b, _ = qkv.shape
        x = qkv.view(s, b, kv, g + 2, d).permute(1, 2, 3, 0, 4)  # b, kv, g+2, s, d
        out = qkv.new_empty((b, kv, g + 2, s, d))
        if cos is not None:
            out[:, :, : g + 1] = _rotate(x[:, :, : g + 1], cos, sin, 1.0)
            out[:, :, g + 1] = x[:, :, g + 1]
            ctx.save_for_backward(cos, sin)
        else:
            out.copy_(x)
        ctx.dims = (s, b, kv, g, d)
        return out.view(b * kv, (g + 2) * s, d)

    @staticmethod
    def backward(ctx, dout):
        s, b, kv, g, d = ctx.dims
        dx = dout.view(b, kv, g + 2, s, d)
        if ctx.saved_tensors:
            cos, sin = ctx.saved_tensors
            dx = torch.cat([_rotate(dx[:, :, : g + 1], cos, sin, -1.0), dx[:, :, g + 1:]], dim=2)
        dqkv = dx.permute(3, 0, 1, 2, 4).reshape(s, b, kv * (g + 2) * d)
        return dqkv, None, None, None, None, None


class _GeGLU(Function):
    """gelu_tanh(gate) * up (Gemma-2): saves its input only, like _SwiGLU (same bytes)."""

    @staticmethod
    def forward(ctx, gu):
        ctx.save_for_backward(gu)
        g, u = gu.chunk(2, dim=-1)
        return F.gelu(g, approximate="tanh") * u

    @staticmethod
    def backward(ctx, dy):
        (gu,) = ctx.saved_tensors
        g, u = gu.float().chunk(2, dim=-1)
        return _geglu_grad(g, u, dy).to(gu.dtype)


def _geglu_grad(g, u, dy):
    """d(gelu_tanh(g) * u) for fp32 g, u (as `_swiglu_grad`)."""
    th = torch.tanh(0.7978845608 * (g + 0.044715 * g ** 3))
    dgelu = 0.5 * (1 + th) + 0.5 * g * (1 - th * th) * 0.7978845608 * (1 + 0.134145 * g * g)
    dg = dy * u * dgelu
    du = dy * 0.5 * g * (1 + th)
    return torch.cat([dg, du], dim=-1)


class _WeightedGLU(Function):
    """The experts' gated activation times each token copy's routing weight p, in one kernel,
    as Megatron-Core (>= 0.13) applies the routing weights: TEGroupedMLP's bias_act_func calls
    weighted_bias_swiglu_impl / weighted_bias_quick_geglu_impl, whose autograd functions
    (megatron/core/fusions/fused_bias_swiglu.py, WeightedSwiGLUFunction) save the input and
    the weights, not the output; backward forms dp = sum(act(gate) * up * dy) from the input.
    The combine then sums the k copies of a token unweighted (token_dispatcher.py,
    combine_postprocess: unpermute without probs), so no expert output is kept for the
    weights' gradient."""

    @staticmethod
    def forward(ctx, gu, p, kind):
        ctx.save_for_backward(gu, p)
        ctx.kind = kind
        g, u = gu.chunk(2, dim=-1)
        act = F.silu(g) if kind == "swiglu" else F.gelu(g, approximate="tanh")
        return (act * u * p).to(gu.dtype)

    @staticmethod
    def backward(ctx, dy):  # one kernel: reads gu, dy and p once, writes d gu and d p
        gu, p = ctx.saved_tensors
        g, u = gu.float().chunk(2, dim=-1)
        dyf = dy.float()
        act = F.silu(g) if ctx.kind == "swiglu" else F.gelu(g, approximate="tanh")
        dp = (act * u * dyf).sum(-1, keepdim=True)
        grad = _swiglu_grad if ctx.kind == "swiglu" else _geglu_grad
        return grad(g, u, dyf * p).to(gu.dtype), dp.to(p.dtype), None


class _SoftCap(Function):
    """c * tanh(x / c) (Gemma-2's final logits): keeps its output for backward (1 - (y/c)^2)."""

    @staticmethod
    def forward(ctx, x, cap):
        y = (torch.tanh(x.float() / cap) * cap).to(x.dtype)
        ctx.save_for_backward(y)
        ctx.cap = cap
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return (dy.float() * (1 - (y.float() / ctx.cap) ** 2)).to(dy.dtype), None


class _VocabParallelCE(Function):
    """Megatron-LM vocab-parallel cross-entropy: fp32 softmax kept for backward; max, target
    logit and sum of exponentials all-reduced over tp (4 bytes per token each)."""

    @staticmethod
    def forward(ctx, logits, target, tp):
        lf = logits.float()
        mx = lf.max(dim=-1, keepdim=True).values
        if tp > 1:
            _record("all_reduce", "fwd", "tp", mx)
        e = (lf - mx).exp()
        tgt = lf.gather(-1, target.clamp(0, lf.shape[-1] - 1).unsqueeze(-1))
        se = e.sum(-1, keepdim=True)
        if tp > 1:
            _record("all_reduce", "fwd", "tp", tgt)
            _record("all_reduce", "fwd", "tp", se)
        softmax = e / se
        ctx.save_for_backward(softmax, target)
        return (se.log() + mx - tgt).squeeze(-1)

    @staticmethod
    def backward(ctx, dloss):
        softmax, target = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, target.clamp(0, grad.shape[-1] - 1).unsqueeze(-1),
                          -torch.ones_like(target, dtype=grad.dtype).unsqueeze(-1))
        return (grad * dloss.unsqueeze(-1)).to(DTYPE), None, None


# --------------------------------------------------------------------------------------------
# Operator modules (the leaves of the traced graph; each is one operator of the layer graph)
# --------------------------------------------------------------------------------------------


def dropout(x, p: float):
    """Training-mode dropout as the fused GPU kernel runs it: a 1-byte mask is kept for backward
    (F.dropout off-GPU keeps a mask in the input dtype instead)."""
    return torch.native_dropout(x, p, True)[0] if p else x


def _param(*shape) -> nn.Parameter:
    """A weight; initialised only where it has values (on the meta device a normal_ would
    only cost a Python-dispatched meta kernel, about a tenth of a trace)."""
    t = torch.empty(*shape, dtype=DTYPE)
    return nn.Parameter(t if t.is_meta else t.normal_(0, 0.02))


class Linear(nn.Module):
    op_kind = "matmul"

    def __init__(self, name, d_in, d_out, bias):
        super().__init__()
        self.op_name = name
        self.weight = _param(d_out, d_in)
        self.bias = _param(d_out) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class ExpertLinear(nn.Module):
    """The local experts' weights [E_loc, d_in, d_out] applied as one batched matmul."""

    op_kind = "matmul"

    def __init__(self, name, num_local, d_in, d_out, bias=False):
        super().__init__()
        self.op_name, self.op_count = name, num_local
        self.weight = _param(num_local, d_in, d_out)
        self.bias = _param(num_local, 1, d_out) if bias else None  # gpt-oss: a bias per expert

    def forward(self, x):
        if self.bias is not None:
            return torch.baddbmm(self.bias, x, self.weight)
        return torch.bmm(x, self.weight)


class Norm(nn.Module):
    op_kind = "memory"

    def __init__(self, name, h, kind, dropout=0.0):
        super().__init__()
        self.op_name, self.kind, self.p = name, kind, dropout
        self.weight = nn.Parameter(torch.ones(h, dtype=DTYPE))
        self.bias = nn.Parameter(torch.zeros(h, dtype=DTYPE)) if kind == "layernorm" else None

    def forward(self, x):
        if self.kind == "layernorm":
            y = F.layer_norm(x, x.shape[-1:], self.weight, self.bias, 1e-5)
        else:
            y = _RMSNorm.apply(x, self.weight, 1e-5)
        return dropout(y, self.p)


class Activation(nn.Module):
    op_kind = "memory"

    def __init__(self, name, kind):
        super().__init__()
        self.op_name, self.kind = name, kind

    def forward(self, x, probs=None):
        if probs is not None:  # the experts' activation, weighted by the routing weights
            return _WeightedGLU.apply(x, probs, self.kind)
        if self.kind == "gelu":
            return F.gelu(x, approximate="tanh")
        if self.kind == "geglu":
            return _GeGLU.apply(x)
        return _SwiGLU.apply(x)


class BiasDropoutAdd(nn.Module):
    """residual + dropout(y + bias): Megatron's fused bias-dropout-add (bias replicated over tp)."""

    op_kind = "memory"

    def __init__(self, name, h, bias, dropout):
        super().__init__()
        self.op_name, self.p = name, dropout
        self.bias = nn.Parameter(torch.zeros(h, dtype=DTYPE)) if bias else None

    def forward(self, residual, y):
        if self.bias is not None:
            y = y + self.bias
        return residual + dropout(y, self.p)


class PackQKV(nn.Module):
    op_kind = "memory"

    def __init__(self, name, s, kv, g, d, rope):
        super().__init__()
        self.op_name, self.kv, self.g, self.d = name, kv, g, d
        if rope:
            inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
            ang = torch.outer(torch.arange(s, dtype=torch.float32), inv)
            ang = torch.cat([ang, ang], dim=-1)
            self.register_buffer("cos", ang.cos().to(DTYPE), persistent=False)
            self.register_buffer("sin", ang.sin().to(DTYPE), persistent=False)
        else:
            self.cos = self.sin = None

    def forward(self, qkv):
        return _PackQKV.apply(qkv, self.cos, self.sin, self.kv, self.g, self.d)


class AttentionCore(nn.Module):
    """softmax(Q K^T / sqrt(d), causal) V with dropout on the probabilities, unfused (Korthikanti).

    Input: the packed buffer [b*kv, (g+2)*s, d] (grouped layout), or, for multi-head attention
    without RoPE, the QKV projection [s, b, a*3*d] (Megatron's interleaved layout, views only).
    With context parallelism K and V are all-gathered over cp (re-gathered in backward).
    Output [s, b, a*d]. `flop_scale` 0.5 for causal models: flash kernels skip masked blocks.
    """

    op_kind = "attention"

    def __init__(self, b, a, kv, d, s_q, s_kv, cp, causal, dropout, packed, window=0,
                 sinks=False):
        super().__init__()
        self.op_name = "attention"
        # gpt-oss: one learned logit per head joins each query's softmax and is dropped after it
        self.sinks = nn.Parameter(torch.zeros(a, dtype=DTYPE)) if sinks else None
        self.b, self.a, self.kv, self.g, self.d = b, a, kv, a // kv, d
        self.s_q, self.s_kv, self.cp, self.p, self.packed = s_q, s_kv, cp, dropout, packed
        self.flop_scale, self.band = window_scale(s_kv, window, causal)
        self.shape = (b, a, s_q, s_kv, d)
        self.kv_gather = Comm("gather", "cp", cp, dim=2 if packed else 0, keep_shard=True)

    def forward(self, x):
        b, a, kv, g, d, s = self.b, self.a, self.kv, self.g, self.d, self.s_q
        if self.packed:
            q = x[:, : g * s]
            kvb = x[:, g * s:].view(b * kv, 2, s, d)
            if self.cp > 1:
                kvb = self.kv_gather(kvb)
            k, v = kvb[:, 0], kvb[:, 1]
        else:  # [s, b, a*3*d] -> views [b*a, s, d]
            x = x.view(s, b * a, 3, d)
            q = x[:, :, 0].transpose(0, 1)
            kvb = x[:, :, 1:]
            if self.cp > 1:
                kvb = self.kv_gather(kvb)
            k, v = kvb[:, :, 0].transpose(0, 1), kvb[:, :, 1].transpose(0, 1)
        if self.band < self.s_kv:  # sliding window: each query scores a band of w keys
            k, v = k[:, : self.band], v[:, : self.band]
        # the causal mask is applied on chip (flash / fused masked softmax): no tensor for it
        scores = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(d))
        if self.sinks is not None:  # [b*kv, g*s, n] scores; head (kv, g) has sink kv*g + g
            sink = self.sinks.view(1, kv, g, 1, 1).expand(b, kv, g, s, 1).reshape(b * kv, g * s, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        probs = dropout(probs, self.p)
        ctx = torch.bmm(probs, v)
        if self.packed:
            return ctx.view(b, kv, g, s, d).permute(3, 0, 1, 2, 4).reshape(s, b, a * d)
        return ctx.transpose(0, 1).reshape(s, b, a * d)


def window_scale(s: int, window: int, causal: bool) -> tuple[float, int]:
    """(flop_scale, band): the attention core scores each query against `band` keys and scales
    the measured FLOPs so that they count the scores a kernel computes: s^2/2 for causal
    attention (flash kernels skip masked blocks), and with a window w < s the causal band,
    w^2/2 + (s - w) w of the s x s scores (query i sees min(i+1, w) keys, as transformers'
    sliding-window mask), i.e. band w at scale 1 - w / (2 s)."""
    if not window or window >= s:
        return (0.5 if causal else 1.0), s
    if not causal:
        raise ValueError("a sliding window is modelled for causal attention only")
    return 1.0 - window / (2.0 * s), window


class QKNorm(nn.Module):
    """RMSNorm over each head's Q and K (Qwen3, Gemma-3), on the [s, b, kv*(g+2)*d] projection;
    `full`: over the whole Q and the whole K projection (OLMo-2; weights a*d and kv*d split over
    tp like the projection, each token's fp32 sum of squares all-reduced over tp, forward and
    backward)."""

    op_kind = "memory"

    def __init__(self, kv, g, d, full=False, tp=1):
        super().__init__()
        self.op_name, self.kv, self.g, self.d, self.full, self.tp = "qk_norm", kv, g, d, full, tp
        self.q_weight = nn.Parameter(torch.ones(kv * g * d if full else d, dtype=DTYPE))
        self.k_weight = nn.Parameter(torch.ones(kv * d if full else d, dtype=DTYPE))

    def forward(self, qkv):
        s, b, _ = qkv.shape
        kv, g, d = self.kv, self.g, self.d
        x = qkv.view(s, b, kv, g + 2, d)
        if not self.full:
            q = _RMSNorm.apply(x[:, :, :, :g], self.q_weight, 1e-6)
            k = _RMSNorm.apply(x[:, :, :, g: g + 1], self.k_weight, 1e-6)
        else:
            if self.tp > 1:
                stat = qkv.new_empty((s, b), dtype=torch.float32)
                for phase in _PHASES:
                    for _ in "qk":
                        _record("all_reduce", phase, "tp", stat)
            q = _RMSNorm.apply(x[:, :, :, :g].reshape(s, b, kv * g * d), self.q_weight,
                               1e-6).view(s, b, kv, g, d)
            k = _RMSNorm.apply(x[:, :, :, g].reshape(s, b, kv * d), self.k_weight,
                               1e-6).view(s, b, kv, 1, d)
        return torch.cat([q, k, x[:, :, :, g + 1:]], dim=3).view(s, b, -1)


class MlaPack(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, section 2.1.2): per head Q = [q_nope, rope(q_pe)]
    and K = [k_nope, rope(k_pe)] (k_pe one [s, b, r] tensor shared by all heads), V; written as
    one buffer [b*a, s, 2*dq + dv] (the RoPE kernel's pack, as PackQKV; saves nothing)."""

    op_kind = "memory"

    def __init__(self, a, nope, rope, dv):
        super().__init__()
        self.op_name, self.a, self.nope, self.rope, self.dv = "mla_rope", a, nope, rope, dv

    def forward(self, q, kv, k_pe):
        s, b, _ = q.shape
        a, n, r, dv = self.a, self.nope, self.rope, self.dv
        q = q.view(s, b, a, n + r)
        kv = kv.view(s, b, a, n + dv)
        k = torch.cat([kv[..., :n], k_pe.view(s, b, 1, r).expand(s, b, a, r)], dim=-1)
        out = torch.cat([q, k, kv[..., n:]], dim=-1)  # s, b, a, 2(n+r)+dv
        return out.permute(1, 2, 0, 3).reshape(b * a, s, 2 * (n + r) + dv)


class MlaCore(nn.Module):
    """softmax(Q K^T / sqrt(dq), causal) V on MLA's packed [b*a, s, 2*dq + dv] buffer (unfused,
    as AttentionCore); with cp, K and V all-gathered over cp. Output [s, b, a*dv]."""

    op_kind = "attention"

    def __init__(self, b, a, dq, dv, s_q, s_kv, cp, window=0):
        super().__init__()
        self.op_name = "attention"
        self.b, self.a, self.dq, self.dv, self.s_q, self.s_kv, self.cp = b, a, dq, dv, s_q, s_kv, cp
        self.flop_scale, self.band = window_scale(s_kv, window, True)
        self.shape = (b, a, s_q, s_kv, dq)
        self.kv_gather = Comm("gather", "cp", cp, dim=1, keep_shard=True)

    def forward(self, x):
        dq = self.dq
        q, kvb = x[..., :dq], x[..., dq:]
        if self.cp > 1:
            kvb = self.kv_gather(kvb)
        k, v = kvb[:, : self.band, :dq], kvb[:, : self.band, dq:]
        probs = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(dq)), dim=-1)
        ctx = torch.bmm(probs, v)  # b*a, s, dv
        return ctx.view(self.b, self.a, self.s_q, self.dv).permute(2, 0, 1, 3).reshape(
            self.s_q, self.b, self.a * self.dv)


class SoftCap(nn.Module):
    op_kind = "memory"

    def __init__(self, cap):
        super().__init__()
        self.op_name, self.cap = "logit_softcap", cap

    def forward(self, x):
        return _SoftCap.apply(x, self.cap)


class VocabEmbedding(nn.Module):
    """Vocab-parallel lookup: rows [r*V/t, (r+1)*V/t) here, other tokens give zeros (summed by
    the following all-reduce / reduce-scatter over tp)."""

    op_kind = "memory"

    def __init__(self, vocab_local, h, tp):
        super().__init__()
        self.op_name, self.tp, self.vocab_local = "embedding_lookup", tp, vocab_local
        self.weight = _param(vocab_local, h)

    def forward(self, ids):
        if self.tp == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < 0) | (ids >= self.vocab_local)  # rank 0's range
        out = F.embedding(ids.masked_fill(outside, 0), self.weight)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)


class EmbeddingAdd(nn.Module):
    """+ learned positions (+ BERT token type 0), then dropout unless a norm follows."""

    op_kind = "memory"

    def __init__(self, s, h, s_loc, token_types, dropout):
        super().__init__()
        self.op_name, self.s_loc, self.p = "embedding_add", s_loc, dropout
        self.position = _param(s, h)
        self.token_type = _param(2, h) if token_types else None

    def forward(self, x):
        x = x + self.position[: self.s_loc].unsqueeze(1)
        if self.token_type is not None:
            x = x + self.token_type[0]
        return dropout(x, self.p)


class MoeRoute(nn.Module):
    """fp32 softmax over experts, top-k, renormalised weights; slot order sorted by expert."""

    op_kind = "memory"

    def __init__(self, k):
        super().__init__()
        self.op_name, self.k = "moe_route", k

    def forward(self, logits):
        probs = torch.softmax(logits.float(), dim=-1)
        w, idx = torch.topk(probs, self.k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(DTYPE)
        order = idx.flatten().argsort()  # balanced routing: E equal slices of T*k/E slots
        return w, order, order.argsort()


class MoePermute(nn.Module):
    """Token copies in expert order as [E, cap, h], and their routing weights beside them as
    [E, cap, 1] (Megatron-Core's permute carries the probs with the tokens: moe_utils.permute,
    TE's moe_permute_with_probs); when T*k is not a multiple of E, cap is rounded up and the
    last slots are padding (at most E - 1 extra rows, weight 0)."""

    op_kind = "memory"

    def __init__(self, E, cap, k):
        super().__init__()
        self.op_name, self.E, self.cap, self.k = "moe_permute", E, cap, k

    def forward(self, x, w, order):
        src, probs = order // self.k, w.reshape(-1).index_select(0, order)
        pad = self.E * self.cap - order.shape[0]
        if pad:
            src = torch.cat([src, src.new_zeros(pad)])
            probs = torch.cat([probs, probs.new_zeros(pad)])
        y = x.index_select(0, src).view(self.E, self.cap, x.shape[-1])
        return y, probs.view(self.E, self.cap, 1)


class MoeCombine(nn.Module):
    """Back to token order, sum over the k expert outputs of each token (the routing weights
    were applied in the experts' activation, `_WeightedGLU`)."""

    op_kind = "memory"

    def __init__(self, k):
        super().__init__()
        self.op_name, self.k = "moe_combine", k

    def forward(self, y, inv):
        h = y.shape[-1]
        return y.reshape(-1, h).index_select(0, inv).view(-1, self.k, h).sum(1)


class CrossEntropy(nn.Module):
    op_kind = "memory"

    def __init__(self, tp):
        super().__init__()
        self.op_name, self.tp = "cross_entropy", tp

    def forward(self, logits, target):
        v = logits.shape[-1]
        return _VocabParallelCE.apply(logits.view(-1, v), target.reshape(-1), self.tp)


# --------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------


def _check(m: ModelSpec, v: Variant, mbs: int) -> None:
    widths = (m.ffn_hidden_size, m.shared_ffn_hidden_size, m.dense_ffn_hidden_size)
    if m.num_heads % v.tp or m.num_kv_heads % v.tp or any(w % v.tp for w in widths):
        raise ValueError(f"{m.source_file or m.name}: tp={v.tp} must divide num_heads, "
                         f"num_kv_heads={m.num_kv_heads} and every MLP width {widths} (KV heads "
                         f"are not replicated in the traced model)")
    if m.seq_len % (v.cp * (v.tp if v.sp else 1)):
        k, who = v.cp * (v.tp if v.sp else 1), m.source_file or m.name  # blank: a cache key
        raise ValueError(f"{who + ': ' if who else ''}seq_len={m.seq_len} must be a multiple of "
                         f"{k} (cp={v.cp} splits the sequence"
                         + (f", and tp={v.tp} under sequence parallelism" if v.sp else "") + ")")
    if m.num_experts % v.ep:
        raise ValueError(f"{m.name}: ep={v.ep} does not divide num_experts={m.num_experts}")


class _TP:
    """The f/g operator pair of one Megatron region (none when t = 1)."""

    def __init__(self, v: Variant, keep_shard: bool = True):
        self.v, self.keep = v, keep_shard

    def enter(self):
        if self.v.tp == 1:
            return None
        if self.v.sp:
            return Comm("gather", "tp", self.v.tp, dim=0, keep_shard=self.keep)
        return Comm("f", "tp", self.v.tp)

    def exit(self):
        if self.v.tp == 1:
            return None
        return Comm("scatter", "tp", self.v.tp) if self.v.sp else Comm("g", "tp", self.v.tp)


class Mlp(nn.Module):
    """The MLP of width `f` (default ffn_hidden_size) split over t; `prefix` names its ops."""

    def __init__(self, m: ModelSpec, t: int, f: int | None = None, prefix: str = "mlp"):
        super().__init__()
        h, bias = m.hidden_size, m.family in ("bert", "gpt") or m.linear_bias
        f = (f or m.ffn_hidden_size) // t
        if m.ffn_type == "gelu":
            self.up = Linear(f"{prefix}_up", h, f, bias)
            self.act = Activation("gelu" if prefix == "mlp" else f"{prefix}_gelu", "gelu")
        else:
            self.up = Linear(f"{prefix}_gate_up", h, 2 * f, bias)
            name = m.ffn_type if prefix == "mlp" else f"{prefix}_{m.ffn_type}"
            self.act = Activation(name, m.ffn_type)
        self.down = Linear(f"{prefix}_down", f, h, False)  # its bias lives in residual2

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class MoE(nn.Module):
    """`slots` (nest.graph.fx_batch's slot tag): the slots per expert given, not computed from
    the tokens (it must exceed tokens * k / E: the padded layout)."""

    def __init__(self, m: ModelSpec, v: Variant, tokens: int, slots: int | None = None):
        super().__init__()
        h, f, E, e, k = m.hidden_size, m.ffn_hidden_size // v.tp, m.num_experts, v.ep, m.top_k
        cap = expert_slots(tokens, k, E)  # balanced routing: slots per expert on this device
        if slots is not None:
            assert slots * E > tokens * k, (slots, tokens)
            cap = slots
        self.h = h
        self.router = Linear("router", h, E, m.linear_bias)
        self.route = MoeRoute(k)
        self.permute = MoePermute(E, cap, k)
        # Megatron-Core MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/
        # token_dispatcher.py): with sp a rank routes only its sequence shard, so token_dispatch
        # all-to-alls 1/t of the tokens over ep, dispatch_postprocess all-gathers what arrived
        # over the expert-tensor-parallel group (size t by default) and combine_preprocess
        # reduce-scatters it back; the stand-in keeps the gathered [E, cap, h] shapes
        etp = v.tp if v.sp and e > 1 else 1
        self.dispatch = Comm("all_to_all", "ep", e, out_shape=(E // e, e * cap, h),
                             shard=etp) if e > 1 else None
        # token_dispatch all-to-alls the permuted probs beside the tokens (and
        # dispatch_postprocess all-gathers them over etp): T k weights, h / 2 times fewer bytes
        # than the tokens'; a shape stand-in that records no collective
        self.dispatch_probs = Comm("relayout", "ep", e, out_shape=(E // e, e * cap, 1)) \
            if e > 1 else None
        self.etp_gather = Comm("etp_gather", "tp", etp) if etp > 1 else None
        self.experts_gate_up = ExpertLinear("expert_gate_up", E // e, h, 2 * f, m.linear_bias)
        self.experts_act = Activation(f"expert_{m.ffn_type}", m.ffn_type)
        self.experts_down = ExpertLinear("expert_down", E // e, f, h, m.linear_bias)
        self.etp_scatter = Comm("etp_scatter", "tp", etp) if etp > 1 else None
        self.undispatch = Comm("all_to_all", "ep", e, out_shape=(E, cap, h),
                               shard=etp) if e > 1 else None
        self.combine = MoeCombine(k)
        # shared experts: a dense MLP on every token, split over tp (Qwen2-MoE, DeepSeek)
        self.shared = Mlp(m, v.tp, m.shared_ffn_hidden_size, "shared") \
            if m.shared_ffn_hidden_size else None
        self.shared_gate = Linear("shared_gate", h, 1, False) if m.shared_expert_gate else None
        self.shared_add = SharedAdd() if self.shared is not None else None

    def forward(self, x):
        flat = x.view(-1, self.h)
        w, order, inv = self.route(self.router(flat))
        y, probs = self.permute(flat, w, order)
        if self.dispatch is not None:
            y = self.dispatch(y)
            probs = self.dispatch_probs(probs)
        if self.etp_gather is not None:
            y = self.etp_gather(y)
        y = self.experts_down(self.experts_act(self.experts_gate_up(y), probs))
        if self.etp_scatter is not None:
            y = self.etp_scatter(y)
        if self.undispatch is not None:
            y = self.undispatch(y)
        out = self.combine(y, inv)
        if self.shared is not None:
            gate = self.shared_gate(flat) if self.shared_gate is not None else None
            out = self.shared_add(out, self.shared(flat), gate)
        return out.view(x.shape)


class SharedAdd(nn.Module):
    """routed + (sigmoid(gate) *) shared expert output."""

    op_kind = "memory"
    op_name = "shared_add"

    def forward(self, routed, shared, gate):
        if gate is not None:
            shared = torch.sigmoid(gate) * shared
        return routed + shared


class Block(nn.Module):
    """One transformer block; input and output [s_loc (/t with sp), b, h]. `dense`: a dense MLP
    in an MoE model (DeepSeek's first blocks); `window`: this block's attention window."""

    def __init__(self, m: ModelSpec, v: Variant, mbs: int, dense: bool = False, window: int = 0,
                 slots: int | None = None):
        super().__init__()
        t = v.tp
        h, a, kv, d = m.hidden_size, m.num_heads // t, m.num_kv_heads // t, m.head_dim
        s_loc = m.seq_len // v.cp
        bias, p = m.family in ("bert", "gpt") or m.linear_bias, (DROPOUT_P if m.has_dropout
                                                                  else 0.0)
        rope = m.family in ("llama", "mixtral")
        self.post_norm = m.family == "bert"
        self.norm1 = Norm("norm1", h, m.norm) if m.pre_norm else None
        self.tp_in1, self.tp_out1 = _TP(v).enter(), _TP(v).exit()
        self.mla = m.is_mla
        if self.mla:  # down-projections and their norms replicated over tp (Megatron-core MLA)
            r, dq, dv = m.qk_rope_head_dim, m.head_dim, m.v_head_dim
            if m.q_lora_rank:
                self.q_down = Linear("q_down", h, m.q_lora_rank, False)
                self.q_norm = Norm("q_norm", m.q_lora_rank, "rmsnorm")
                self.q_up = Linear("q_up", m.q_lora_rank, a * dq, False)
            else:
                self.q_up = Linear("q_proj", h, a * dq, False)
            self.kv_down = Linear("kv_down", h, m.kv_lora_rank + r, False)
            self.kv_norm = Norm("kv_norm", m.kv_lora_rank, "rmsnorm")
            self.kv_up = Linear("kv_up", m.kv_lora_rank, a * (dq - r + dv), False)
            self.pack = MlaPack(a, dq - r, r, dv)
            self.attention = MlaCore(mbs, a, dq, dv, s_loc, m.seq_len, v.cp, window)
            self.out_proj = Linear("out_proj", a * dv, h, False)
        else:
            self.qkv = Linear("qkv", h, (a + 2 * kv) * d, bias or m.qkv_bias)
            self.qk_norm = QKNorm(kv, a // kv, d, m.qk_norm_full, t) if m.qk_norm else None
            packed = rope or kv != a
            self.pack = PackQKV("rope" if rope else "qkv_layout", s_loc, kv, a // kv, d,
                                rope=rope) if packed else None
            self.attention = AttentionCore(mbs, a, kv, d, s_loc, m.seq_len, v.cp, m.causal, p,
                                           packed, window, m.attention_sinks)
            self.out_proj = Linear("out_proj", a * d, h, False)
        post = m.sandwich_norm or not m.pre_norm  # OLMo-2: post-norms only
        self.post_norm1 = Norm("post_norm1", h, m.norm) if post else None
        self.residual1 = BiasDropoutAdd("residual1", h, bias, p)
        self.norm2 = Norm("norm2", h, m.norm) if m.pre_norm else None
        self.tp_in2, self.tp_out2 = _TP(v).enter(), _TP(v).exit()
        if m.is_moe and not dense:
            self.mlp = MoE(m, v, mbs * s_loc, slots)
        else:
            self.mlp = Mlp(m, t, m.dense_ffn_hidden_size if m.is_moe else None)
        self.post_norm2 = Norm("post_norm2", h, m.norm) if post else None
        dense_bias = m.family in ("bert", "gpt") or (m.linear_bias and not isinstance(self.mlp, MoE))
        self.residual2 = BiasDropoutAdd("residual2", h, dense_bias, p)

    def _attn(self, x):
        if self.tp_in1 is not None:
            x = self.tp_in1(x)
        if self.mla:
            q = self.q_up(self.q_norm(self.q_down(x)) if hasattr(self, "q_down") else x)
            ckv = self.kv_down(x)
            r = self.pack.rope
            kv = self.kv_up(self.kv_norm(ckv[..., :-r]))
            x = self.pack(q, kv, ckv[..., -r:])
        else:
            x = self.qkv(x)
            if self.qk_norm is not None:
                x = self.qk_norm(x)
            if self.pack is not None:
                x = self.pack(x)
        x = self.out_proj(self.attention(x))
        x = self.tp_out1(x) if self.tp_out1 is not None else x
        return self.post_norm1(x) if self.post_norm1 is not None else x

    def _mlp(self, x):
        if self.tp_in2 is not None:
            x = self.tp_in2(x)
        x = self.mlp(x)
        x = self.tp_out2(x) if self.tp_out2 is not None else x
        return self.post_norm2(x) if self.post_norm2 is not None else x

    def forward(self, x):
        if self.post_norm:  # BERT: x = LN(x + f(x))
            x = self.norm1(self.residual1(x, self._attn(x)))
            return self.norm2(self.residual2(x, self._mlp(x)))
        x = self.residual1(x, self._attn(self.norm1(x) if self.norm1 is not None else x))
        return self.residual2(x, self._mlp(self.norm2(x) if self.norm2 is not None else x))


class EmbeddingLayer(nn.Module):
    """token ids [s_loc, b] -> hidden [s_loc (/t with sp), b, h]."""

    def __init__(self, m: ModelSpec, v: Variant):
        super().__init__()
        h, t, s_loc = m.hidden_size, v.tp, m.seq_len // v.cp
        s_out = s_loc // t if v.sp else s_loc
        p = DROPOUT_P if m.has_dropout else 0.0
        self.lookup = VocabEmbedding(math.ceil(m.vocab_size / t), h, t)
        self.tp_out = None if t == 1 else (Comm("scatter", "tp", t) if v.sp else Comm("g", "tp", t))
        bert = m.family == "bert"
        self.add = EmbeddingAdd(m.seq_len, h, s_out, bert, 0.0 if bert else p) \
            if m.learned_positions else None
        self.norm = Norm("embedding_norm", h, m.norm, dropout=p) if bert else None

    def forward(self, ids):
        x = self.lookup(ids)
        if self.tp_out is not None:
            x = self.tp_out(x)
        if self.add is not None:
            x = self.add(x)
        return self.norm(x) if self.norm is not None else x


class HeadLayer(nn.Module):
    """(hidden [s_loc (/t with sp), b, h], targets [s_loc, b]) -> loss per token [s_loc * b]."""

    def __init__(self, m: ModelSpec, v: Variant, mbs: int = 1, slots: int | None = None):
        super().__init__()
        h, t = m.hidden_size, v.tp
        self.bert = m.family == "bert"
        if self.bert:  # MLM transform: dense + GELU + LayerNorm (replicated over tp)
            self.tp_in = _TP(v, keep_shard=False).enter() if v.sp else None
            self.mlm_dense = Linear("mlm_dense", h, h, True)
            self.mlm_gelu = Activation("mlm_gelu", "gelu")
            self.final_norm = Norm("final_norm", h, m.norm)
            self.tp_in2 = _TP(v).enter() if (t > 1 and not v.sp) else None
        else:  # the gathered LM-head input is kept (as the closed form counts it)
            self.final_norm = Norm("final_norm", h, m.norm)
            self.tp_in = _TP(v, keep_shard=False).enter()
            self.tp_in2 = None
        self.lm_head = Linear("lm_head", h, math.ceil(m.vocab_size / t), self.bert)
        self.softcap = SoftCap(m.final_softcap) if m.final_softcap else None
        self.loss = CrossEntropy(t)
        self.mtp = nn.ModuleList(MtpModule(m, v, mbs, slots) for _ in range(m.mtp_layers))

    def forward(self, x, target):
        hidden = x
        loss = self._loss(x, target)
        for mtp in self.mtp:  # DeepSeek-V3: each module predicts one token further
            hidden = mtp(hidden, target)
            loss = mtp.add(loss, self._loss(hidden, target, mtp.final_norm))
        return loss

    def _loss(self, x, target, final_norm=None):
        if self.bert:
            if self.tp_in is not None:
                x = self.tp_in(x)
            x = self.final_norm(self.mlm_gelu(self.mlm_dense(x)))
            if self.tp_in2 is not None:
                x = self.tp_in2(x)
        else:
            x = (final_norm or self.final_norm)(x)
            if self.tp_in is not None:
                x = self.tp_in(x)
        logits = self.lm_head(x)
        if self.softcap is not None:
            logits = self.softcap(logits)
        return self.loss(logits, target)


class MtpModule(nn.Module):
    """One multi-token-prediction module (DeepSeek-V3, section 2.2; Megatron-LM's
    MultiTokenPredictionLayer): RMSNorm of the previous depth's hidden state and of the next
    token's embedding, concatenated, projected 2h -> h, one transformer block (an MoE block), then
    its own final norm before the shared output head and a cross-entropy loss. The embedding
    table is the main model's, held again on the last pipeline stage (as Megatron-LM does); the
    2h x h projection is replicated over tp (0.1% of DeepSeek-V3's MTP FLOPs)."""

    def __init__(self, m: ModelSpec, v: Variant, mbs: int, slots: int | None = None):
        super().__init__()
        h = m.hidden_size
        self.embed = EmbeddingLayer(m, v)
        self.hnorm, self.enorm = Norm("mtp_hnorm", h, m.norm), Norm("mtp_enorm", h, m.norm)
        self.eh_proj = Linear("mtp_eh_proj", 2 * h, h, False)
        self.block = Block(m, v, mbs, slots=slots)
        self.final_norm = Norm("mtp_final_norm", h, m.norm)
        self.add = LossAdd()

    def forward(self, hidden, target):
        e = self.embed(target)  # the shifted tokens' embeddings (same shape as the ids)
        x = self.eh_proj(torch.cat([self.hnorm(hidden), self.enorm(e)], dim=-1))
        return self.block(x)


class LossAdd(nn.Module):
    op_kind = "memory"
    op_name = "mtp_loss_add"

    def forward(self, a, b):
        return a + b


LAYER_KINDS = ("embedding", "block", "head")


def block_kind(m: ModelSpec, i: int) -> str:
    """The layer kind that builds block i (0-based): "block" (the model's MLP, full attention),
    with ":dense" for a dense block of an MoE model and ":window" for a windowed one."""
    kind = "block:dense" if m.is_moe and m.is_dense_block(i) else "block"
    if m.window_of(i):
        kind += ":window"
    return kind


def block_kinds(m: ModelSpec) -> list[str]:
    return [block_kind(m, i) for i in range(m.num_layers)]


def layer_inputs(m: ModelSpec, kind: str, v: Variant | None = None, mbs: int = 1,
                 device: str | torch.device = "meta") -> tuple[torch.Tensor, ...]:
    """Fresh example inputs of layer `kind` (as build_layer gives them), without the module."""
    v = v or Variant()
    s_loc = m.seq_len // v.cp
    s_in = s_loc // v.tp if v.sp else s_loc
    with torch.device(device):
        ids = torch.zeros(s_loc, mbs, dtype=torch.long)
        if kind == "embedding":
            return (ids,)
        x = torch.empty(s_in, mbs, m.hidden_size, dtype=DTYPE, requires_grad=True)
        return (x, ids) if kind == "head" else (x,)


def build_layer(m: ModelSpec, kind: str, v: Variant | None = None, mbs: int = 1,
                device: str | torch.device = "meta", slots: int | None = None,
                ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """One device's module of layer `kind` under `v` (default: no parallelism) and fresh example
    inputs (float inputs need grad); `slots`: the MoE slots per expert, if given (MoE)."""
    v = v or Variant()
    _check(m, v, mbs)
    s_loc = m.seq_len // v.cp
    s_in = s_loc // v.tp if v.sp else s_loc
    with torch.device(device):
        if kind == "embedding":
            return EmbeddingLayer(m, v), (torch.zeros(s_loc, mbs, dtype=torch.long),)
        x = torch.empty(s_in, mbs, m.hidden_size, dtype=DTYPE, requires_grad=True)
        if kind.startswith("block"):
            flags = kind.split(":")[1:]
            if kind != "block" and set(flags) - {"dense", "window"}:
                raise ValueError(f"unknown layer kind '{kind}'")
            window = m.sliding_window if "window" in flags else 0
            return Block(m, v, mbs, dense="dense" in flags, window=window, slots=slots), (x,)
        if kind == "head":
            return HeadLayer(m, v, mbs, slots), (x, torch.zeros(s_loc, mbs, dtype=torch.long))
    raise ValueError(f"unknown layer kind '{kind}' (expected one of {LAYER_KINDS})")
