"""Precision as one setting (nest.spec.precision): memory per term against Megatron-LM's theoretical
memory formula, gradient / weight collective bytes, published H100 runs, FP8, export flags,
usable HBM, interleaved labels."""

from pathlib import Path

import pytest

from nest.costs.memory import state_bytes
from nest.costs.stage import bytes_per_param
from nest.common.errors import SpecError
from nest.problem.evaluate import evaluate, make_problem
from nest.problem.plan_spec import load_plan
from nest.spec.precision import Precision, precision_args, precision_from_dict
from nest.spec.settings import OPTIMIZER_STATE_BYTES, OPTIMIZER_STEP_BYTES, TrainingSettings
from nest.spec.catalog import load_hardware

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def megatron_bytes_per_param(use_distributed_optimizer: bool, d: int) -> float:
    """megatron/training/theoretical_memory_usage.py (NVIDIA/Megatron-LM @ d98e8a6, line 296):
    bf16 params, fp32 main grads, fp32 main params and Adam states."""
    return 18 if not use_distributed_optimizer else 6 + (12 / d)


def per_param(z: int, d: int, **prec) -> dict:
    tr = TrainingSettings(precision=precision_from_dict(prec, "test"))
    return state_bytes(1.0, 0.0, d, 1, 1, z, tr)


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_default_precision_is_megatrons_theoretical_memory(d):
    no_distopt, distopt = per_param(0, d), per_param(1, d)
    assert sum(no_distopt.values()) == pytest.approx(megatron_bytes_per_param(False, d))
    assert sum(distopt.values()) == pytest.approx(megatron_bytes_per_param(True, d))
    # per term: 2 (bf16 weights) + 4 (fp32 main grads) + 12 / d (fp32 master + two moments)
    assert distopt == pytest.approx({"weights": 2, "gradients": 4, "optimizer_states": 12 / d})


@pytest.mark.parametrize("d", [1, 4, 32])
def test_bf16_variants_per_term(d):
    # --grad-reduce-in-bf16: a bf16 grad buffer (2) and the distributed optimizer's fp32 copy of
    # its shard (shard_model_grad.float(): 4 / d); without the distributed optimizer the copy is
    # the whole gradient (Float16OptimizerWithFloat16Params: 4); it lives during the optimizer
    # step only, so it has its own key (nest.costs.memory.allocated)
    red = per_param(1, d, grad_reduce="bf16")
    assert red == pytest.approx({"weights": 2, "gradients": 2, "optimizer_states": 12 / d,
                                 "step_transient": 4 / d})
    assert sum(per_param(0, d, grad_reduce="bf16").values()) == pytest.approx(2 + 2 + 4 + 12)
    # the precision-aware optimizer with bf16 main grads and bf16 moments: no copy, fp32 master as
    # a 16-bit remainder (Transformer Engine FusedAdam store_param_remainders): 4 + 6 / d
    aware = per_param(1, d, grad_reduce="bf16", main_grads="bf16", exp_avg="bf16",
                      exp_avg_sq="bf16")
    assert aware == pytest.approx({"weights": 2, "gradients": 2, "optimizer_states": 6 / d})
    # ZeRO-2 / 3 shard the gradient buffer and then the weights as well
    assert sum(per_param(3, d).values()) == pytest.approx(18 / d)
    assert sum(per_param(2, d).values()) == pytest.approx(2 + 16 / d)


def test_defaults_keep_the_paper_settings():
    tr = TrainingSettings()
    assert (tr.weight_bytes_per_param, tr.grad_bytes_per_param) == (2, 4)
    for opt in ("adam", "sgd"):
        t = tr.with_(optimizer=opt)
        assert t.optimizer_state_bytes == OPTIMIZER_STATE_BYTES[opt]
        assert t.optimizer_step_bytes == OPTIMIZER_STEP_BYTES[opt]
    assert precision_args(tr) == ["--bf16"]


def test_collectives_move_the_reduce_and_gather_dtypes():
    tr = TrainingSettings().with_precision({"grad_reduce": "bf16"})
    assert bytes_per_param(tr, "grad") == 2 and bytes_per_param(tr, "weight") == 2
    fp8 = tr.with_precision({"compute": "fp8", "fp8_param_gather": True})
    assert bytes_per_param(fp8, "weight") == 1


def test_megatron_rules_are_checked():
    with pytest.raises(SpecError, match="grad_reduce: bf16"):
        precision_from_dict({"main_grads": "bf16"}, "x.yaml")
    with pytest.raises(SpecError, match="precision.exp_avg"):
        precision_from_dict({"exp_avg": "int8"}, "x.yaml")
    with pytest.raises(SpecError, match="needs compute: fp8"):
        precision_from_dict({"fp8_param_gather": True}, "x.yaml")
    with pytest.raises(SpecError, match="no FP8"):
        make_problem("tiny_gpt", "dgx_a100", 8,
                     training=TrainingSettings(precision=Precision(compute="fp8")))


def test_precision_args_use_megatrons_flag_names():
    tr = TrainingSettings().with_precision(
        {"compute": "fp8", "fp8_recipe": "delayed", "grad_reduce": "bf16",
         "main_grads": "bf16", "exp_avg": "bf16", "exp_avg_sq": "fp8"})
    a = precision_args(tr)
    # every flag exists in megatron/training/arguments.py (@ d98e8a6) or is generated from
    # ModelParallelConfig / TransformerConfig fields (bf16, fp8 -> --fp8-format, fp8_recipe)
    known = {"--bf16", "--fp8-format", "--fp8-recipe", "--fp8-param-gather",
             "--grad-reduce-in-bf16", "--use-precision-aware-optimizer", "--main-grads-dtype",
             "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"}
    assert {x for x in a if x.startswith("--")} <= known
    assert a[a.index("--exp-avg-sq-dtype") + 1] == "fp8" and "--use-precision-aware-optimizer" in a


def test_hardware_capacity_is_the_devices_usable_bytes():
    h100, a100 = load_hardware("h100_sxm"), load_hardware("a100_sxm")
    assert h100.hbm_bytes == 85_017_493_504  # profiles/h100_sxm/meta.json total_memory_bytes
    assert a100.hbm_bytes == 81_920 * 2**20  # nvidia-smi 81920 MiB
    assert h100.peak_fp8_flops_per_s == pytest.approx(1978.9e12) and not a100.peak_fp8_flops_per_s
    assert h100.memory_overhead_bytes == 1.5e9 and h100.hbm_source


@pytest.mark.parametrize("name, fits_fp32", [("llama3_8b_h100_bf16_bridge", False),
                                             ("llama3_70b_h100_bf16_bridge", True),
                                             ("llama31_405b_h100_bf16_bridge", False)])
def test_published_h100_bf16_runs_fit_with_their_precision(name, fits_fp32):
    plan, pr = load_plan(EXAMPLES / f"{name}.yaml")
    assert pr.training.precision.grad_reduce == "bf16"
    ev = evaluate(plan, pr)
    assert ev.feasible, ev.reason
    fp32 = pr.with_training(pr.training.with_precision({"grad_reduce": "fp32"}))
    ev32 = evaluate(plan, fp32)
    assert ev32.feasible == fits_fp32
    # the difference is the gradient term: 4 - (2 + 4 / shards) bytes per parameter (ZeRO-1)
    s, s32 = ev.stages[0], ev32.stages[0]
    assert s32.memory_bytes["gradients"] > s.memory_bytes["gradients"]
    assert s32.memory_bytes["optimizer_states"] == pytest.approx(s.memory_bytes["optimizer_states"])


def test_fp8_plan_evaluates_faster_and_exports():
    from nest.interfaces.export import to_megatron

    plan, pr = load_plan(EXAMPLES / "llama3_70b_h100_fp8_bridge.yaml")
    ev = evaluate(plan, pr)
    bf16 = evaluate(plan, pr.with_training(pr.training.with_precision({"compute": "bf16",
                                                                       "fp8_param_gather": False})))
    assert ev.time_per_batch_s < bf16.time_per_batch_s
    v = plan.stage_variant(0)
    srcs = pr.with_variants([v]).costs.times(1, v.key).op_sources
    assert srcs["qkv"] == "profile"  # FP8 GEMMs: measured torch._scaled_mm (matmul_fp8.csv)
    a = to_megatron(plan, pr).args
    assert a[a.index("--fp8-format") + 1] == "hybrid" and "--fp8-param-gather" in a
    # without fp8_param_gather, the FP8 weight + transpose cache is a memory term of its own
    cache = pr.with_training(pr.training.with_precision({"fp8_param_gather": False}))
    mem = evaluate(plan, cache).stages[0].memory_bytes
    # device group 0: 2 B per block parameter, i.e. its BF16 weights less the embedding (V h / tp)
    emb_bytes = 2 * pr.model.vocab_size * pr.model.hidden_size / plan.tp
    assert mem["fp8_weights"] == pytest.approx(mem["weights"] - emb_bytes, rel=1e-3)


def test_interleaved_labels_name_every_chunk_and_device_totals():
    from nest.interfaces.cli import summarize

    plan, pr = load_plan(EXAMPLES / "llama3_70b_h100_fp8_bridge.yaml")
    ev = evaluate(plan, pr.with_hardware(hbm_bytes=40e9))
    assert "pipeline device group 0 (5 chunks: layers 0-2, 17-18, 33-34, 49-50, 65-66" in ev.reason
    text = summarize(plan, ev)
    assert "device group   7: layers 15-16, 31-32, 47-48, 63-64, 80-81" in text
    assert "device totals" in text and "stage  39" not in text
