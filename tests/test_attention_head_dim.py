"""Attention of a head dimension the H100 profile did not measure (gpt-oss: 64 heads of 64,
causal, s 4096): priced from the measured row of the same width (Llama-2-7B's 32 heads of 128)
times the FlashAttention-3 paper's per-head-dim throughput ratio (nest.costs.profiled.
HEAD_DIM_TFLOPS), checked against the CSV row read here directly."""

import csv

import pytest

from nest.costs.profiled import HEAD_DIM_TFLOPS, for_attention_kernel, load_profile
from nest.graph.layer_graph import Op
from nest.spec.catalog import load_hardware


def _op(heads, kv, hd, s=4096, b=1):
    full = 4.0 * b * heads * s * s * hd
    nbytes = 2.0 * (2 * b * s * heads * hd + 2 * b * s * kv * hd)
    return Op("attention", "attention", full / 2, full, nbytes, 2 * nbytes,
              (b, heads, s, s, hd), 1)


def _row(table, heads, kv, hd, s=4096):
    with open(f"profiles/h100_sxm/{table}.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if (int(r["heads"]), int(r["kv_heads"]), int(r["head_dim"]), int(r["s_q"]),
                    r["causal"]) == (heads, kv, hd, s, "1") and not r.get("error"):
                return float(r["fwd_time_s"]), float(r["bwd_time_s"])
    raise AssertionError(f"{table}: no row for {heads} heads of {hd}")


def test_head_dim_64_from_the_measured_head_dim_128_row():
    """cuDNN (the default table): forward x 609 / 408, backward x 499 / 417 of the 32 x 128
    row of the same K / V width (8 x 64 = 4 x 128: Qwen3's row) and FLOPs (64 x 64 = 32 x
    128)."""
    ps = load_profile("profiles/h100_sxm")
    f, b = ps.attention(_op(64, 8, 64))
    f128, b128 = _row("attention_default", 32, 4, 128)
    assert f == pytest.approx(f128 * 609 / 408, rel=1e-12)
    assert b == pytest.approx(b128 * 499 / 417, rel=1e-12)
    assert HEAD_DIM_TFLOPS["default"][64][0] < HEAD_DIM_TFLOPS["default"][128][0]


def test_flash2_kernel_uses_the_flash2_ratio():
    """The flash2 table (attention.csv) with FlashAttention-2's ratio: 368 / 321 and
    310 / 279."""
    ps = for_attention_kernel(load_hardware("h100_sxm"), "flash2")
    f, b = ps.attention(_op(64, 8, 64))
    f128, b128 = _row("attention", 32, 4, 128)
    assert f == pytest.approx(f128 * 368 / 321, rel=1e-12)
    assert b == pytest.approx(b128 * 310 / 279, rel=1e-12)


def test_measured_head_dims_and_other_widths_are_unchanged():
    """A measured head dim prices from its own row; a width no row has stays uncovered
    (roofline); a head dim outside the table too."""
    ps = load_profile("profiles/h100_sxm")
    f, b = ps.attention(_op(32, 32, 128))
    assert (f, b) == _row("attention_default", 32, 32, 128)
    assert ps.attention(_op(48, 8, 64)) == (None, None)  # 3,072 wide: no measured row
    assert ps.attention(_op(16, 8, 256)) == (None, None)  # head dim 256: not in the table
