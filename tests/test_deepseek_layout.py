"""DeepSeek-V3's published layout (arXiv 2412.19437, section 3.2: no tensor parallelism, 16-way
pipeline, 64-way expert parallelism, ZeRO-1) is in NEST's space: the solver's optimum over the
cuts, options and placements of that (variant, pp, dp) is no slower than the evaluator's price
of the layout itself, and NEST's optimum is no slower than that."""

from nest.graph.layer_graph import Variant
from nest.problem.evaluate import evaluate
from nest.problem.plan_spec import load_plan
from nest.problem.space import declare, pp_dp_options
from nest.solver import candidate_optimum

PUBLISHED = """\
model: deepseek_v3
cluster: dgx_h100_rail_superpod
num_devices: 1024
mbs: 1
global_batch: 4096
tp: 1
pp: 16
dp: 64
dp_includes_ep: true
ep: 64
recompute: full
zero_stage: 1
"""


def test_published_deepseek_v3_layout_is_in_the_space(tmp_path):
    path = tmp_path / "deepseek_v3_published.yaml"
    path.write_text(PUBLISHED)
    plan, problem = load_plan(path)
    assert (plan.tp, plan.pp, plan.dp, plan.ep) == (1, 16, 1, 64)  # Megatron DP 64 = ep 64
    ev = evaluate(plan, problem)
    assert ev.feasible
    space = declare(problem)
    v = Variant(1, False, 64, 1)
    assert v in space.variants
    assert (16, 1) in set(pp_dp_options(problem, space, v))
    best = candidate_optimum(problem, space, v, 16, 1)
    assert best <= ev.time_per_batch_s * (1 + 1e-9)
