"""The tiny pipeline in a scratch copy of the workflow (tests/conftest.py's `tiny_run` fixture,
test_expected.py, test_interrupt.py): `snakemake figures --configfile config/tiny.yaml`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
TINY = ["figures", "--configfile", "config/tiny.yaml", "-j2", "--quiet"]


def copy_workflow(dst: Path) -> None:
    """Snakefile, workflow/ and config/ of this clone into dst (a run's working directory)."""
    for name in ("Snakefile", "workflow", "config"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name)


def snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SNAKEMAKE), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, check=False)
