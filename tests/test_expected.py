"""A fresh run of the tiny config gives the committed CSVs byte for byte (solve_time_s aside).

The committed expectation results/expected/tiny/ is rewritten by
`snakemake -j2 expected --configfile config/tiny.yaml` when a change is meant to move results.
"""

from pathlib import Path

from nest.experiments.expected import differences, machine_free

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = ROOT / "results" / "expected" / "tiny"


def test_machine_free_drops_only_the_wall_clock(tmp_path):
    a = tmp_path / "a.csv"
    a.write_text("model,solve_time_s,time_per_batch_s\nm,1.5,0.123456789\n")
    b = tmp_path / "b.csv"
    b.write_text("model,solve_time_s,time_per_batch_s\nm,99,0.123456789\n")
    assert machine_free(a) == machine_free(b) == "model,time_per_batch_s\nm,0.123456789\n"
    (tmp_path / "exp.csv").write_text(machine_free(a))
    assert differences(b, tmp_path / "exp.csv") == ""
    b.write_text("model,solve_time_s,time_per_batch_s\nm,99,0.123456788\n")
    assert "0.123456788" in differences(b, tmp_path / "exp.csv")


def test_tiny_run_matches_its_committed_expectation(tiny_run):
    """The session's tiny run (tests/conftest.py), CSV by CSV."""
    expected = sorted(EXPECTED.glob("*.csv"))
    assert expected, f"no committed expectation in {EXPECTED}"
    diffs = [differences(tiny_run / "results" / e.name, e) for e in expected]
    assert not any(diffs), "\n".join(d for d in diffs if d)
