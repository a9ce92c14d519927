"""Time to plan a Hugging Face model: layer-graph building, then the solve, then `nest compare`.

    .venv/bin/python benchmarks/plan_speed.py [--no-compare] [name ...]   (default: every model)

Per model (a published config.json under tests/fixtures/hf/, sequence 4096, micro-batch 1, on
dgx_h100_superpod): the torch.fx layer graph of every parallel variant built cold (trace caches
cleared), then `nest plan --planner nest` with that graph cached in the process (the solve), then
`nest compare` (every planner of the figures' line-up, the graph still cached). Wall-clock
seconds on this machine; the issue's target is graph + solve <= 10 s and compare <= 30 s on two
cores.

Measured at commit 6450f43 on the shared 2-core development machine (load average 6-13 while it
ran, so several times slower than an idle 2-core machine), seconds:

    model          variants  graph s  solve s compare s
    llama3_70b           28     19.0     10.3      89.1
    mixtral_8x22b       112     73.3     19.0     132.3
    qwen1_5_moe          84    107.7      3.1      28.6
    gemma3_1b             4     11.1      1.9       3.6
    gpt_oss_20b         168    261.5      1.5      12.2
    deepseek_v3         196    152.1      9.6     145.9

The graph is one torch.fx trace per (layer kind, variant) (a meta-tensor forward and
backward through fx's Interpreter, dominated by Python dispatch, not by tensor sizes), except
that an expert-parallel variant with ep > 4 of a layer with experts is derived exactly from its
ep = 2 and ep = 4 traces (nest.graph.fx_ep; tests/test_fx_ep.py). `nest plan` also searches the
micro-batch size (1, 2, 4, 8 unless --mbs), so its "solve" includes the layer graphs at the
other micro-batch sizes: one more graph build each.

Graph and solve seconds at commit c3b571f (ep derivation, uninitialised meta weights) against
main at 9a3b060 (this script's graph and solve steps, run one after the other on the shared
2-core machine, load average 2-3; differences under about 30 % are within its run-to-run
noise):

    model          variants  graph s before  after  solve s before  after
    llama3_70b           28            3.2    2.6            32.1   28.7
    mixtral_8x22b       112            9.3    5.5            85.7   92.4
    qwen1_5_moe          84            7.1    6.8             8.9   12.1
    gemma3_1b             4            0.8    1.1             1.0    1.5
    gpt_oss_20b         168           29.6   18.8            28.3   16.7
    deepseek_v3         196           46.9   19.7            67.6   55.2

Graph + solve is within 10 s for Gemma-3-1B only. How the solve's time splits between the
three extra graph builds and the search itself was not measured; a next step: the graph at
mbs 2, 4, 8 from the mbs 1 and 2 traces where every count is affine in the micro-batch size
(not where an MoE's capacity rounds up), and cheaper traces of the other variants.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import warnings
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
MODELS = {  # name: (config file, GPUs)
    "llama3_70b": ("llama_3_70b.json", 64),
    "mixtral_8x22b": ("mixtral_8x22b.json", 64),
    "deepseek_v3": ("deepseek_v3.json", 256),
    "qwen1_5_moe": ("qwen1_5_moe_a2_7b.json", 16),
    "gemma3_1b": ("gemma_3_1b_pt.json", 8),
    "gpt_oss_20b": ("gpt_oss_20b.json", 16),
}
CLUSTER, SEQ = "dgx_h100_superpod", 4096


def _quiet(fn, *a):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*a)


def main(names: list[str], compare: bool = True) -> None:
    from nest.interfaces.cli import main as cli
    from nest.graph import build_graph, fx_extract, meta_cache
    from nest.graph.closed_form import variants_of
    from nest.spec.catalog import load_model

    warnings.simplefilter("ignore")
    print(f"{'model':<14} {'variants':>8} {'graph s':>8} {'solve s':>8} {'compare s':>9}  "
          f"(CPU seconds of this process)")
    for name in names:
        cfg, gpus = MODELS[name]
        path = str(FIXTURES / cfg)
        build_graph.cache_clear()
        fx_extract._cached.cache_clear()
        fx_extract._num_params.cache_clear()
        meta_cache._LAYOUTS.clear()
        t0 = time.process_time()
        m = load_model(path, seq_len=SEQ)
        build_graph(m, 1, "torch_fx")
        t1 = time.process_time()
        common = ["--model", path, "--cluster", CLUSTER, "--num-devices", str(gpus),
                  "--seq-len", str(SEQ)]
        rc = _quiet(cli, ["plan", *common, "--planner", "nest", "-q"])
        t2 = time.process_time()
        rc2 = _quiet(cli, ["compare", *common]) if compare else 0
        t3 = time.process_time()
        flag = "" if rc == rc2 == 0 else f"  (exit {rc} / {rc2})"
        cmp_s = f"{t3 - t2:>9.1f}" if compare else f"{'-':>9}"
        print(f"{name:<14} {len(variants_of(m)):>8} {t1 - t0:>8.1f} {t2 - t1:>8.1f} "
              f"{cmp_s}{flag}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main([a for a in args if a != "--no-compare"] or list(MODELS), "--no-compare" not in args)
