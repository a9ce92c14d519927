"""Per-layer components before end-to-end rows: one transformer layer's forward and backward time
as the stage kernel prices it (nest.costs.table.layer_times: operators and the recomputed
forward; nest.costs.groups: the tensor-parallel collectives) against a published per-layer
measurement, term by term (nest.profiling.layer_fit).

A100 source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Table 4 ("Time to complete the forward and backward pass of a single transformer layer
of the 22B model"): 22B GPT (h 6144, 64 heads, s 2048), t = 8 on one DGX A100, batch 4, FP16,
Megatron-LM's unfused attention core; profiles/a100_sxm/published_layer_times.csv.

The A100 hardware file's `elementwise_efficiency` is a disclosed calibration to this table (the
only constant fitted to it; the end-to-end rows stay out of sample). Before it, with the
streaming memory_efficiency 0.85 for every memory-bound operator, every term was fast: forward
13-15%, backward 8-10%.

H100: no published per-layer breakdown was found; the check uses our own measured blocks
(profiles/h100_sxm/blocks.json), see the second part of this file.
"""

from dataclasses import replace

import pytest

from nest.profiling.layer_fit import fit_elementwise, layer_problem, layer_time_s
from nest.profiling.layer_fit import published_layer_times as rows_of

ROWS = rows_of("a100_sxm")


@pytest.fixture(scope="module")
def problem():
    return layer_problem(ROWS[0], "dgx_a100")


def test_table_is_the_papers():
    """Korthikanti et al. 2022, Table 4, as printed (ms)."""
    got = {r.experiment: (round(r.fwd_s * 1e3, 1), round(r.bwd_s * 1e3, 1)) for r in ROWS}
    assert got == {"baseline no recompute": (7.7, 11.9), "sequence parallelism": (7.2, 11.8),
                   "baseline with recompute": (7.7, 19.5), "selective recompute": (7.7, 13.2),
                   "selective + sequence": (7.2, 13.1)}


@pytest.mark.parametrize("row", ROWS, ids=[r.experiment for r in ROWS])
def test_22b_layer_against_korthikanti_table4(problem, row):
    fwd, bwd = layer_time_s(problem, row)
    ef, eb = fwd / row.fwd_s - 1, bwd / row.bwd_s - 1
    assert abs(ef) <= 0.07, f"{row.experiment}: forward {fwd * 1e3:.2f} ms ({100 * ef:+.1f}%)"
    assert abs(eb) <= 0.06, f"{row.experiment}: backward {bwd * 1e3:.2f} ms ({100 * eb:+.1f}%)"


def test_uncalibrated_pricing_was_uniformly_fast(problem):
    """The miss the calibration closes: with memory_efficiency for the memory-bound operators,
    every forward is 12-16% and every backward 6-9% below the table (7-11% before the
    main-gradient accumulation term, nest.costs.table.main_grad_accumulation_s, was priced)."""
    hw = replace(problem.cluster.hardware, elementwise_efficiency=None)
    for row in ROWS:
        fwd, bwd = layer_time_s(problem, row, hw)
        assert -0.16 <= fwd / row.fwd_s - 1 <= -0.12
        assert -0.09 <= bwd / row.bwd_s - 1 <= -0.06


def test_22b_layer_differences_follow_table4(problem):
    """Row differences isolate single terms: sequence parallelism saves forward time (layer norm
    and dropout on 1/t of the tokens), full recomputation adds about one forward to the
    backward, selective recomputation the attention core only. The sequence-parallel saving is
    priced about twice the measured 0.5 ms (0.97 ms): the calibrated elementwise_efficiency
    also stands for kernels on tensor-parallel-sharded tensors that sequence parallelism does
    not shrink (bias adds, permute copies), which the layer graph does not list; pricing those
    kernels by name would bring this difference down (issue 26, not done)."""
    t = {r.experiment: layer_time_s(problem, r) for r in ROWS}
    base, sp = t["baseline no recompute"], t["sequence parallelism"]
    assert 0.5 <= (base[0] - sp[0]) * 1e3 <= 1.1
    assert (t["baseline with recompute"][1] - base[1]) * 1e3 == pytest.approx(19.5 - 11.9,
                                                                              rel=0.1)
    assert (t["selective recompute"][1] - base[1]) * 1e3 == pytest.approx(13.2 - 11.9, abs=0.3)


def test_hardware_file_holds_the_fit(problem):
    """The A100 file's elementwise_efficiency is the least-squares fit to Table 4."""
    e, rms = fit_elementwise(ROWS)
    assert problem.cluster.hardware.elementwise_efficiency == e
    assert rms < 0.05


# --------------------------------------------------------------------------------------------
# H100: no published per-layer forward / backward breakdown of an H100 transformer layer was
# found (searched: vendor performance summaries, Megatron-LM / NeMo / Megatron-Bridge docs, the
# Llama 3 paper; they report end-to-end throughput only). The best citable component measurement
# is our own: one transformer block of each model timed on an H100 80GB HBM3 (torch 2.11,
# 2026-11-26; profiles/h100_sxm/blocks.json, meta.json; `nest validate`, nest.fidelity.block_validation), forward
# and backward separately, with the operators priced from the separately measured operator sweep
# (profiles/h100_sxm/*.csv). No constant is fitted to these blocks.
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h100_blocks():
    from nest.fidelity.block_validation import validate

    return [r for r in validate("h100_sxm")["rows"] if r["gpu_bound"]]


def test_h100_blocks_are_the_measured_dense_ones(h100_blocks):
    """The GPU-bound dense blocks (enough GPU work per operator to hide eager PyTorch's host
    time; the MoE block's expert loop synchronises with the host)."""
    assert [r["model"] for r in h100_blocks] == ["llama2_7b", "llama3_70b", "gpt3_175b"]


@pytest.mark.parametrize("phase", ["fwd_s", "bwd_s"])
def test_h100_layer_against_measured_blocks(h100_blocks, phase):
    """Forward and backward of each dense block within 13% of the measurement (a GEMM in a
    short block step runs at ~800 TFLOP/s, in the long operator sweep at ~680: profiles/
    h100_sxm/validation.md, 'Why it misses'), and never too fast: the H100 end-to-end rows'
    optimism (results/validation_published.md) is not per-layer compute priced fast."""
    for r in h100_blocks:
        pred, meas = r["pred"][phase], r["meas"][phase]
        assert 0.0 <= pred / meas - 1 <= 0.13, (r["model"], phase, pred, meas)


def test_h100_optimizer_step_with_the_fp32_copy(h100_blocks):
    """Component check of the main-gradient term outside the layer: the measured block copies
    its BF16 gradients into the FP32 main_grad in its optimizer step (nest.profiling.blocks,
    MixedAdam), which nest.fidelity.block_validation prices with nest.costs.table.main_grad_traffic_s (6
    bytes per weight element, not fitted). Without that term the step is priced 19-22% fast in
    every block, with it 6-9%."""
    import json
    from pathlib import Path

    from nest.costs.table import main_grad_traffic_s
    from nest.graph.closed_form import block_cost
    from nest.graph.layer_graph import Variant
    from nest.spec.catalog import load_hardware
    from nest.fidelity.block_validation import block_model

    hw = load_hardware("h100_sxm")
    blocks = {b["model"]: b for b in json.loads(
        Path("profiles/h100_sxm/blocks.json").read_text())["blocks"]}
    for r in h100_blocks:
        blk = blocks[r["model"]]
        acc = main_grad_traffic_s(hw, block_cost(block_model(blk), int(blk["mbs"]),
                                                      Variant()))
        pred, meas = r["pred"]["opt_s"], r["meas"]["opt_s"]
        assert -0.09 <= pred / meas - 1 <= -0.06, (r["model"], pred, meas)
        assert -0.22 <= (pred - acc) / meas - 1 <= -0.19, (r["model"], pred - acc, meas)


def test_main_grad_accumulation_closed_form():
    """6 bytes per weight element of a GPT block (12 h^2 weights, t = 1) at the A100's
    streaming bandwidth; 0 on the H100 (overlapped epilogue); the layer's backward carries it."""
    from nest.costs.table import layer_times, main_grad_accumulation_s, main_grad_traffic_s
    from nest.graph.closed_form import block_cost
    from nest.graph.layer_graph import Variant
    from nest.spec.catalog import load_hardware, load_model

    a100, h100 = load_hardware("a100_sxm"), load_hardware("h100_sxm")
    m = load_model("gpt3_175b", seq_len=2048)
    cost = block_cost(m, 1, Variant())
    h = m.hidden_size
    want = 6 * 12 * h * h / (a100.hbm_bytes_per_s * a100.memory_efficiency)
    assert main_grad_accumulation_s(a100, cost) == pytest.approx(want, rel=1e-3)
    assert main_grad_accumulation_s(h100, cost) == 0.0
    assert main_grad_traffic_s(h100, cost) > 0.0
    off = replace(a100, gemm_epilogue="overlapped")
    assert (layer_times(a100, cost).bwd_s - layer_times(off, cost).bwd_s
            == pytest.approx(want, rel=1e-3))
