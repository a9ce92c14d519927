"""GPU path of the cost model (nest.costs.profiled) and the block validation (nest.fidelity.block_validation)."""

import csv
import json

import pytest
import yaml

from nest.fidelity import block_validation as V
from nest.costs.profiled import AUTOGRAD_FLOOR_S, load_profile, price_op, profile_for
from nest.costs.roofline import op_times
from nest.costs.table import CostTable, layer_times
from nest.common.errors import SpecError
from nest.graph.closed_form import block_cost, build_layer_graph
from nest.graph.layer_graph import Op, Variant
from nest.spec.catalog import config_dir, load_hardware, load_model
from nest.fidelity.block_validation import ACHIEVED_TIME_GPU_BOUND

PROF = config_dir().parent / "profiles" / "h100_sxm"
# ACHIEVED_TIME_GPU_BOUND (nest.fidelity.block_validation): what the committed H100 profile achieves on the
# GPU-bound dense blocks, attention priced from attention_default.csv: worst |error| of forward
# and backward (GPT-3 backward +12.4%).


@pytest.fixture(scope="module")
def hw():
    return load_hardware("h100_sxm")


@pytest.fixture(scope="module")
def prof():
    return load_profile(PROF)


def _rows(family):
    with open(PROF / f"{family}.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _mm(m, n, k, count=1, name="gemm"):
    f, io = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
    return Op(name, "matmul", f, 2 * f, io, 2 * io, (m, n, k), count)


def _op(cost, name):
    return next(o for o in cost.ops if o.name == name)


def test_h100_names_its_profile(hw):
    assert hw.profile_dir and profile_for(hw) is load_profile(PROF)
    assert load_hardware("tpuv4_like").profile_dir is None


def test_matmul_exact_at_every_measured_aligned_shape(hw, prof):
    n_checked = 0
    for r in _rows("matmul"):
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        if n % 8 or k % 8:
            continue  # unpadded vocabularies: priced padded (next test)
        t = price_op(hw, _mm(m, n, k), prof)
        assert (t.fwd_source, t.bwd_source) == ("profile", "profile")
        assert t.fwd_s == pytest.approx(float(r["fwd_time_s"]), rel=1e-12)
        assert t.bwd_s == pytest.approx(float(r["bwd_time_s"]), rel=1e-12)
        n_checked += 1
    assert n_checked > 300


def test_matmul_monotone_in_m_between_grid_points(hw, prof):
    n, k = 11008, 4096  # Llama-2 MLP up/gate, measured at m = 512 ... 8192
    grid = sorted(int(r["m"]) for r in _rows("matmul") if (int(r["n"]), int(r["k"])) == (n, k))
    assert len(grid) >= 5
    for lo, hi in zip(grid, grid[1:]):
        t_lo, t_hi = (price_op(hw, _mm(m, n, k), prof).fwd_s for m in (lo, hi))
        sweep = [price_op(hw, _mm(lo + (hi - lo) * i // 8, n, k), prof).fwd_s for i in range(9)]
        steps = [b - a for a, b in zip(sweep, sweep[1:])]
        assert all(s >= 0 for s in steps) or all(s <= 0 for s in steps)
        assert min(t_lo, t_hi) <= min(sweep) and max(sweep) <= max(t_lo, t_hi)
    # above the grid: the throughput of the largest measured m
    top = price_op(hw, _mm(grid[-1], n, k), prof)
    assert price_op(hw, _mm(2 * grid[-1], n, k), prof).fwd_s == pytest.approx(2 * top.fwd_s)


def test_matmul_outside_the_measured_set_is_roofline(hw, prof):
    for op in (_mm(64, 4096, 4096),  # below the smallest measured m
               _mm(4096, 40, 4096),  # no measured (n, k) within a factor 2
               _mm(4096, 4096, 100_000)):
        t = price_op(hw, op, prof)
        assert t.source == "roofline"
        assert (t.fwd_s, t.bwd_s) == op_times(hw, op)


def test_matmul_borrows_the_nearest_aligned_shape(hw, prof):
    one = price_op(hw, _mm(4096, 11008, 4096), prof)
    fused = price_op(hw, _mm(4096, 22016, 4096), prof)  # Llama-2 gate+up as one GEMM
    # (22016, 4096) is not measured: the nearest measured aligned (n, k) lends its throughput
    assert fused.source == "profile" and fused.fwd_s == pytest.approx(2 * one.fwd_s, rel=0.1)
    # GPT-3's unpadded vocabulary: priced as 50304 (Megatron pads to 128), from the aligned
    # neighbour, not from the slow unaligned kernel the profile measured
    slow = next(float(r["fwd_time_s"]) for r in _rows("matmul")
                if (r["m"], r["n"], r["k"]) == ("2048", "50257", "12288"))
    head = price_op(hw, _mm(2048, 50257, 12288), prof)
    ref = price_op(hw, _mm(2048, 49152, 12288), prof)
    assert head.fwd_s == pytest.approx(ref.fwd_s * 50304 / 49152)
    assert head.fwd_s < 0.2 * slow


def test_attention_priced_from_the_default_backend_table(hw, prof, tmp_path):
    # the H100 profile has attention_default.csv (no SDPA backend forced): it prices attention
    assert prof.attention_table == "attention_default.csv"
    default, flash = _rows("attention_default"), _rows("attention")
    assert len(default) == len(flash) == 80 and not any(r["error"] for r in default)
    # PyTorch picked cuDNN attention for every shape on this H100 (torch 2.11, cuDNN 9.19)
    assert {r["backend"].split("+")[0] for r in default} == {"default:cudnn"}
    key = lambda r: tuple(r[c] for c in ("s_q", "heads", "kv_heads", "head_dim", "causal"))
    fl = {key(r): r for r in flash}
    big = [r for r in default if int(r["s_q"]) * int(r["heads"]) >= 32 * 4096]
    assert len(big) >= 6
    for r in big:  # cuDNN about 2x faster than flash on the model-sized shapes
        f = fl[key(r)]
        assert float(r["fwd_time_s"]) < 0.6 * float(f["fwd_time_s"]), key(r)
        assert float(r["bwd_time_s"]) < 0.7 * float(f["bwd_time_s"]), key(r)
    # without attention_default.csv the flash table prices attention
    for fam in ("matmul", "attention"):
        (tmp_path / f"{fam}.csv").write_text((PROF / f"{fam}.csv").read_text())
    old = load_profile(tmp_path)
    assert old.attention_table == "attention.csv"
    att = _op(block_cost(load_model("llama2_7b"), 1, Variant()), "attention")
    row = next(r for r in flash if key(r) == ("4096", "32", "32", "128", "1"))
    assert price_op(hw, att, old).fwd_s == pytest.approx(float(row["fwd_time_s"]), rel=1e-12)
    assert price_op(hw, att, prof).fwd_s < 0.6 * price_op(hw, att, old).fwd_s


def test_profiler_default_attention_table_on_cpu(tmp_path):
    from nest.profiling.operators import TABLE_ORDER, columns, profile_operators
    from nest.profiling.shapes import TINY_MODELS, merge_shapes, shapes_for_model
    from nest.profiling.timing import Timer

    assert TABLE_ORDER.index("attention_default") == TABLE_ORDER.index("attention") + 1
    shapes = merge_shapes(shapes_for_model(d, (1,), (1,), m_grid=(), cp_degrees=(1,))
                          for d in TINY_MODELS)
    timer = Timer("cpu", warmup_s=0.0, rep_s=0.0, min_reps=1, max_reps=1)
    res = profile_operators(shapes, tmp_path, device="cpu", timer=timer,
                            families={"attention_default"}, progress=lambda _: None)
    assert set(res) == {"attention_default"} and res["attention_default"]["errors"] == 0
    with open(tmp_path / "attention_default.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == columns("attention") == columns("attention_default")
        rows = list(reader)
    assert rows and all(float(r["fwd_time_s"]) > 0 and float(r["bwd_time_s"]) > 0 for r in rows)
    # the implementation PyTorch dispatched to is read back (CPU: its flash kernel)
    assert all(r["backend"].startswith("default:") and "?" not in r["backend"] for r in rows)
    assert any(r["backend"].endswith("+enable_gqa") for r in rows)  # the GQA tiny models


def test_attention_exact_context_parallel_and_backward_floor(hw, prof):
    llama = load_model("llama2_7b")
    att = _op(block_cost(llama, 1, Variant()), "attention")
    row = next(r for r in _rows("attention_default")
               if (r["s_q"], r["heads"], r["kv_heads"], r["head_dim"]) == ("4096", "32", "32", "128"))
    t = price_op(hw, att, prof)
    assert t.source == "profile"
    assert t.fwd_s == pytest.approx(float(row["fwd_time_s"]), rel=1e-12)
    assert t.bwd_s == pytest.approx(float(row["bwd_time_s"]), rel=1e-12)
    # context parallel 2: 2048 local queries against the whole 4096-token sequence
    half = next(r for r in _rows("attention_default")
                if (r["s_q"], r["heads"], r["kv_heads"], r["head_dim"]) == ("2048", "32", "32", "128"))
    t2 = price_op(hw, _op(block_cost(llama, 1, Variant(cp=2)), "attention"), prof)
    assert t2.fwd_s == pytest.approx(2 * float(half["fwd_time_s"]))
    # GQA (Llama-3: 64 heads, 8 kv heads) picks the kv-matched row
    l3 = price_op(hw, _op(block_cost(load_model("llama3_70b"), 1, Variant()), "attention"), prof)
    row3 = next(r for r in _rows("attention_default")
                if (r["s_q"], r["heads"], r["kv_heads"]) == ("4096", "64", "8"))
    assert l3.fwd_s == pytest.approx(float(row3["fwd_time_s"]), rel=1e-12)
    # BERT's backward sits on the ~45 us autograd floor: roofline
    bert = _op(block_cost(load_model("bert_large"), 1, Variant()), "attention")
    tb = price_op(hw, bert, prof)
    assert (tb.fwd_source, tb.bwd_source) == ("profile", "roofline")
    assert tb.bwd_s == op_times(hw, bert)[1]


def test_memory_ops_by_bytes_with_floor(hw, prof):
    gpt = block_cost(load_model("gpt3_175b"), 1, Variant())
    gelu = next(r for r in _rows("elementwise") if (r["op"], r["rows"]) == ("gelu", "2048")
                and r["cols"] == "49152")
    t = price_op(hw, _op(gpt, "gelu"), prof)  # same bytes as the measured 2048 x 49152 GELU
    assert t.fwd_s == pytest.approx(float(gelu["fwd_time_s"]), rel=1e-9)
    assert t.bwd_s == pytest.approx(float(gelu["bwd_time_s"]), rel=1e-9)
    ln = next(r for r in _rows("norm") if (r["rows"], r["cols"]) == ("2048", "12288"))
    assert price_op(hw, _op(gpt, "norm1"), prof).fwd_s == pytest.approx(
        float(ln["fwd_time_s"]), rel=1e-9)
    # BERT's LayerNorm backward (512 x 1024) is measured at the autograd floor: roofline
    bert_norm = _op(block_cost(load_model("bert_large"), 1, Variant()), "norm1")
    tb = price_op(hw, bert_norm, prof)
    assert tb.bwd_source == "roofline" and tb.bwd_s < AUTOGRAD_FLOOR_S


def test_moe_expert_gemms_from_moe_csv(hw, prof):
    cost = block_cost(load_model("mixtral_8x7b"), 1, Variant())
    moe = {(r["op"], r["experts"], r["m"], r["n"], r["k"]): r for r in _rows("moe")}
    t = price_op(hw, _op(cost, "expert_gate_up"), prof)
    want = sum(float(moe[(o, "8", "1024", "14336", "4096")]["fwd_time_s"])
               for o in ("expert_gate", "expert_up"))
    assert t.source == "profile" and t.fwd_s == pytest.approx(want, rel=1e-12)
    down = price_op(hw, _op(cost, "expert_down"), prof)
    assert down.bwd_s == pytest.approx(float(moe[("expert_down", "8", "1024", "4096", "14336")]
                                             ["bwd_time_s"]), rel=1e-12)


def test_cost_table_default_profile_and_roofline_identity(hw, tmp_path):
    g = build_layer_graph(load_model("llama2_7b"))
    v = Variant().key
    table = CostTable(g, hw)  # the hardware file names a profile: used by default
    assert table.times(1, v).source == "profile"
    assert table.times(1, v).op_sources["qkv"] == "profile"
    plain = CostTable(g, hw, profile=None)
    ref = layer_times(hw, g.layers[1].costs[v])
    assert (plain.times(1, v).fwd_s, plain.times(1, v).bwd_s) == (ref.fwd_s, ref.bwd_s)
    assert plain.times(1, v).source == "roofline"
    tpu = load_hardware("tpuv4_like")
    t_tpu = CostTable(g, tpu).times(1, v)
    assert t_tpu == layer_times(tpu, g.layers[1].costs[v]) and t_tpu.source == "roofline"
    table.write(tmp_path / "costs.json")  # schema-valid with per-op sources
    rows = json.loads((tmp_path / "costs.json").read_text())["rows"]
    assert {r["source"] for r in rows} == {"profile"}
    with pytest.raises(ValueError):
        CostTable(g, hw, profile="h100")


def test_unknown_profile_is_a_spec_error(tmp_path):
    d = yaml.safe_load((config_dir() / "hardware" / "h100_sxm.yaml").read_text())
    d["profile"] = "no_such_card"
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(SpecError, match="key 'profile'"):
        load_hardware(path)


def test_validation_against_measured_blocks(tmp_path):
    report = V.validate("h100_sxm")
    rows = {r["model"]: r for r in report["rows"]}
    assert set(rows) == {"bert_large", "llama2_7b", "llama3_70b", "gpt3_175b", "mixtral_8x7b"}
    bound = {m for m, r in rows.items() if r["gpu_bound"]}
    assert bound == {"llama2_7b", "llama3_70b", "gpt3_175b"}
    for m in bound:  # achieved: within 13% (worst: GPT-3 backward +12.4%; validation.md)
        for k in ("fwd_s", "bwd_s"):
            assert abs(rows[m]["err"][k]) <= ACHIEVED_TIME_GPU_BOUND, (m, k)
    # mean over the GPU-bound dense blocks: within the 10% target (forward 6.8%, backward 9.4%)
    for k in ("fwd_s", "bwd_s"):
        assert report["mean_abs_err_gpu_bound"][k] <= V.TIME_TARGET, k
    for m, r in rows.items():  # memory target met with flash activation accounting
        assert abs(r["err"]["peak_flash_bytes"]) <= V.ACHIEVED_MEMORY_FLASH <= V.MEMORY_TARGET, m
        # every block's layer graph comes from the profile
        assert r["pred"]["source"] == "profile"
    # the closed form's s^2 score tensors are what breaks the as-is Llama-2 memory estimate
    assert rows["llama2_7b"]["err"]["peak_bytes"] > 0.2
    out = tmp_path / "validation.md"
    assert V.main(["-o", str(out)]) == 0
    text = out.read_text()
    assert "| llama2_7b | 4096 |" in text and "Why it misses" in text


def test_sustained_measurement_runs_on_cpu_and_records_provenance(tmp_path):
    """nest.profiling.sustained (scripts/gpu_measure.sh; prepared for a lent GPU, not run here):
    the CPU path writes one row per test and shape with the call counts and FLOP rate that its
    time implies, and the metadata with its method and schema."""
    import csv
    import json

    from nest.profiling import sustained

    assert sustained.main(["--tiny", "--out", str(tmp_path), "--tests", "gemm,wgrad"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "cpu" / "sustained.csv")))
    gemm = [r for r in rows if r["test"] == "gemm"]
    assert len(gemm) == len(sustained.TINY_GEMMS) and gemm[0]["calls"] == "5"
    m, n, k = (int(gemm[0][c]) for c in "mnk")
    assert float(gemm[0]["tflops"]) == pytest.approx(
        2 * m * n * k / float(gemm[0]["seconds_per_call"]) / 1e12)
    assert {r["variant"] for r in rows if r["test"] == "wgrad"} >= {"bf16_wgrad_only",
                                                                    "bf16_wgrad_then_fp32_add"}
    meta = json.load(open(tmp_path / "cpu" / "sustained_meta.json"))
    assert meta["schema"] == sustained.SCHEMA and meta["timed_calls"] == 5
    assert set(meta["states"]) == {"gemm", "wgrad"}
