"""Model dims -> deduplicated operator shapes to profile (GEMMs, attention, norms, ...).

Every shape is a plain dict: ``{"family": ..., "op": ..., <shape fields>, "tags": [...]}``.
``family`` names the CSV the measurement lands in (one CSV per family, see ``FAMILY_FIELDS``);
``tags`` say where the shape comes from (``"llama2_7b:qkv:t8:mbs1"``) and are merged when two
models need the same shape.

Conventions (shared with the cost model that reads the CSVs):
- matmul ``(m, n, k)``: forward ``Y[m, n] = X[m, k] @ W[n, k]^T`` (``torch.nn.functional.linear``),
  ``m`` = tokens (micro-batch size x sequence), tensor parallelism divides ``n`` (column-parallel:
  QKV, MLP up/gate, LM head) or ``k`` (row-parallel: attention out-projection, MLP down) by ``t``.
- attention: ``b`` sequences, ``s_q``/``s_kv`` tokens, ``heads``/``kv_heads`` per device (divided by
  ``t``), ``head_dim``; context parallelism ``c`` shortens the local sequence to ``s / c``.
- norms: ``rows`` tokens x ``cols`` hidden; with sequence parallelism the rows are ``m / t``.
- moe: ``experts`` local experts (``num_experts / ep``), each with ``m`` tokens
  (``ep * tokens * top_k / num_experts``, balanced routing), GEMM ``(m, n, k)`` per expert.
"""

from __future__ import annotations

import math

# One CSV per family; these are the shape columns of each (measurement columns come after).
FAMILY_FIELDS: dict[str, tuple[str, ...]] = {
    "matmul": ("m", "n", "k"),
    "attention": ("b", "s_q", "s_kv", "heads", "kv_heads", "head_dim", "causal"),
    "norm": ("rows", "cols"),
    "elementwise": ("rows", "cols"),
    "embedding": ("tokens", "vocab", "hidden"),
    "cross_entropy": ("tokens", "vocab"),
    "moe": ("experts", "m", "n", "k"),
}

# Paper Table 2 / Appendix C (docs/paper.md, Models). BERT is an encoder (bidirectional attention).
PAPER_MODELS: list[dict] = [
    {
        "name": "bert_large",
        "hidden_size": 1024,
        "num_heads": 16,
        "num_kv_heads": 16,
        "ffn_hidden_size": 4096,
        "ffn_type": "gelu",
        "vocab_size": 30522,
        "seq_len": 512,
        "num_experts": 0,
        "top_k": 0,
        "num_layers": 24,
        "norm": "layernorm",
        "bias": True,
        "causal": False,
    },
    {
        "name": "llama2_7b",
        "hidden_size": 4096,
        "num_heads": 32,
        "num_kv_heads": 32,
        "ffn_hidden_size": 11008,
        "ffn_type": "swiglu",
        "vocab_size": 32000,
        "seq_len": 4096,
        "num_experts": 0,
        "top_k": 0,
        "num_layers": 32,
        "norm": "rmsnorm",
        "bias": False,
        "causal": True,
    },
    {
        "name": "llama3_70b",
        "hidden_size": 8192,
        "num_heads": 64,
        "num_kv_heads": 8,
        "ffn_hidden_size": 28672,
        "ffn_type": "swiglu",
        "vocab_size": 128256,
        "seq_len": 4096,
        "num_experts": 0,
        "top_k": 0,
        "num_layers": 80,
        "norm": "rmsnorm",
        "bias": False,
        "causal": True,
    },
    {
        "name": "gpt3_175b",
        "hidden_size": 12288,
        "num_heads": 96,
        "num_kv_heads": 96,
        "ffn_hidden_size": 49152,
        "ffn_type": "gelu",
        "vocab_size": 50257,
        "seq_len": 2048,
        "num_experts": 0,
        "top_k": 0,
        "num_layers": 96,
        "norm": "layernorm",
        "bias": True,
        "causal": True,
    },
    {
        "name": "mixtral_8x7b",
        "hidden_size": 4096,
        "num_heads": 32,
        "num_kv_heads": 8,
        "ffn_hidden_size": 14336,
        "ffn_type": "swiglu",
        "vocab_size": 32000,
        "seq_len": 4096,
        "num_experts": 8,
        "top_k": 2,
        "num_layers": 32,
        "norm": "rmsnorm",
        "bias": False,
        "causal": True,
    },
]

# Tiny flavors (same structure, CPU-sized) for tests and for the CPU path of the profiler.
TINY_MODELS: list[dict] = [
    {
        "name": "tiny_gelu",
        "hidden_size": 64,
        "num_heads": 4,
        "num_kv_heads": 4,
        "ffn_hidden_size": 256,
        "ffn_type": "gelu",
        "vocab_size": 512,
        "seq_len": 32,
        "num_experts": 0,
        "top_k": 0,
        "num_layers": 2,
        "norm": "layernorm",
        "bias": True,
        "causal": False,
    },
    {
        "name": "tiny_swiglu",
        "hidden_size": 64,
        "num_heads": 4,
        "num_kv_heads": 2,
        "ffn_hidden_size": 160,
        "ffn_type": "swiglu",
        "vocab_size": 256,
        "seq_len": 32,
        "num_experts": 0,
        "top_k": 0,
        "num_layers": 2,
        "norm": "rmsnorm",
        "bias": False,
        "causal": True,
    },
    {
        "name": "tiny_moe",
        "hidden_size": 64,
        "num_heads": 4,
        "num_kv_heads": 2,
        "ffn_hidden_size": 96,
        "ffn_type": "swiglu",
        "vocab_size": 500,
        "seq_len": 32,
        "num_experts": 4,
        "top_k": 2,
        "num_layers": 2,
        "norm": "rmsnorm",
        "bias": False,
        "causal": True,
    },
]

DEFAULT_M_GRID = (512, 1024, 2048, 4096, 8192)


def model_by_name(name: str) -> dict:
    for d in PAPER_MODELS + TINY_MODELS:
        if d["name"] == name:
            return dict(d)
    raise ValueError(f"unknown model {name!r}")


def _div(x: int, t: int) -> int:
    return max(1, math.ceil(x / t))


def shapes_for_model(
    dims: dict,
    tp_degrees=(1, 2, 4, 8),
    mbs_list=(1,),
    *,
    m_grid=DEFAULT_M_GRID,
    cp_degrees=(1,),
    ep_degrees=(1, 2, 4, 8),
) -> list[dict]:
    """Operator shapes one model needs, deduplicated.

    dims: name, hidden_size, num_heads, num_kv_heads, ffn_hidden_size, ffn_type ("gelu"|"swiglu"),
    vocab_size, seq_len, num_experts, top_k (optional: norm, causal).
    m_grid: extra token counts for the main GEMMs (QKV, out-proj, MLP), for interpolation along m.
    """
    name = dims["name"]
    h = int(dims["hidden_size"])
    a = int(dims["num_heads"])
    kv = int(dims.get("num_kv_heads") or a)
    f = int(dims["ffn_hidden_size"])
    ffn_type = dims["ffn_type"]
    if ffn_type not in ("gelu", "swiglu"):
        raise ValueError(f"{name}: ffn_type must be 'gelu' or 'swiglu', got {ffn_type!r}")
    vocab = int(dims["vocab_size"])
    seq = int(dims["seq_len"])
    num_experts = int(dims.get("num_experts") or 0)
    top_k = int(dims.get("top_k") or 0)
    norm = dims.get("norm") or ("layernorm" if ffn_type == "gelu" else "rmsnorm")
    causal = bool(dims.get("causal", True))
    hd = h // a
    moe = num_experts > 0

    out: dict[tuple, dict] = {}

    def add(family: str, op: str, tag: str, **fields):
        key = (family, op) + tuple(fields[c] for c in FAMILY_FIELDS[family])
        rec = out.setdefault(key, {"family": family, "op": op, **fields, "tags": []})
        if tag not in rec["tags"]:
            rec["tags"].append(tag)

    for t in tp_degrees:
        if a % t:
            continue  # heads must split evenly over t
        # kv heads replicate when kv < t (Megatron GQA)
        kv_t = max(1, kv // t)
        a_t = a // t
        for mbs in mbs_list:
            m = mbs * seq
            base = f"{name}:t{t}:mbs{mbs}"
            # --- GEMMs (column-parallel divide n, row-parallel divide k)
            gemms = {
                "qkv": ((a_t + 2 * kv_t) * hd, h),
                "attn_out": (h, a_t * hd),
            }
            if not moe:
                gemms["mlp_up"] = (_div(f, t), h)
                if ffn_type == "swiglu":
                    gemms["mlp_gate"] = (_div(f, t), h)
                gemms["mlp_down"] = (h, _div(f, t))
            ms = sorted(set([m] + [g for g in m_grid if g != m]))
            for role, (n, k) in gemms.items():
                for mm in ms:
                    tag = f"{name}:{role}:t{t}:mbs{mbs}" if mm == m else f"{name}:{role}:t{t}:grid"
                    add("matmul", "matmul", tag, m=mm, n=n, k=k)
            add("matmul", "matmul", f"{name}:lm_head:t{t}:mbs{mbs}", m=m, n=_div(vocab, t), k=h)
            if moe:
                add("matmul", "matmul", f"{name}:router:t{t}:mbs{mbs}", m=m, n=num_experts, k=h)
            # --- attention (heads split by t; context parallelism shortens the local sequence)
            for c in cp_degrees:
                if seq % c:
                    continue
                s_loc = seq // c
                add(
                    "attention",
                    "sdpa",
                    f"{name}:attn:t{t}:c{c}:mbs{mbs}",
                    b=mbs,
                    s_q=s_loc,
                    s_kv=s_loc,
                    heads=a_t,
                    kv_heads=kv_t,
                    head_dim=hd,
                    causal=int(causal),
                )
            # attention-score softmax (only when attention is not fused)
            add("elementwise", "softmax", f"{base}:attn_softmax", rows=mbs * a_t * seq, cols=seq)
            # --- norms: full rows without SP, m / t rows with sequence parallelism
            for rows, sp in ((m, ""), (_div(m, t), ":sp")):
                add("norm", norm, f"{base}:{norm}{sp}", rows=rows, cols=h)
            # --- activations on the MLP hidden (per expert token count for MoE)
            act_rows = m * top_k if moe else m
            if ffn_type == "gelu":
                add("elementwise", "gelu", f"{base}:gelu", rows=act_rows, cols=_div(f, t))
            else:
                add("elementwise", "silu", f"{base}:silu", rows=act_rows, cols=_div(f, t))
                add("elementwise", "swiglu", f"{base}:swiglu", rows=act_rows, cols=_div(f, t))
            # --- vocabulary ops (vocab-parallel embedding and loss)
            add(
                "embedding",
                "embedding",
                f"{base}:embedding",
                tokens=m,
                vocab=_div(vocab, t),
                hidden=h,
            )
            add("cross_entropy", "cross_entropy", f"{base}:loss", tokens=m, vocab=_div(vocab, t))
            # --- MoE: router softmax and expert GEMMs grouped by expert
            if moe:
                add("elementwise", "softmax", f"{base}:router_softmax", rows=m, cols=num_experts)
                for ep in ep_degrees:
                    if num_experts % ep:
                        continue
                    local = num_experts // ep
                    tpe = _div(ep * m * top_k, num_experts)
                    tag = f"{name}:t{t}:ep{ep}:mbs{mbs}"
                    add(
                        "moe",
                        "expert_up",
                        f"{tag}:expert_up",
                        experts=local,
                        m=tpe,
                        n=_div(f, t),
                        k=h,
                    )
                    if ffn_type == "swiglu":
                        add(
                            "moe",
                            "expert_gate",
                            f"{tag}:expert_gate",
                            experts=local,
                            m=tpe,
                            n=_div(f, t),
                            k=h,
                        )
                    add(
                        "moe",
                        "expert_down",
                        f"{tag}:expert_down",
                        experts=local,
                        m=tpe,
                        n=h,
                        k=_div(f, t),
                    )
                # per-expert GEMMs as dense matmuls along the m grid, for interpolation
                for mm in sorted(set([_div(m * top_k, num_experts)] + list(m_grid))):
                    add("matmul", "matmul", f"{name}:expert_up:t{t}:grid", m=mm, n=_div(f, t), k=h)
                    add(
                        "matmul", "matmul", f"{name}:expert_down:t{t}:grid", m=mm, n=h, k=_div(f, t)
                    )
    return list(out.values())


def merge_shapes(shape_lists) -> list[dict]:
    """Union of several shapes_for_model results, deduplicated, tags merged, order kept."""
    out: dict[tuple, dict] = {}
    for shapes in shape_lists:
        for s in shapes:
            key = (s["family"], s["op"]) + tuple(s[c] for c in FAMILY_FIELDS[s["family"]])
            if key in out:
                for tag in s["tags"]:
                    if tag not in out[key]["tags"]:
                        out[key]["tags"].append(tag)
            else:
                out[key] = {**s, "tags": list(s["tags"])}
    return list(out.values())
