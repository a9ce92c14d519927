"""config/training.yaml -> TrainingSettings (global batch, optimizer, precision, schedule)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from nest.specs import config_dir, read_yaml, validate

# Bytes of optimizer state per parameter: mixed-precision Adam keeps fp32 master weights,
# momentum and variance (Rajbhandari et al. 2020, ZeRO, section 3.1: K = 12); SGD with momentum
# keeps fp32 master weights and momentum (8).
OPTIMIZER_STATE_BYTES = {"adam": 12, "sgd": 8}
# HBM bytes touched per parameter by one optimizer step (Megatron-LM with fp32 main gradients):
# fused Adam reads fp32 param, grad, m, v and writes param, m, v (7 x 4 = 28), the fp32 -> bf16
# weight copy reads 4 and writes 2 (6), zeroing the main gradient writes 4: 38 bytes. SGD with
# momentum: reads param, grad, momentum, writes param, momentum (20) + 6 + 4 = 30. Measured on an
# H100 block (profiles/h100_sxm/validation.md): PyTorch's Adam moves ~40 B/param.
OPTIMIZER_STEP_BYTES = {"adam": 38, "sgd": 30}


@dataclass(frozen=True)
class TrainingSettings:
    global_batch: int = 4096
    optimizer: str = "adam"
    weight_bytes_per_param: int = 2
    grad_bytes_per_param: int = 4
    schedule: str = "1f1b"
    graph_source: str = "torch_fx"  # how layer graphs are built: torch_fx | closed_form
    # how the evaluator prices the pipeline (nest.evaluate.pipeline_time_s): "paper" (m + p - 1)
    # max_j t_j, what the NEST solver optimises exactly; "critical_path" the tight closed form
    # (nest.schedule), "simulated" the discrete-event simulation (nest.simulate)
    pipeline_time: str = "paper"
    # data-parallel gradient sync vs the last backward (nest.schedule.dp_sync_tail_s): "none"
    # (the paper's: after the flush), "stage" (after the stage's own last backward), "bucketed"
    # (also overlapping it, in buckets of dp_bucket_params parameters; Megatron-LM's default
    # bucket is 40 M parameters, PyTorch DDP's 25 MiB)
    dp_overlap: str = "none"
    dp_bucket_params: int = 40_000_000

    @property
    def optimizer_state_bytes(self) -> int:
        return OPTIMIZER_STATE_BYTES[self.optimizer]

    @property
    def optimizer_step_bytes(self) -> int:
        return OPTIMIZER_STEP_BYTES[self.optimizer]

    def with_(self, **kw) -> "TrainingSettings":
        return replace(self, **kw)


def load_training(path=None) -> TrainingSettings:
    path = path or config_dir() / "training.yaml"
    d = read_yaml(path)
    validate(d, "training", str(path))
    return TrainingSettings(**d)
