"""config/training.yaml -> TrainingSettings (global batch, optimizer, precision, schedule)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from nest.specs import config_dir, read_yaml, validate

# Bytes of optimizer state per parameter: mixed-precision Adam keeps fp32 master weights,
# momentum and variance (Rajbhandari et al. 2020, ZeRO, section 3.1: K = 12); SGD with momentum
# keeps fp32 master weights and momentum (8).
OPTIMIZER_STATE_BYTES = {"adam": 12, "sgd": 8}
# HBM bytes touched per parameter by one optimizer step: Adam reads fp32 param, grad, m, v and
# writes param, m, v plus the bf16 copy (4*4 + 3*4 + 2 = 30); SGD+momentum reads param, grad,
# momentum and writes param, momentum, bf16 copy (3*4 + 2*4 + 2 = 22).
OPTIMIZER_STEP_BYTES = {"adam": 30, "sgd": 22}


@dataclass(frozen=True)
class TrainingSettings:
    global_batch: int = 4096
    optimizer: str = "adam"
    weight_bytes_per_param: int = 2
    grad_bytes_per_param: int = 4
    schedule: str = "1f1b"

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
