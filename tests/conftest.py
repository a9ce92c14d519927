import pytest

from nest.spec.settings import TrainingSettings


@pytest.fixture
def small_batch():
    """Training settings with a small global batch so tiny problems stay tiny."""
    return TrainingSettings(global_batch=8)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One uninterrupted run of the tiny pipeline (tests/tiny_pipeline.py), made once per session
    and shared: test_expected compares it with results/expected/tiny, test_interrupt with its
    killed and resumed runs. Read-only for its users (copy it to change anything)."""
    from tiny_pipeline import SNAKEMAKE, TINY, copy_workflow, snakemake

    if not SNAKEMAKE.exists():
        pytest.skip("snakemake is not installed beside this Python")
    d = tmp_path_factory.mktemp("tiny_run")
    copy_workflow(d)
    r = snakemake(d, *TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    return d
