import pytest

from nest.settings import TrainingSettings


@pytest.fixture
def small_batch():
    """Training settings with a small global batch so tiny problems stay tiny."""
    return TrainingSettings(global_batch=8)
