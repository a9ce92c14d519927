"""The package's version (importlib.metadata) and, from a git checkout, its commit."""

from __future__ import annotations

import subprocess
from pathlib import Path


def version() -> str:
    """"nest-harness 0.1.0 (git 0208858, modified)"; the commit only where git answers at once."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        v = dist_version("nest-harness")
    except PackageNotFoundError:
        v = "unknown (not installed)"
    return f"nest-harness {v}{_git()}"


def _git() -> str:
    here = Path(__file__).resolve().parent.parent.parent
    if not (here / ".git").exists():
        return ""
    try:
        def git(*args):
            return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True,
                                  timeout=2, check=True).stdout.strip()

        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return ""
    return f" (git {commit}{', modified' if dirty else ''})" if commit else ""
