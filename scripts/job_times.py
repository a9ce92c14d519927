"""Per-experiment job time of a Snakemake run, from its log (.snakemake/log/<run>.log).

    python scripts/job_times.py [.snakemake/log/<run>.log]
    python scripts/job_times.py --cpu [logs]

A job's time is from its start stamp to its "Finished job" stamp (wall-clock, under whatever
else ran beside it); --cpu instead sums the CPU seconds each job's log ends with ("job CPU",
workflow/scripts/_job.py), per folder of logs/ (about one per rule), which load does not
inflate.

Jobs are grouped by what they make: the figure of a plan (from the config's
figure grids and the decomposition's planners), or the rule name.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$")


def parse(path: Path):
    start, rule_of, out_of, done = {}, {}, {}, {}
    stamp = rule = None
    for line in path.read_text().splitlines():
        m = STAMP.match(line.strip())
        if m:
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
            continue
        s = line.strip()
        if s.startswith(("localrule ", "rule ")):
            rule = s.split()[1].rstrip(":")
        elif s.startswith("output:") and rule:
            out = s.split(":", 1)[1].strip()
        elif s.startswith("jobid:") and rule:
            j = int(s.split()[1])
            start[j], rule_of[j], out_of[j] = stamp, rule, out
            rule = None
        elif s.startswith("Finished job"):
            done[int(re.findall(r"\d+", s)[0])] = stamp
    return {j: (rule_of[j], out_of[j], (done[j] - start[j]).total_seconds())
            for j in done if j in start}


def group(rule: str, out: str) -> str:
    if rule == "plan" or rule.startswith("plan_"):  # one planner, or every planner of a point
        parts = out.split(",")[0].split("/")  # results/plans/<planner>/<model>/<cluster>/<n>/mbs
        planner, cluster, n, mbs = parts[2], parts[4], parts[5], parts[6].split(".")[0]
        if planner.startswith("nest_"):
            return "decomposition"
        if mbs != "mbs1":
            return f"mbs sweep ({cluster} {n})"
        return f"plans {cluster}"
    return rule


CPU = re.compile(r"^job CPU ([0-9.]+) s$", re.M)


def cpu_by_folder(logs: Path) -> dict[str, list[float]]:
    """CPU seconds of every job log under `logs`, by the log's first folder (or its name)."""
    out: dict[str, list[float]] = defaultdict(list)
    for f in sorted(logs.rglob("*.log")):
        m = CPU.findall(f.read_text(errors="replace"))
        if m:
            rel = f.relative_to(logs).parts
            out[rel[0] if len(rel) > 1 else rel[0].removesuffix(".log")].append(float(m[-1]))
    return out


def main() -> None:
    if sys.argv[1:2] == ["--cpu"]:
        tot = cpu_by_folder(Path(sys.argv[2] if len(sys.argv) > 2 else "logs"))
        every = sum(map(sum, tot.values()))
        print(f"{sum(map(len, tot.values()))} job logs, {every:.0f} CPU s in all")
        for k, v in sorted(tot.items(), key=lambda kv: -sum(kv[1])):
            print(f"{k:32s} jobs={len(v):4d} cpu-seconds={sum(v):8.1f} max={max(v):7.1f}")
        return
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else max(
        Path(".snakemake/log").glob("*.log"), key=lambda p: p.stat().st_mtime)
    jobs = parse(path)
    tot: dict[str, list[float]] = defaultdict(list)
    for rule, out, dt in jobs.values():
        tot[group(rule, out)].append(dt)
    print(f"{path}: {len(jobs)} jobs")
    for k, v in sorted(tot.items(), key=lambda kv: -sum(kv[1])):
        print(f"{k:32s} jobs={len(v):4d} job-seconds={sum(v):8.0f} max={max(v):6.0f}")


if __name__ == "__main__":
    main()
