"""Print the generated part of the README's trust section ("How far to trust the numbers") from
a run of `nest validate --published` (nest.fidelity.published_runs.run, the current code and table), so every
number there comes from the run: `python scripts/readme_trust.py > section.md`, then paste it
between the README's `<!-- trust:begin -->` and `<!-- trust:end -->` markers.
tests/test_published_table.py checks the pasted errors against config/validation/residuals.yaml
(written by the same run)."""

from __future__ import annotations

import sys

from nest.fidelity.published_runs import RowResult, row_class, run, summary

BEGIN, END = "<!-- trust:begin -->", "<!-- trust:end -->"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _abs(x: float) -> str:
    return f"{100 * x:.1f}%"


def _row(r: RowResult) -> str:
    w = r.row
    hw = row_class(w).split("/")[0].split("_")[0].upper()
    par = "/".join(str(w.get(k, 1)) for k in ("tp", "pp", "dp", "cp", "ep"))
    band = w.get("band") or {}  # {key: values} or a list of alternative settings
    vals = (band.get("virtual_stages") if isinstance(band, dict)
            else [b.get("virtual_stages", 1) for b in band])
    v = f" ({{{', '.join(map(str, vals))}}})" if vals else (
        f" ({w['virtual_stages']})" if w.get("virtual_stages", 1) > 1 else "")
    pred = (f"{r.predicted_lo_s:.3f}-{r.predicted_hi_s:.3f} band" if r.band
            else f"{r.predicted_s:.3f}") + ("" if r.feasible else " (OOM)")
    return (f"| {r.id} | {w['num_devices']} {hw} | {par}{v} | {w['precision']} | "
            f"{r.measured_s:.2f} | {pred} | {_pct(r.error)} |")


def section(results: list[RowResult]) -> str:
    s = summary(results)
    out = [BEGIN,
           "| run | GPUs | tp/pp/dp/cp/ep (vpp) | prec. | measured s | predicted s | error |",
           "|---|---|---|---|---|---|---|"]
    out += [_row(r) for r in results]
    out += ["", f"Mean |error| {_abs(s['mean_abs'])}, max {_abs(s['max_abs'])} over the "
                f"{s['n']} runs; runs predicted out of memory: {s['n_oom']}.", "",
            "| class | runs | mean abs. error | max abs. error | mean signed | signed range |",
            "|---|---|---|---|---|---|"]
    for name, st in list(s["kinds"].items()) + list(s["classes"].items()):
        out.append(f"| {name} | {st['n']} | {_abs(st['mean_abs'])} | {_abs(st['max_abs'])} | "
                   f"{_pct(st['mean_signed'])} | {_pct(st['min_signed'])} .. "
                   f"{_pct(st['max_signed'])} |")
    bands = [r for r in results if r.band]
    if bands:
        out += ["", "Band ends (predicted / measured - 1 at each end of the band): "
                + "; ".join(f"{r.id} {_pct(r.error_ends[0])} / {_pct(r.error_ends[1])}"
                            for r in bands) + "."]
    out.append(END)
    return "\n".join(out)


def main() -> int:
    sys.stdout.write(section(run()) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
