"""What the H100 published rows' software ran: the attention kernel (nest.costs.profiled
.for_attention_kernel, priced from the H100 profile's tables and checked against the CSV rows
read here directly) and NeMo 24.07's optimizer state (Apex DistributedFusedAdam)."""

import csv
from pathlib import Path

import pytest

from nest.common.errors import SpecError
from nest.costs import profiled
from nest.fidelity import published_runs as published
from nest.graph.layer_graph import Op
from nest.spec.catalog import load_cluster

HW = load_cluster("dgx_h100_superpod", 8).hardware
DIR = Path(HW.profile_dir)


def _rows(name):
    with (DIR / name).open(newline="") as fh:
        return [r for r in csv.DictReader(fh) if not r.get("error") and r.get("fwd_time_s")]


def _op(r, b=1):
    """The layer graph's attention op of a measured row (bytes: Q, O and K, V in bf16)."""
    b_, h, s, hd, kv = b, int(r["heads"]), int(r["s_q"]), int(r["head_dim"]), int(r["kv_heads"])
    flops = float(r["fwd_flops"]) * b / int(r["b"])
    nbytes = 2.0 * (2 * b_ * s * h * hd + 2 * b_ * s * kv * hd)
    return Op("attention", "attention", flops, 2.5 * flops, nbytes, 2 * nbytes, (b_, h, s, s, hd), 1)


def _causal_full(name):
    return [r for r in _rows(name) if r["causal"] == "1" and int(r["s_q"]) >= 2048
            and int(r["s_q"]) == int(r["s_kv"])]


@pytest.mark.parametrize("kernel, factor", [("flash2", 1.0), ("flash1", profiled.FA2_OVER_FA1)])
def test_kernel_prices_the_flash_table(kernel, factor):
    """flash2: attention.csv's own times (b scaled by FLOPs); flash1: the same x 2 (Dao 2023)."""
    ps = profiled.for_attention_kernel(HW, kernel)
    rows = _causal_full("attention.csv")
    assert rows
    for r in rows:
        t = ps.price(HW, _op(r, b=3), "bf16")
        assert t.fwd_source == t.bwd_source == "profile"
        assert t.fwd_s == pytest.approx(3 * factor * float(r["fwd_time_s"]), rel=1e-9)
        assert t.bwd_s == pytest.approx(3 * factor * float(r["bwd_time_s"]), rel=1e-9)


def test_default_kernel_is_the_hardware_profile():
    assert profiled.for_attention_kernel(HW, "default") is profiled.profile_for(HW)
    r = _causal_full("attention_default.csv")[0]
    t = profiled.profile_for(HW).price(HW, _op(r), "bf16")
    assert t.fwd_s == pytest.approx(float(r["fwd_time_s"]), rel=1e-9)


def test_slowdown_and_roofline_fallback():
    """kernel_slowdown = summed fwd+bwd time of the flash table over the default table on the
    shared shapes (computed here by hand); an uncovered shape (heads the profile never measured)
    is priced by the roofline at attention_efficiency / (slowdown x FA2_OVER_FA1 for flash1)."""
    d = {r["tags"]: float(r["fwd_time_s"]) + float(r["bwd_time_s"])
         for r in _rows("attention_default.csv")}
    f = [(r["tags"], float(r["fwd_time_s"]) + float(r["bwd_time_s"]))
         for r in _rows("attention.csv") if r["tags"] in d]
    slow = sum(t for _, t in f) / sum(d[k] for k, _ in f)
    assert profiled.kernel_slowdown(_rows("attention_default.csv"),
                                    _rows("attention.csv")) == pytest.approx(slow)
    assert 1.5 < slow < 2.5  # FA2 about half cuDNN's speed on this H100 (hardware file)
    r = _causal_full("attention.csv")[0]
    odd = dict(r, heads="23", kv_heads="23")  # 23 heads: measured nowhere
    times = {k: profiled.for_attention_kernel(HW, k).price(HW, _op(odd), "bf16")
             for k in profiled.ATTENTION_KERNELS}
    assert {t.fwd_source for t in times.values()} == {"roofline"}
    compute = times["default"].fwd_s - HW.kernel_overhead_s  # compute-bound at these sizes
    assert times["flash2"].fwd_s - HW.kernel_overhead_s == pytest.approx(compute * slow)
    assert times["flash1"].fwd_s - HW.kernel_overhead_s == pytest.approx(
        compute * slow * profiled.FA2_OVER_FA1)


def test_bad_kernel_names_the_row():
    with pytest.raises(SpecError, match="attention kernel 'fa9'"):
        profiled.for_attention_kernel(HW, "fa9")
    row = next(r for r in published.load_runs() if r["id"] == "mosaic_mpt_1b_8gpu_bf16")
    with pytest.raises(SpecError, match="run 'mosaic_mpt_1b_8gpu_bf16': key 'attention_kernel'"):
        published.problem_for({**row, "attention_kernel": "fa9"})
    assert [m["attention_kernel"] for m in published.band_members(row)] == ["flash2", "flash1"]


def test_nemo2407_rows_hold_apex_distributed_fused_adam_state():
    """NeMo 24.07's distributed_fused_adam (Apex, store_param_remainders): per parameter at the
    activation peak 2 (BF16 weights) + 2 (BF16 gradient buffer) + (2 remainders + 4 + 4 moments)
    / d, where Megatron-Core's distributed optimizer with a BF16 buffer holds 2 + 2 + 12 / d
    and, during its step only, a 4 / d FP32 gradient-shard copy. Computed here from the bytes, checked against the memory
    model's state_bytes on the Llama-3-8B row (dp 4 x cp 2 = 8 shards)."""
    from nest.costs.memory import state_bytes

    rows = [r for r in published.load_runs() if r["id"].startswith("nemo2407_")]
    assert len(rows) == 5
    for row in rows:
        p = published.training_for(row).precision
        assert (p.grad_reduce, p.main_grads, p.main_params) == ("bf16", "bf16", "fp32")
    row = next(r for r in rows if r["id"] == "nemo2407_llama3_8b_8gpu_fp8")
    tr = published.training_for(row)
    n, d = 1e9, row["dp"] * row["cp"]
    got = state_bytes(n, 0.0, row["dp"], row["ep"], row["cp"], row["zero_stage"], tr)
    assert got["weights"] + got["gradients"] + got["optimizer_states"] == pytest.approx(
        n * (2 + 2 + (2 + 4 + 4) / d))
    megatron = tr.with_precision({"main_grads": "fp32"})
    old = state_bytes(n, 0.0, row["dp"], row["ep"], row["cp"], row["zero_stage"], megatron)
    assert old["weights"] + old["gradients"] + old["optimizer_states"] == pytest.approx(
        n * (2 + 2 + 12 / d))
    assert old["step_transient"] == pytest.approx(n * 4 / d)
