"""Model dims -> one real transformer block trained for a few steps: measured time and memory.

The blocks are plain torch modules (pre-norm; no dropout, no rotary embedding): fused QKV
projection, ``scaled_dot_product_attention`` (flash on GPU, causal except BERT), out-projection,
and a GELU MLP, a SwiGLU MLP or a top-k mixture of SwiGLU experts (router softmax over all
experts, top-k renormalised, a loop over experts with gather / ``index_add_``). Parameters are
bf16. ``optimizer="mixed"`` (default) is Megatron-style mixed-precision Adam: fp32 master
weights, fp32 gradient buffers (``main_grad``), fp32 momentum and variance (2 + 4 + 12 = 18 bytes
per parameter held between steps); bf16 gradients exist only from backward to the optimizer step.
``optimizer="bf16"`` runs ``torch.optim.Adam`` on the bf16 parameters directly.

One step = forward of a random bf16 input ``[mbs, seq, hidden]`` (with ``requires_grad`` so that
the input gradient is computed, as in a pipeline stage), ``backward`` of a random output gradient,
optimizer step. Times are medians over the measured steps (CUDA events on GPU).
"""

from __future__ import annotations

import gc
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from .shapes import PAPER_MODELS, TINY_MODELS
from .timing import pick_device

BLOCK_MODELS = ("bert_large", "llama2_7b", "llama3_70b", "gpt3_175b", "mixtral_8x7b")
TINY_BLOCK_MODELS = tuple(d["name"] for d in TINY_MODELS)


def _norm(kind, h, fk):
    if kind == "layernorm":
        return nn.LayerNorm(h, **fk)
    if hasattr(nn, "RMSNorm"):
        return nn.RMSNorm(h, eps=1e-5, **fk)
    raise RuntimeError("nn.RMSNorm needs torch >= 2.4")  # pragma: no cover


class Attention(nn.Module):
    def __init__(self, h, a, kv, bias, causal, fk):
        super().__init__()
        self.a, self.kv, self.hd, self.causal = a, kv, h // a, causal
        self.qkv = nn.Linear(h, (a + 2 * kv) * self.hd, bias=bias, **fk)
        self.out = nn.Linear(a * self.hd, h, bias=bias, **fk)
        self.gqa_native = True

    def forward(self, x):
        b, s, _ = x.shape
        a, kv, hd = self.a, self.kv, self.hd
        q, k, v = self.qkv(x).split([a * hd, kv * hd, kv * hd], dim=-1)
        q = q.view(b, s, a, hd).transpose(1, 2)
        k = k.view(b, s, kv, hd).transpose(1, 2)
        v = v.view(b, s, kv, hd).transpose(1, 2)
        if kv == a:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            if self.gqa_native:
                try:
                    o = F.scaled_dot_product_attention(
                        q, k, v, is_causal=self.causal, enable_gqa=True
                    )
                except (RuntimeError, TypeError):
                    self.gqa_native = False
            if not self.gqa_native:
                k, v = k.repeat_interleave(a // kv, 1), v.repeat_interleave(a // kv, 1)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(o.transpose(1, 2).reshape(b, s, a * hd))


class GeluMLP(nn.Module):
    def __init__(self, h, f, bias, fk):
        super().__init__()
        self.up = nn.Linear(h, f, bias=bias, **fk)
        self.down = nn.Linear(f, h, bias=bias, **fk)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class SwiGLU(nn.Module):
    def __init__(self, h, f, fk):
        super().__init__()
        self.gate = nn.Linear(h, f, bias=False, **fk)
        self.up = nn.Linear(h, f, bias=False, **fk)
        self.down = nn.Linear(f, h, bias=False, **fk)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    def __init__(self, h, f, num_experts, top_k, fk):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(h, num_experts, bias=False, **fk)
        self.experts = nn.ModuleList(SwiGLU(h, f, fk) for _ in range(num_experts))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(x).float(), dim=-1)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            out = out.index_add(0, tok, expert(x[tok]) * w[tok, slot].unsqueeze(-1))
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, dims, device=None, dtype=torch.bfloat16):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        h, a = dims["hidden_size"], dims["num_heads"]
        kv = dims.get("num_kv_heads") or a
        f, bias = dims["ffn_hidden_size"], bool(dims.get("bias", False))
        norm = dims.get("norm") or ("layernorm" if dims["ffn_type"] == "gelu" else "rmsnorm")
        self.norm1 = _norm(norm, h, fk)
        self.attn = Attention(h, a, kv, bias, bool(dims.get("causal", True)), fk)
        self.norm2 = _norm(norm, h, fk)
        if dims.get("num_experts"):
            self.mlp = MoE(h, f, dims["num_experts"], dims["top_k"], fk)
        elif dims["ffn_type"] == "gelu":
            self.mlp = GeluMLP(h, f, bias, fk)
        else:
            self.mlp = SwiGLU(h, f, fk)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def block_num_params(dims) -> int:
    """Closed-form parameter count of ``Block(dims)``."""
    h, a = dims["hidden_size"], dims["num_heads"]
    kv = dims.get("num_kv_heads") or a
    hd, f, bias = h // a, dims["ffn_hidden_size"], int(bool(dims.get("bias", False)))
    norm = dims.get("norm") or ("layernorm" if dims["ffn_type"] == "gelu" else "rmsnorm")
    n = h * (a + 2 * kv) * hd + bias * (a + 2 * kv) * hd + a * hd * h + bias * h
    n += 2 * (2 * h if norm == "layernorm" else h)
    if dims.get("num_experts"):
        n += h * dims["num_experts"] + dims["num_experts"] * 3 * h * f
    elif dims["ffn_type"] == "gelu":
        n += 2 * h * f + bias * (f + h)
    else:
        n += 3 * h * f
    return n


def block_fwd_flops(dims, mbs, seq) -> int:
    """Analytic forward FLOPs (GEMMs + attention scores; 2 per multiply-add; MoE: active experts)."""
    h, a = dims["hidden_size"], dims["num_heads"]
    kv = dims.get("num_kv_heads") or a
    hd, f, tokens = h // a, dims["ffn_hidden_size"], mbs * seq
    gemm = h * (a + 2 * kv) * hd + a * hd * h
    if dims.get("num_experts"):
        gemm += h * dims["num_experts"] + dims["top_k"] * 3 * h * f
    else:
        gemm += (2 if dims["ffn_type"] == "gelu" else 3) * h * f
    frac = 0.5 if dims.get("causal", True) else 1.0
    return int(2 * tokens * gemm + 4 * mbs * a * seq * seq * hd * frac)


class MixedAdam:
    """bf16 model weights; fp32 master weights, gradient buffers and Adam states (18 B/param)."""

    def __init__(self, params, lr=1e-4, fused=None):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().to(torch.float32, copy=True) for p in self.params]
        for m in self.master:
            m.grad = torch.zeros_like(m)
        self.opt = _adam(self.master, lr, fused)
        self.fused = self.opt.defaults.get("fused")

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad.copy_(p.grad)
            p.grad = None
        self.opt.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)


class PlainAdam:
    def __init__(self, params, lr=1e-4, fused=None):
        self.opt = _adam(list(params), lr, fused)
        self.fused = self.opt.defaults.get("fused")

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def _adam(params, lr, fused):
    if fused is not False:
        try:
            return torch.optim.Adam(params, lr=lr, fused=True)
        except (RuntimeError, TypeError, ValueError):
            pass
    return torch.optim.Adam(params, lr=lr)


def _now(device):
    if device == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


def _elapsed(a, b, device):
    return a.elapsed_time(b) * 1e-3 if device == "cuda" else b - a


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _mem(device):
    return torch.cuda.memory_allocated() if device == "cuda" else None


def run_block(
    dims,
    *,
    device=None,
    mbs=1,
    seq_len=None,
    warmup_steps=3,
    num_steps=10,
    optimizer="mixed",
    dtype=torch.bfloat16,
) -> dict:
    """Train one block for warmup_steps + num_steps steps; return the measurements."""
    device = device or pick_device()
    seq = int(seq_len or dims["seq_len"])
    h = dims["hidden_size"]
    cuda = device == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    mem0 = _mem(device)
    torch.manual_seed(0)
    model = Block(dims, device=device, dtype=dtype)
    mem_model = _mem(device)
    opt = (MixedAdam if optimizer == "mixed" else PlainAdam)(model.parameters())
    x = torch.randn(mbs, seq, h, device=device, dtype=torch.float32).to(dtype).requires_grad_()
    go = torch.randn(mbs, seq, h, device=device, dtype=torch.float32).to(dtype)

    def step():
        x.grad = None
        t0 = _now(device)
        out = model(x)
        t1 = _now(device)
        out.backward(go)
        t2 = _now(device)
        opt.step()
        t3 = _now(device)
        return t0, t1, t2, t3

    for _ in range(warmup_steps):
        step()
    _sync(device)
    x.grad = None
    mem_static = _mem(device)  # weights + optimizer state, between steps

    # activation memory: peak during forward and what forward leaves saved for backward
    act = {}
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = model(x)
        _sync(device)
        act = {
            "activation_peak_fwd_bytes": torch.cuda.max_memory_allocated() - before,
            "activation_saved_bytes": torch.cuda.memory_allocated() - before,
        }
        out.backward(go)
        opt.step()
        _sync(device)
        del out
        x.grad = None
        torch.cuda.reset_peak_memory_stats()

    marks = [step() for _ in range(num_steps)]
    _sync(device)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    t_f = [_elapsed(m[0], m[1], device) for m in marks]
    t_b = [_elapsed(m[1], m[2], device) for m in marks]
    t_o = [_elapsed(m[2], m[3], device) for m in marks]
    t_s = [_elapsed(m[0], m[3], device) for m in marks]
    fwd_flops = block_fwd_flops(dims, mbs, seq)
    med = statistics.median
    res = {
        "model": dims["name"],
        "dims": {
            k: dims[k]
            for k in (
                "hidden_size",
                "num_heads",
                "num_kv_heads",
                "ffn_hidden_size",
                "ffn_type",
                "num_experts",
                "top_k",
                "norm",
                "bias",
                "causal",
            )
            if k in dims
        },
        "mbs": mbs,
        "seq_len": seq,
        "model_seq_len": dims["seq_len"],
        "dtype": str(dtype).replace("torch.", ""),
        "optimizer": optimizer,
        "adam_fused": bool(opt.fused),
        "attention_gqa_native": model.attn.gqa_native,
        "num_params": sum(p.numel() for p in model.parameters()),
        "num_params_closed_form": block_num_params(dims),
        "warmup_steps": warmup_steps,
        "num_steps": num_steps,
        "time_fwd_s": med(t_f),
        "time_bwd_s": med(t_b),
        "time_optimizer_s": med(t_o),
        "time_step_s": med(t_s),
        "time_step_min_s": min(t_s),
        "time_step_max_s": max(t_s),
        "fwd_flops": fwd_flops,
        "bwd_flops": 2 * fwd_flops,
        "fwd_bwd_flops_per_s": 3 * fwd_flops / (med(t_f) + med(t_b)),
        "memory_before_bytes": mem0,
        "memory_model_bytes": None if mem0 is None else mem_model - mem0,
        "memory_static_bytes": None if mem0 is None else mem_static - mem0,
        "peak_memory_bytes": peak,
        "peak_memory_above_start_bytes": None if peak is None else peak - mem0,
        **act,
    }
    return res  # the block is freed on return; the next run_block collects and empties the cache


def validate_blocks(
    out_path=None,
    *,
    models=None,
    tiny=False,
    device=None,
    mbs=1,
    seq_overrides=None,
    warmup_steps=3,
    num_steps=10,
    optimizer="mixed",
    progress=print,
) -> dict:
    """Run ``run_block`` for each model (``tiny``: CPU-sized flavors); write JSON if asked."""
    device = device or pick_device()
    catalog = {d["name"]: d for d in (TINY_MODELS if tiny else PAPER_MODELS)}
    names = models or (TINY_BLOCK_MODELS if tiny else BLOCK_MODELS)
    seq_overrides = seq_overrides or {}
    blocks = []
    for name in names:
        dims = catalog[name]
        try:
            r = run_block(
                dims,
                device=device,
                mbs=mbs,
                seq_len=seq_overrides.get(name),
                warmup_steps=warmup_steps,
                num_steps=num_steps,
                optimizer=optimizer,
            )
        except RuntimeError as exc:  # OOM on a smaller card: record and go on
            r = {"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
            if device == "cuda":
                torch.cuda.empty_cache()
        blocks.append(r)
        if "error" in r:
            progress(f"[blocks] {name}: {r['error']}")
        else:
            pk = r["peak_memory_bytes"]
            progress(
                f"[blocks] {name}: seq {r['seq_len']} step {r['time_step_s'] * 1e3:.2f} ms "
                f"(fwd {r['time_fwd_s'] * 1e3:.2f}, bwd {r['time_bwd_s'] * 1e3:.2f}, "
                f"opt {r['time_optimizer_s'] * 1e3:.2f}) "
                f"{r['fwd_bwd_flops_per_s'] / 1e12:.1f} TFLOP/s"
                + (f", peak {pk / 2**30:.2f} GiB" if pk is not None else "")
            )
    result = {
        "schema": "nest.block_validation/v1",
        "device": device,
        "tiny": tiny,
        "blocks": blocks,
    }
    if out_path:
        with open(out_path, "w") as fh:
            json.dump(result, fh, indent=2)
    return result
