"""The SC21 weak-scaling runs (Narayanan et al. 2021, Table 1) that fit the dgx_a100 cluster file,
priced by the shared evaluator with the settings of the script that produced them: a check of
the 2021 software stack beside the four Table 2 rows of config/validation/published_runs.yaml.

Settings, all from Megatron-LM examples/sc21 @ 6985e58 (run_table_1.sh per model; CONFIG.sh for
every run: --fp16 --loss-scale 8192, sequence 2048, no --accumulate-allreduce-grads-in-fp32):
tensor / pipeline size, micro-batch, global batch, --DDP-impl (torch: PyTorch DDP, its bucketed
all-reduce overlapping the backward, 25 MB buckets = 12.5 M FP16 gradients; local: Megatron's, after
the flush), --activations-checkpoint-method uniform (full recomputation), and
--num-layers-per-virtual-pipeline-stage (76.1B: 5 of 15 layers per stage, V = 3). Gradients are
reduced in FP16 (grad_reduce: bf16, the harness's 16-bit dtype). Measured: Table 1's achieved
teraFLOP/s per GPU by the paper's Eq. 3 (flops: megatron_hardware, V = 51,200). The 145.6B to 1T
rows run on 1,536-3,072 GPUs, beyond the cluster file's 1,120.

These are not rows of the validation table (their numbers stay out of `nest validate --published`
and the uncertainty bands); docs/modeling.md, "A100 rows of Narayanan et al. 2021", reads them.

    python benchmarks/sc21_table1.py
"""

from __future__ import annotations

# name: (GPUs, t, p, micro-batch, global batch, V, Table 1 teraFLOP/s per GPU, --DDP-impl)
TABLE1 = {
    "1p7b": (32, 1, 1, 16, 512, 1, 137, "torch"),
    "3p6b": (64, 2, 1, 16, 512, 1, 138, "torch"),
    "7p5b": (128, 4, 1, 16, 512, 1, 142, "torch"),
    "18p4b": (256, 8, 1, 8, 1024, 1, 135, "torch"),
    "39p1b": (512, 8, 2, 4, 1536, 1, 138, "local"),
    "76p1b": (1024, 8, 4, 2, 1792, 3, 140, "local"),
}
TORCH_DDP_BUCKET_PARAMS = 12_500_000  # torch.nn.parallel.DistributedDataParallel bucket_cap_mb=25


def rows() -> list[dict]:
    """The runs as rows of the published-runs schema (nest.fidelity.published_runs)."""
    out = []
    for name, (n, tp, pp, mbs, gbs, v, tflops, ddp) in TABLE1.items():
        r = {"id": f"sc21_table1_{name}", "model": f"validation/models/sc21_{name}.yaml",
             "cluster": "dgx_a100", "num_devices": n, "tp": tp, "pp": pp, "dp": n // (tp * pp),
             "cp": 1, "ep": 1, "sp": False, "schedule": "interleaved" if v > 1 else "1f1b",
             "virtual_stages": v, "mbs": mbs, "global_batch": gbs, "seq_len": 2048,
             "recompute": "full", "zero_stage": 0, "precision": "fp16", "attention": "unfused",
             "precision_settings": {"grad_reduce": "bf16"},
             "measured": {"model_tflops_per_gpu": tflops}, "flops": "megatron_hardware",
             "flops_vocab_size": 51200,
             "source": f"Narayanan et al. 2021, Table 1; Megatron-LM examples/sc21/run_table_1.sh "
                       f"@ 6985e58, MODEL_SIZE {name.replace('p', '.').upper()}"}
        if ddp == "torch":
            r["overlap"] = {"dp_overlap": "bucketed", "dp_bucket_params": TORCH_DDP_BUCKET_PARAMS}
        out.append(r)
    return out


def main() -> None:
    from nest.fidelity.published_runs import evaluate_row

    print("| run | GPUs | t/p/d (V) | micro-batch | m | measured s | predicted s | error |")
    print("|---|---|---|---|---|---|---|---|")
    errs = []
    for r in rows():
        res = evaluate_row(r)
        m = r["global_batch"] // (r["mbs"] * r["dp"])
        errs.append(res.error)
        print(f"| {r['id']} | {r['num_devices']} | {r['tp']}/{r['pp']}/{r['dp']} "
              f"({r['virtual_stages']}) | {r['mbs']} | {m} | {res.measured_s:.3f} | "
              f"{res.predicted_s:.3f} | {100 * res.error:+.1f}% |")
    print(f"\nmean {100 * sum(errs) / len(errs):+.1f}%, range {100 * min(errs):+.1f}% .. "
          f"{100 * max(errs):+.1f}%")


if __name__ == "__main__":
    main()
