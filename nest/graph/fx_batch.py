"""Every micro-batch size's layer measurement from ONE torch.fx trace, at a tagged batch size.

A layer's measured numbers (nest.graph.fx_extract: FLOPs and HBM bytes per fx node and phase,
saved bytes, collective bytes, operator shapes) are sums of integers, each the size of one
tensor (or a FLOP formula over tensor sizes): a product of tensor dimensions. The micro-batch b
enters a dimension only as a factor (the [s, b, h] layouts, b * s tokens flattened, b * heads
batched matmuls, and the MoE slots per expert cap = b * s_loc * k / E when E divides s_loc * k),
so every such integer is c * b^d, d the number of batch factors in it and c independent of b.

The trace is run once at b = P, a prime above the sum of every integer of the model spec.
Every other dimension is a sum, product or exact quotient of spec integers (or
ceil(vocab / tp) < vocab): a sum is below P and a product of numbers below P has no factor P,
so no dimension has one (a prime above the largest integer alone would not do: a sum of spec
integers, e.g. a LoRA rank plus a rope dimension, could be P itself); the P-adic valuation of
a measured integer is therefore its batch degree d, and c = x / P^d. The value at any
micro-batch is c * mbs^d, summed exactly as integers (the traced path sums the same integers:
fx_extract works on these polynomials either way, with degree 0 only when it traces the batch
it reports). Where the argument does not hold (a spec
integer at or above P, a non-integer measurement) the micro-batch is traced itself.

An MoE layer whose E does not divide s_loc * k rounds its slots per expert up, cap =
ceil(b * s_loc * k / E), not a multiple of b: the slots get their own tag, a second prime Q
above P and above P * s * k / E (slot_prime), and the layer is traced once at b = P with cap =
Q. cap enters a dimension only as a factor too ([E, cap, h] and [E / e, e * cap, h] buffers,
the experts' GEMMs, the padded routing weights), so every measured integer is c * P^d * Q^e and
its value at a micro-batch is c * mbs^d * cap^e. The only dimension that mixes the two is the
permute's padding, E * cap - T * k rows of indices and weights: it is produced and consumed
inside the permute's forward (one fused kernel: never measured, nest.graph.fx_extract's
_node_bytes) and never saved. The tagged trace pads (E Q > P s_loc k), so it stands for the
micro-batches that pad; one whose slots divide exactly (no padding branch) is traced itself.
tests/test_fx_batch.py compares the derived layer graphs with traced ones at micro-batch 1 to 4
for dense, MoE, MLA and sliding-window models, tests/test_fx_slots.py for slot-tagged ones
(DeepSeek-V2, Qwen1.5-MoE, a synthetic 80-expert MoE; with tp / cp 8 and ep 8 / 16 derived).
"""

from __future__ import annotations

import dataclasses

Poly = tuple  # (((batch degree, slot degree), coefficient), ...) sorted, no zero coefficients


class NotTagged(Exception):
    """A measurement the batch tag cannot split (trace the micro-batch instead)."""


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def _spec_ints(m) -> list[int]:
    out = []
    for f in dataclasses.fields(m):
        x = getattr(m, f.name)
        xs = x if isinstance(x, tuple) else (x,)
        out += [y for y in xs if isinstance(y, int) and not isinstance(y, bool)]
    return out


def tag_prime(m) -> int:
    """The smallest prime above the sum of the integers of spec `m` (and above 1,000)."""
    p = max(1000, sum(_spec_ints(m))) + 1
    while not _is_prime(p):
        p += 1
    return p


def taggable(m, v) -> bool:
    """The batch enters every dimension as a factor: MoE slots per expert are linear in b."""
    if not m.is_moe:
        return True
    return (m.seq_len // v.cp) * m.top_k % m.num_experts == 0


def has_experts(m, kind: str) -> bool:
    """Layer `kind` of `m` runs routed experts (an MoE block, or the head's MTP blocks)."""
    if not m.is_moe:
        return False
    if kind.startswith("block"):
        return "dense" not in kind.split(":")[1:]
    return kind == "head" and bool(m.mtp_layers)


def slot_tagged(m, kind: str, v) -> bool:
    """Layer `kind` under `v` is traced with the slots per expert at their own tag (slot_prime):
    it runs experts whose slots are not linear in the batch (not taggable)."""
    return has_experts(m, kind) and not taggable(m, v)


def expert_slots(tokens: int, top_k: int, num_experts: int) -> int:
    """Slots per expert of `tokens` routed top-k to E experts under balanced routing,
    ceil(T k / E) (the one formula: nest.graph.torch_models.MoE sizes its buffers with it)."""
    return -(-tokens * top_k // num_experts)


def slots(m, v, mbs: int) -> int:
    """Slots per expert at micro-batch `mbs` (nest.graph.torch_models.MoE)."""
    return expert_slots(mbs * (m.seq_len // v.cp), m.top_k, m.num_experts)


def padded(m, v, mbs: int) -> bool:
    """The slots are rounded up at `mbs` (the permute pads): the slot-tagged trace's layout."""
    return slots(m, v, mbs) * m.num_experts > mbs * (m.seq_len // v.cp) * m.top_k


def slot_prime(m, tag: int) -> int:
    """The slot tag: the smallest prime above the batch tag `tag` and above tag * s * k / E, so
    that the tagged trace pads (E q > T k at every cp) like every padded micro-batch."""
    q = max(tag, tag * m.seq_len * m.top_k // m.num_experts) + 1
    while not _is_prime(q):
        q += 1
    return q


def poly(xs, tag: int | None, slot_tag: int | None = None) -> Poly:
    """The sum of integers `xs` (measured at batch `tag` and slots `slot_tag`, or untagged:
    degree 0) as coefficients keyed by (batch degree, slot degree)."""
    acc: dict[tuple[int, int], int] = {}
    for x in xs:
        if not x:
            continue
        if isinstance(x, float):
            if not x.is_integer():
                raise NotTagged(x)
            x = int(x)
        elif not isinstance(x, int):
            raise NotTagged(x)
        d = e = 0
        if tag:
            while x % tag == 0:
                x //= tag
                d += 1
        if slot_tag:
            while x % slot_tag == 0:
                x //= slot_tag
                e += 1
        acc[d, e] = acc.get((d, e), 0) + x
    return tuple(sorted((k, c) for k, c in acc.items() if c))


def at(p: Poly, mbs: int, num_slots: int = 0) -> int:
    """The exact integer the polynomial takes at micro-batch `mbs` and `num_slots` per expert."""
    return sum(c * mbs ** d * num_slots ** e for (d, e), c in p)
