"""Measured single-block training (profiles/<hw>/blocks.json) x cost model -> predicted vs measured.

For every block `nest profile` trained on the GPU (one transformer block, micro-batch 1, bf16, no
dropout, mixed-precision Adam; profiles/README.md) the cost model predicts, with the same terms
the shared evaluator uses:

* forward / backward: the block's layer-graph operators (nest.graph.closed_form.block_cost,
  variant tp1 at the run's sequence length, dropout off as in the run) priced by
  nest.costs.table.layer_times: the measured operator profile where it covers the shape, the
  roofline elsewhere (the evaluator's CostTable default for this hardware);
* Adam step: the evaluator's optimizer term (nest.costs.memory.optimizer_step_s at the default
  precision, nest.spec.precision: 38 B per parameter / (HBM bandwidth x memory_efficiency));
  step = forward + backward + Adam (the measured step has no more);
* peak memory, compared with max_memory_allocated above what was allocated before the block:
  bf16 weights 2 B + fp32 main gradients 4 B + Adam 12 B per parameter (the run's "mixed"
  optimizer: 18 B, nest.spec.precision's defaults, the evaluator's terms), plus what this run holds on
  top: the bf16 gradients from backward to the optimizer step (2 B per parameter), the output
  gradient fed to backward (2 s h bytes) and, in the first block a process measures, the 32 MiB
  cuBLAS workspace (profiles/README.md); plus the activations the layer graph saves
  (act_bytes["none"]). The evaluator's allocator fragmentation and framework overhead are
  outside max_memory_allocated and are not added.

A second memory column applies the flash-attention accounting the closed form lacks: flash
kernels save no s x s score tensors (Korthikanti's 5 a s^2 b term; the closed form drops it only
under selective recomputation) but the softmax log-sum-exp, 4 bytes per query and head.
`main(argv)` prints the table and writes it to profiles/<hw>/validation.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

from nest.costs.profiled import profile_for
from nest.costs.table import layer_times, main_grad_accumulation_s, main_grad_traffic_s
from nest.common.errors import SpecError
from nest.graph.closed_form import block_cost
from nest.graph.layer_graph import Variant
from nest.costs.memory import optimizer_step_s
from nest.spec.settings import TrainingSettings
from nest.spec.catalog import (HardwareSpec, ModelSpec, config_dir, load_hardware, load_json,
                        load_model)

BLOCK_SCHEMA = "nest.block_validation/v1"
BYTES = 2  # bf16
GIB = 2**30
CUBLAS_WORKSPACE_BYTES = 32 * 2**20  # cuBLAS workspace on Hopper, made in the first GEMM
# Bytes per parameter the measured optimizers hold (nest.profiling.blocks: MixedAdam, PlainAdam).
MIXED = TrainingSettings()  # the "mixed" run: nest.spec.precision's defaults (Megatron-LM's --bf16)
HELD_BYTES = {
    # bf16 weights, fp32 main gradients, fp32 master + momentum + variance; the evaluator's terms
    "mixed": {"weights": MIXED.weight_bytes_per_param, "main_grads": MIXED.grad_bytes_per_param,
              "optimizer_states": MIXED.optimizer_state_bytes},
    "bf16": {"weights": 2, "main_grads": 2, "optimizer_states": 4},  # torch Adam on bf16 params
}
TRANSIENT_GRAD_BYTES = {"mixed": 2, "bf16": 0}  # bf16 .grad from backward to the optimizer step
# Targets of issue 7, and what the committed H100 profile achieves (tests/test_profiled_costs.py).
TIME_TARGET = 0.10
MEMORY_TARGET = 0.05
ACHIEVED_TIME_GPU_BOUND = 0.13  # |error| of forward and backward, dense GPU-bound blocks
ACHIEVED_MEMORY_FLASH = 0.05  # |error| of the peak with flash activation accounting, every block
# Eager PyTorch's host time per module call (the measured BERT forward: 38 us per operator);
# a block with less GPU work per operator is host-bound.
HOST_S_PER_OP = 40e-6


@dataclass(frozen=True)
class _NoDropout(ModelSpec):
    """The catalog model as the measured block ran it: no dropout (profiles/README.md)."""

    @property
    def has_dropout(self) -> bool:
        return False


def block_model(block: dict, where: str = "blocks.json") -> ModelSpec:
    """The catalog model of one measured block, checked against its dims, at the run's sequence."""
    m = load_model(block["model"])
    d = block["dims"]
    checks = {
        "hidden_size": (d["hidden_size"], m.hidden_size),
        "num_heads": (d["num_heads"], m.num_heads),
        "num_kv_heads": (d.get("num_kv_heads") or d["num_heads"], m.num_kv_heads),
        "ffn_hidden_size": (d["ffn_hidden_size"], m.ffn_hidden_size),
        "ffn_type": (d["ffn_type"], m.ffn_type),
        "num_experts": (d.get("num_experts") or 1, m.num_experts),
        "norm": (d.get("norm", m.norm), m.norm),
        "causal": (d.get("causal", m.causal), m.causal),
    }
    if m.is_moe:
        checks["top_k"] = (d.get("top_k"), m.top_k)
    for key, (run, cat) in checks.items():
        if run != cat:
            raise SpecError(f"{where}: block '{block['model']}' key 'dims.{key}': measured with "
                            f"{run!r}, catalog model has {cat!r}")
    m = replace(m, seq_len=int(block["seq_len"]))
    return _NoDropout(**{f.name: getattr(m, f.name) for f in fields(m)})


def predict_block(block: dict, hw: HardwareSpec, profile, *, first: bool = False) -> dict:
    """The cost model's forward, backward, Adam, step seconds and peak bytes for one block."""
    m = block_model(block)
    b = int(block["mbs"])
    cost = block_cost(m, b, Variant())
    times = layer_times(hw, cost, profile)
    params = cost.params
    if int(round(params)) != int(block["num_params"]):
        raise SpecError(f"blocks.json: block '{block['model']}' key 'num_params': measured "
                        f"{block['num_params']}, layer graph {params:.0f}")
    opt = block.get("optimizer", "mixed")
    if opt not in HELD_BYTES:
        raise SpecError(f"blocks.json: block '{block['model']}' key 'optimizer': {opt!r} is not "
                        f"one of {sorted(HELD_BYTES)}")
    # the measured block writes BF16 gradients in its backward and copies them into the FP32
    # main_grad in its optimizer step (nest.profiling.blocks, MixedAdam): no fused accumulation in
    # its backward, and the step runs the copy as its own kernel (always additive)
    times = replace(times, bwd_s=times.bwd_s - main_grad_accumulation_s(hw, cost))
    opt_s = optimizer_step_s(params, MIXED, hw) + main_grad_traffic_s(hw, cost)  # a copy kernel
    tokens = b * m.seq_len
    mem = {k: v * params for k, v in HELD_BYTES[opt].items()}
    mem["bf16_grads"] = TRANSIENT_GRAD_BYTES[opt] * params
    mem["output_grad"] = BYTES * tokens * m.hidden_size
    mem["workspace"] = CUBLAS_WORKSPACE_BYTES if first else 0.0
    mem["activations"] = cost.act_bytes["none"]
    peak = sum(mem.values())
    scores = cost.act_bytes["none"] - cost.act_bytes["selective"]  # the s^2 tensors
    lse = 4.0 * b * m.num_heads * m.seq_len  # fp32 log-sum-exp per query and head
    return {
        "model": block["model"], "seq_len": m.seq_len, "params": params,
        "fwd_s": times.fwd_s, "bwd_s": times.bwd_s, "opt_s": opt_s,
        "step_s": times.fwd_s + times.bwd_s + opt_s,
        "peak_bytes": peak, "peak_flash_bytes": peak - scores + lse,
        "memory_bytes": mem, "score_bytes": scores, "source": times.source,
        "op_sources": times.op_sources, "num_ops": len(cost.ops),
    }


def _err(pred: float, meas: float) -> float:
    return pred / meas - 1.0


def validate(hardware: str = "h100_sxm", blocks_path: str | Path | None = None) -> dict:
    """Predicted vs measured for every block of profiles/<hardware>/blocks.json (both paths)."""
    hw = load_hardware(hardware)
    folder = Path(hw.profile_dir) if hw.profile_dir else config_dir().parent / "profiles" / hw.name
    path = Path(blocks_path) if blocks_path else folder / "blocks.json"
    if not path.exists():
        raise SpecError(f"{path}: no measured blocks (run `nest profile` on a GPU)")
    data = load_json(path, "blocks.json")
    if data.get("schema") != BLOCK_SCHEMA:
        raise SpecError(f"{path}: key 'schema': expected {BLOCK_SCHEMA!r}")
    profile = profile_for(hw)
    rows = []
    measured = [b for b in data["blocks"] if "error" not in b]
    for i, blk in enumerate(measured):
        first = i == 0 and blk is data["blocks"][0]
        pred = predict_block(blk, hw, profile, first=first)
        roof = predict_block(blk, hw, None, first=first)
        meas = {"fwd_s": blk["time_fwd_s"], "bwd_s": blk["time_bwd_s"],
                "opt_s": blk["time_optimizer_s"], "step_s": blk["time_step_s"],
                "peak_bytes": blk["peak_memory_above_start_bytes"],
                "saved_bytes": blk.get("activation_saved_bytes")}
        err = {k: _err(pred[k], meas[k]) for k in ("fwd_s", "bwd_s", "opt_s", "step_s",
                                                   "peak_bytes")}
        err["peak_flash_bytes"] = _err(pred["peak_flash_bytes"], meas["peak_bytes"])
        err_roof = {k: _err(roof[k], meas[k]) for k in ("fwd_s", "bwd_s", "step_s")}
        # GPU-bound: dense (the run's MoE is a host-synchronising loop) and enough GPU work per
        # operator to hide eager PyTorch's host time per module call
        bound = (pred["fwd_s"] / pred["num_ops"] >= HOST_S_PER_OP
                 and not block_model(blk).is_moe)
        rows.append({"model": blk["model"], "pred": pred, "roofline": roof, "meas": meas,
                     "err": err, "err_roofline": err_roof, "gpu_bound": bound})
    keys = ("fwd_s", "bwd_s", "opt_s", "step_s", "peak_bytes", "peak_flash_bytes")

    def mean(rs: list[dict]) -> dict:
        return {k: sum(abs(r["err"][k]) for r in rs) / len(rs) for k in keys} if rs else {}

    gpu_bound = [r for r in rows if r["gpu_bound"]]
    meta = path.with_name("meta.json")
    date = json.loads(meta.read_text()).get("date_utc", "") if meta.exists() else ""
    return {"hardware": hw.name, "profile_dir": hw.profile_dir, "blocks_path": str(path),
            "profile_date": date,
            "rows": rows, "mean_abs_err": mean(rows), "mean_abs_err_gpu_bound": mean(gpu_bound),
            "skipped": [b["model"] for b in data["blocks"]
                                                            if "error" in b]}


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _cell(r: dict, key: str, fmt) -> str:
    return f"{fmt(r['pred'][key])} / {fmt(r['meas'][key])} ({_pct(r['err'][key])})"


def render(report: dict) -> str:
    """The validation as Markdown: the table, the averages, the notes."""
    rows, mean = report["rows"], report["mean_abs_err"]
    gib = lambda x: f"{x / GIB:.2f}"  # noqa: E731
    src = "measured operator profile, roofline fallback" if report["profile_dir"] else "roofline"
    out = [f"## Cost model vs measured blocks ({report['hardware']})", "",
           f"Generated by `nest validate` (nest/fidelity/block_validation.py) from `{Path(report['blocks_path']).name}`;"
           f" operators priced from the {src}. Each cell: predicted / measured (error). "
           f"Targets: time within {TIME_TARGET:.0%}, memory within {MEMORY_TARGET:.0%}.", "",
           "| block | seq | fwd ms | bwd ms | Adam ms | step ms | peak GiB | peak GiB, flash "
           "act. | roofline only: fwd / bwd / step |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, e, er = r["pred"], r["err"], r["err_roofline"]
        out.append(
            f"| {r['model']} | {p['seq_len']} | {_cell(r, 'fwd_s', _ms)} | "
            f"{_cell(r, 'bwd_s', _ms)} | {_cell(r, 'opt_s', _ms)} | {_cell(r, 'step_s', _ms)} | "
            f"{_cell(r, 'peak_bytes', gib)} | {gib(p['peak_flash_bytes'])} "
            f"({_pct(e['peak_flash_bytes'])}) | {_pct(er['fwd_s'])} / {_pct(er['bwd_s'])} / "
            f"{_pct(er['step_s'])} |")
    for label, mn in (("all blocks", mean),
                      ("GPU-bound dense blocks (" + ", ".join(
                          r["model"] for r in rows if r["gpu_bound"]) + ")",
                       report["mean_abs_err_gpu_bound"])):
        if mn:
            out.append(f"| **mean abs. error, {label}** | | {mn['fwd_s']:.1%} | "
                       f"{mn['bwd_s']:.1%} | {mn['opt_s']:.1%} | {mn['step_s']:.1%} | "
                       f"{mn['peak_bytes']:.1%} | {mn['peak_flash_bytes']:.1%} | |")
    if report["skipped"]:
        out += ["", f"Blocks with a measurement error, skipped: {', '.join(report['skipped'])}."]
    out += ["", "Peak memory (predicted): " + "; ".join(
        f"{r['model']} " + ", ".join(f"{k} {v / GIB:.3f}" for k, v in
                                     r["pred"]["memory_bytes"].items() if v)
        for r in rows) + " GiB. \"flash act.\" replaces the closed form's s x s score "
            "tensors (" + ", ".join(f"{r['model']} {r['pred']['score_bytes'] / GIB:.3f} GiB"
                                    for r in rows if r["pred"]["score_bytes"]) +
            ") by flash attention's fp32 log-sum-exp.", ""]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`nest validate`: print the table; write it to profiles/<hw>/validation.md (or --out)."""
    ap = argparse.ArgumentParser(prog="nest validate", description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h100_sxm", help="catalog hardware (default h100_sxm)")
    ap.add_argument("--blocks", help="blocks.json to read (default: the hardware's profiles)")
    ap.add_argument("-o", "--out", help="Markdown file to write (default profiles/<hw>/"
                    "validation.md; '-' writes nothing)")
    ap.add_argument("--json", help="also write the full report as JSON here")
    a = ap.parse_args(argv)
    try:
        report = validate(a.hardware, a.blocks)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2  # bad input (nest.interfaces.cli.EXIT_ERROR)
    md = render(report)
    print(md, end="")
    out = a.out or str(Path(report["blocks_path"]).with_name("validation.md"))
    if out != "-":
        notes = NOTES.get((report["hardware"], report.get("profile_date", "")), "")
        Path(out).write_text(md + ("\n" + notes if notes else ""))
        print(f"written to {out}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


# Why the model misses where it misses: measured evidence (not fitted knobs) for one profile,
# keyed by (hardware, meta.json date_utc) so that a re-measured profile does not inherit them.
NOTES: dict[tuple[str, str], str] = {
    ("h100_sxm", "2026-11-26T02:18:03+00:00"): """### Why it misses (h100_sxm, profile of 2026-11-26)

Follow-up measurements on an H100 80GB HBM3 (same image: torch 2.11.0+cu130, driver 580.159.04;
2026-11-26; three short scripts run for this validation, their numbers quoted here):

1. **Attention backend.** `attention.csv` times `scaled_dot_product_attention` with the flash
   backend forced; the measured blocks call it with PyTorch's default, which on H100 picks cuDNN
   attention, twice as fast (forward / backward ms, default vs flash): Llama-2 shape 0.255 / 0.781
   vs 0.508 / 1.431; Llama-3 0.461 / 1.508 vs 0.930 / 2.799; GPT-3 0.204 / 0.675 vs 0.381 /
   1.242; Mixtral 0.256 / 0.815 vs 0.502 / 1.502. Forcing flash in the block itself costs
   Llama-2 +0.29 ms forward, +0.64 ms backward (2.665 -> 2.950, 5.681 -> 6.321 ms). The
   backend difference is 46-72 % of the Llama-2 / Llama-3 over-prediction (little of GPT-3's,
   whose attention is short). The profiler now also times the default backend
   (`attention_default.csv`, scripts/gpu_attention.sh) and the cost model prices attention from
   it; the flash-forced table stays for comparison.
2. **GEMMs run faster inside a short block step than in the operator sweep.** torch.profiler
   kernel times inside the blocks: Llama-2 GEMMs 6.20 ms per step for 4.97 TFLOP (802 TFLOP/s),
   GPT-3 27.9 ms for 22.3 TFLOP (797 TFLOP/s); `matmul.csv` has the same shapes at 676 and 685
   TFLOP/s (forward + both backward GEMMs). A 20 s continuous 8192^3 GEMM load ran at 687
   TFLOP/s with the SM clock at 1725 MHz, against 783 TFLOP/s for the short ceiling check
   (torch.mm) at the start of the profile run: the sweep keeps the tensor cores busy for
   seconds, each block step spends 28-51 % of its time in the memory-bound Adam step. Consistent with a power/clock
   difference (not proven). A real training step runs many layers back to back, closer to the
   sweep than to one block, so the model keeps the measured operator times.
3. **BERT is host-bound.** Its GPU work is ~0.1 ms per direction, and its measured forward is
   38 us per layer-graph operator: eager PyTorch's Python and dispatch time per module call, not
   GPU work. The cost model floors each layer at the host's time per operator, measured apart
   from any model (nest.profiling.host, profiles/h100_sxm/host.json: 16.7 us forward, 66.4 us
   backward per operator): BERT's backward is then within 4%; its forward still misses, since
   one layer-graph operator is several module calls there (projections with bias, dropout,
   reshapes), which the floor does not count.
4. **Mixtral forward** runs the MoE as a Python loop over the experts with a host-device sync
   per expert (`torch.where` on the routing mask): the GPU idles while the host launches each
   expert's kernels. Its backward has no syncs and matches within 4 %.
5. **Adam.** The evaluator's term is 38 B per parameter (settings.OPTIMIZER_STEP_BYTES) at
   memory_efficiency x HBM bandwidth. The measured MixedAdam moves 40 B per parameter (bf16
   gradient cast to fp32: 2 + 4; fused Adam: 16 read + 12 written; fp32 -> bf16 weight copy:
   4 + 2) at 2.47 TB/s (15.8-16.3 ms per 1e9 parameters, the four large blocks); in-block kernels:
   fused Adam 2.6 TB/s, the two casts 1.9 and 3.0 TB/s. The step column is close only because
   this under-prediction cancels the forward/backward over-prediction.
6. **Memory.** The closed form keeps Korthikanti's 5 a s^2 b score tensors in act_bytes["none"];
   flash attention (which the FLOP count already assumes) saves none, only the fp32 log-sum-exp.
   With that accounting every block is within 2.5 %. The remaining terms are what this run holds:
   18 B per parameter between steps (measured static memory equals it to 0.1 %), the bf16
   gradients until the optimizer step, the output gradient; the eager SwiGLU also keeps
   silu(gate) (2 s f bytes, 2 % of the Llama-2 peak) that a fused kernel would not.
""",
}


if __name__ == "__main__":
    sys.exit(main())
