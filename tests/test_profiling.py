"""Operator profiler and block validation: CPU path with tiny shapes, end to end."""

import csv
import json

import pytest
import torch

from nest.profiling import (
    FAMILY_FIELDS,
    MEASURE_COLUMNS,
    PAPER_MODELS,
    TINY_MODELS,
    hardware_name,
    main,
    merge_shapes,
    model_by_name,
    run_block,
    shapes_for_model,
)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles")
    assert main(["--out", str(out), "--tiny", "--hardware", "cpu"]) == 0
    return out / "cpu"


def _rows(path):
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


def test_end_to_end_files_and_columns(cpu_run):
    meta = json.loads((cpu_run / "meta.json").read_text())
    assert meta["schema"] == "nest.profile_meta/v1"
    assert meta["hardware"] == "cpu" and meta["torch"] == torch.__version__
    for key in ("device_name", "driver_version", "cuda", "cudnn", "date_utc", "timing_method"):
        assert key in meta
    for family, fields in FAMILY_FIELDS.items():
        header, rows = _rows(cpu_run / f"{family}.csv")
        assert header == ["op", *fields, *MEASURE_COLUMNS]
        assert rows, family
        for r in rows:
            assert r["error"] == "", r
            assert float(r["fwd_time_s"]) > 0 and float(r["bwd_time_s"]) > 0
            assert r["dtype"] == "bfloat16"
            assert int(r["num_repeats"]) >= 1
            assert r["tags"]


def test_matmul_flops_and_bytes(cpu_run):
    _, rows = _rows(cpu_run / "matmul.csv")
    for r in rows:
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        assert int(r["fwd_flops"]) == 2 * m * n * k
        assert int(r["bwd_flops"]) == 4 * m * n * k
        assert int(r["fwd_bytes"]) == 2 * (m * k + n * k + m * n)
        assert float(r["bwd_time_s"]) == pytest.approx(
            float(r["bwd_dgrad_time_s"]) + float(r["bwd_wgrad_time_s"]), rel=1e-4
        )
        assert float(r["fwd_flops_per_s"]) == pytest.approx(
            2 * m * n * k / float(r["fwd_time_s"]), rel=1e-4
        )


def test_blocks_json(cpu_run):
    res = json.loads((cpu_run / "blocks.json").read_text())
    assert res["schema"] == "nest.block_validation/v1"
    assert [b["model"] for b in res["blocks"]] == [d["name"] for d in TINY_MODELS]
    for b in res["blocks"]:
        assert b["time_step_s"] > 0 and b["time_fwd_s"] > 0 and b["time_bwd_s"] > 0
        assert b["num_params"] == b["num_params_closed_form"]


def test_shapes_llama2_tp8_qkv():
    shapes = shapes_for_model(model_by_name("llama2_7b"), tp_degrees=(8,))
    mm = {(s["m"], s["n"], s["k"]) for s in shapes if s["family"] == "matmul"}
    assert (4096, 3 * 4096 // 8, 4096) in mm  # QKV, column-parallel
    assert (4096, 4096, 4096 // 8) in mm  # out-projection, row-parallel
    assert (4096, 11008 // 8, 4096) in mm  # MLP up / gate
    assert (4096, 4096, 11008 // 8) in mm  # MLP down
    assert (4096, 32000 // 8, 4096) in mm  # LM head, vocab-parallel
    attn = [s for s in shapes if s["family"] == "attention"]
    assert {(s["heads"], s["s_q"], s["head_dim"], s["causal"]) for s in attn} == {(4, 4096, 128, 1)}


def test_shapes_gqa_moe_and_dedup():
    llama3 = shapes_for_model(model_by_name("llama3_70b"), tp_degrees=(1, 8), m_grid=())
    mm = {(s["m"], s["n"], s["k"]) for s in llama3 if s["family"] == "matmul"}
    assert (4096, (64 + 2 * 8) * 128, 8192) in mm and (4096, (8 + 2 * 1) * 128, 8192) in mm
    mix = shapes_for_model(
        model_by_name("mixtral_8x7b"), tp_degrees=(1,), m_grid=(), ep_degrees=(1, 4)
    )
    moe = {(s["op"], s["experts"], s["m"], s["n"], s["k"]) for s in mix if s["family"] == "moe"}
    assert ("expert_up", 8, 4096 * 2 // 8, 14336, 4096) in moe
    assert ("expert_down", 2, 4 * 4096 * 2 // 8, 4096, 14336) in moe
    merged = merge_shapes(shapes_for_model(d) for d in PAPER_MODELS)
    keys = [(s["family"], s["op"], *(s[c] for c in FAMILY_FIELDS[s["family"]])) for s in merged]
    assert len(keys) == len(set(keys))
    # llama2 and mixtral share the attention out-projection: one row, both tags
    shared = [
        s
        for s in merged
        if s["family"] == "matmul" and (s["m"], s["n"], s["k"]) == (4096, 4096, 4096)
    ]
    assert len(shared) == 1
    assert {t.split(":")[0] for t in shared[0]["tags"]} >= {"llama2_7b", "mixtral_8x7b"}


def _closed_form_params(d):
    """Parameter count of one block, written out independently of the library."""
    h, a, kv, f = d["hidden_size"], d["num_heads"], d["num_kv_heads"], d["ffn_hidden_size"]
    hd = h // a
    q, kv_w, o = h * h, 2 * h * kv * hd, h * h
    if d["bias"]:
        q, kv_w, o = q + h, kv_w + 2 * kv * hd, o + h
    norms = 2 * (2 * h if d["norm"] == "layernorm" else h)
    if d["num_experts"]:
        mlp = d["num_experts"] * (3 * h * f) + h * d["num_experts"]
    elif d["ffn_type"] == "swiglu":
        mlp = 3 * h * f
    else:
        mlp = h * f + f + f * h + h if d["bias"] else 2 * h * f
    return q + kv_w + o + norms + mlp


@pytest.mark.parametrize("name", [d["name"] for d in TINY_MODELS])
def test_block_runs_on_cpu_and_counts_params(name):
    dims = model_by_name(name)
    r = run_block(dims, device="cpu", warmup_steps=1, num_steps=2)
    assert r["num_params"] == _closed_form_params(dims)
    assert r["time_step_s"] >= r["time_fwd_s"] > 0
    assert r["seq_len"] == dims["seq_len"]


def test_paper_block_param_counts():
    # Llama-2-7B: 32 layers x 202.4 M + embeddings/head 2 x 131 M + final norm = 6.74 B
    llama = model_by_name("llama2_7b")
    total = 32 * _closed_form_params(llama) + 2 * 32000 * 4096 + 4096
    assert total == pytest.approx(6.74e9, rel=0.005)
    # GPT-3: 12 h^2 per layer dominates
    gpt = model_by_name("gpt3_175b")
    assert _closed_form_params(gpt) == pytest.approx(12 * 12288**2, rel=0.001)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("NVIDIA H200", "h200_sxm"),
        ("NVIDIA H100 PCIe", "h100_pcie"),
        ("NVIDIA H100 NVL", "h100_nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100_sxm"),
        ("Tesla V100-SXM2-32GB", "tesla_v100_sxm2_32gb"),
    ],
)
def test_hardware_name(name, expected):
    assert hardware_name(name) == expected


def test_hardware_flag_cannot_mislabel(tmp_path, capsys):
    # on a CPU-only machine, asking for h100_sxm still writes under the detected name
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    assert (
        main(
            [
                "--out",
                str(tmp_path),
                "--tiny",
                "--hardware",
                "h100_sxm",
                "--skip-blocks",
                "--models",
                "tiny_gelu",
            ]
        )
        == 0
    )
    assert (tmp_path / "cpu" / "matmul.csv").exists()
    assert not (tmp_path / "h100_sxm").exists()
    assert "WARNING" in capsys.readouterr().out
