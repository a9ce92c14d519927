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

The rows are ids sc21_table1_* of config/validation/published_runs.yaml (they count in
`nest validate --published` and the A100 FP16 dense band); this script prints them alone, and
docs/modeling.md, "A100 rows of Narayanan et al. 2021", reads them.

    python benchmarks/sc21_table1.py
"""

from __future__ import annotations

def rows() -> list[dict]:
    """The SC21 Table 1 rows of the validation table."""
    from nest.fidelity.published_runs import load_runs

    return [r for r in load_runs() if r["id"].startswith("sc21_table1_")]


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
