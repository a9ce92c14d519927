"""Table 4: search time of NEST vs the Mist-style planner, each solve alone in a fresh process.

The paper (appendix C.1.2, Table 4) reports minutes per model for NEST and Mist. We time each
planner's whole search (`run_planner`'s solve_time_s: the planner's own call, graph building and
scoring excluded) in a fresh Python process, one solve at a time, so no other job shares the
cores and no cache from an earlier solve helps. The search-space size is what each planner
reports: NEST the (variant, p, d) candidates it visited out of all, Mist the (variant, p, d)
MILPs it solved out of all. Wall-clock times depend on the machine: this is the one output of
the default run whose numbers are not reproducible byte for byte (the CSV says so in a column).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from nest.spec.catalog import read_yaml

CHILD = """
import json, resource, sys
from nest.problem.evaluate import make_problem
from nest.planners.registry import run_planner
model, cluster, n, planner = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
out = run_planner(planner, make_problem(model, cluster, n))
p = out.plan
print(json.dumps({"solve_time_s": out.solve_time_s, "status": out.status,
                  "notes": p.notes if p else out.reason,
                  "time_per_batch_s": out.evaluation.time_per_batch_s if p else None,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}))
"""


def space_size(planner: str, notes: str) -> str:
    """'visited / total' from a planner's notes (NEST: candidates, Mist: MILPs)."""
    m = re.search(r"visited (\d+) of (\d+)", notes) or re.search(r"solved (\d+) of (\d+)", notes)
    return f"{m.group(1)}/{m.group(2)}" if m else ""


def measure(model: str, cluster: str, num_devices: int, planner: str) -> dict:
    """One solve in a fresh process (cold caches, nothing else running in it)."""
    r = subprocess.run([sys.executable, "-c", CHILD, model, cluster, str(num_devices), planner],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"timing {planner} on {model}: exit {r.returncode}: "
                           f"{r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"model": model, "cluster": cluster, "num_devices": num_devices, "planner": planner,
            "status": out["status"], "solve_time_s": out["solve_time_s"],
            "peak_rss_mb": out["peak_rss_mb"], "time_per_batch_s": out["time_per_batch_s"],
            "space_visited": space_size(planner, out["notes"])}


def paper_table4(claims_path: str | Path) -> dict:
    """{model: {planner: minutes}} of the paper's Table 4 (config/paper/claims.yaml)."""
    return read_yaml(claims_path).get("table4", {}).get("minutes", {})


def table(rows: list[dict], claims_path: str | Path) -> pd.DataFrame:
    paper = paper_table4(claims_path)
    df = pd.DataFrame(rows)
    df["paper_minutes"] = [paper.get(r.model, {}).get(r.planner) for r in df.itertuples()]
    df["machine_dependent"] = True
    return df.sort_values(["model", "planner"], kind="stable").reset_index(drop=True)


def markdown(df: pd.DataFrame) -> str:
    lines = ["# Table 4: search time, NEST vs the Mist-style planner", "",
             f"Each solve alone in a fresh process on {df.num_devices.iloc[0]} devices of "
             f"{df.cluster.iloc[0]} (wall-clock: machine-dependent).", "",
             "| model | planner | ours (s) | paper (min) | space visited | peak RSS (MB) |",
             "|---|---|---|---|---|---|"]
    for r in df.itertuples():
        paper = "-" if pd.isna(r.paper_minutes) else f"{r.paper_minutes:g}"
        lines.append(f"| {r.model} | {r.planner} | {r.solve_time_s:.1f} | {paper} | "
                     f"{r.space_visited} | {r.peak_rss_mb:.0f} |")
    return "\n".join(lines) + "\n"
