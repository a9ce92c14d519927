"""Plan x cluster -> pictures and tables: where stages and groups sit, and each stage's memory.

placement_picture: one cell per device (one per node above AGGREGATE_ABOVE devices), cells in rows
of the cluster's innermost levels (a row is one group of the second level, e.g. a rack, or a
slice of it), coloured by pipeline stage; a device cell carries its data-parallel replica number
(devices of one stage with the same number form one tp x cp x ep group; devices of one stage at
the same position in every replica form a data-parallel group). A node cell is split by the share
of its devices on each stage.
memory_table / memory_picture: the evaluation's memory_bytes per stage (weights, gradients,
optimizer states, activations, working, fragmentation, framework overhead), whose sum is the
stage's peak.
"""

from __future__ import annotations

from pathlib import Path

AGGREGATE_ABOVE = 256  # devices: above this a cell is a node
MAX_ROW = 32  # cells per row at most
UNUSED = "#dddddd"
MEMORY_COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer_states": "#c44e52",
                 "activations": "#dd8452", "working": "#8172b3", "fragmentation": "#937860",
                 "framework_overhead": "#8c8c8c"}


def _pyplot():
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    return plt


def check_picture_path(path, option: str) -> None:
    """Before any work: a writable .png / .pdf / .svg (SpecError naming the option otherwise)."""
    from nest.common.atomic_io import check_output
    from nest.common.errors import SpecError

    check_output(path, option)
    if Path(path).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise SpecError(f"{option} {path}: expected a file name ending in .png, .pdf or .svg")


def device_roles(plan) -> dict[int, tuple[int, int, int]]:
    """device id -> (pipeline position, replica, index inside the replica's tp x cp x ep group).
    Interleaved plans: the position is the device group (chunks j, j + p, ... share devices)."""
    roles = {}
    for j, st in enumerate(plan.stages[:plan.pp]):
        v = plan.stage_variant(j)
        width = v.tp * v.ep * v.cp
        for k, dev in enumerate(st.device_ids):
            roles[dev] = (j, k // width, k % width)
    return roles


def _stage_colors(pp: int):
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if pp <= 10 else "tab20" if pp <= 20 else "turbo"]
    if pp <= 20:
        return [cmap(i) for i in range(pp)]
    return [cmap(i / max(pp - 1, 1)) for i in range(pp)]


def _position_label(plan, j: int) -> str:
    """The legend entry of pipeline position j: its stage's layers, or for an interleaved plan
    the device group's chunks (j, j + pp, ...; nest.problem.evaluate.device_chunks), the first
    two and the last when there are more than four."""
    from nest.problem.evaluate import device_chunks

    ch = [f"{a}-{b}" for a, b in device_chunks(plan, j)]
    if plan.schedule != "interleaved":
        return f"stage {j}: layers {ch[0]}"
    shown = ch if len(ch) <= 4 else [*ch[:2], "...", ch[-1]]
    return f"device group {j}: {len(ch)} chunks, layers {', '.join(shown)}"


def _layout(cluster, n: int, unit: int) -> tuple[int, list[tuple[int, str]]]:
    """(cells per row, [(first row, label)] of each second-level group): rows never straddle a
    group of the second level (a rack)."""
    levels = cluster.levels
    group = levels[1].devices_per_group if len(levels) > 1 else n
    group_units = max(min(group, n) // unit, 1)
    row = group_units
    if row > MAX_ROW:  # the largest divisor of the group's size not above MAX_ROW
        node_units = max(levels[0].devices_per_group // unit, 1)
        row = max((r for r in range(1, MAX_ROW + 1) if group_units % r == 0
                   and (r % node_units == 0 or unit > 1)), default=MAX_ROW)
    name = levels[1].name if len(levels) > 1 else "cluster"
    rows_per_group = -(-group_units // row)
    num_units = -(-n // unit)
    groups = [(g * rows_per_group, f"{name} {g}") for g in range(-(-num_units // group_units))]
    return row, groups


def placement_picture(plan, cluster, path=None, title: str = ""):
    """The plan's devices on the cluster (see the module docstring); writes `path` if given and
    returns the figure."""
    from matplotlib.patches import Patch, Rectangle

    plt = _pyplot()
    n = plan.num_devices
    node = cluster.levels[0].devices_per_group
    unit = node if n > AGGREGATE_ABOVE and node > 1 else 1
    row, groups = _layout(cluster, n, unit)
    roles = device_roles(plan)
    colors = _stage_colors(plan.pp)
    num_units = -(-n // unit)
    rows_per_group = groups[1][0] if len(groups) > 1 else -(-num_units // row)
    gap = 0.6  # blank rows between second-level groups
    nrows = -(-num_units // row)
    height = nrows + gap * (len(groups) - 1)
    cell_in = min(max(9.0 / row, 0.25), 0.8)  # inches per cell
    fig, ax = plt.subplots(figsize=(row * cell_in + 4.5, min(height * cell_in + 1.8, 30)))
    label_cells = unit == 1 and n <= 256
    label_size = min(8.0, 14 * cell_in)

    def origin(u: int) -> tuple[float, float]:
        r = u // row
        return u % row, r + gap * (r // rows_per_group)

    for u in range(num_units):
        x, y = origin(u)
        devs = range(u * unit, min((u + 1) * unit, n))
        on = [roles[d][0] for d in devs if d in roles]
        if unit == 1:
            c = colors[on[0]] if on else UNUSED
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=c, edgecolor="white", linewidth=0.8))
            if label_cells and on:
                j, rep, k = roles[u]
                ax.text(x + 0.5, y + 0.5, f"r{rep}" + (f".{k}" if plan.width > 1 else ""),
                        ha="center", va="center", fontsize=label_size)
        else:  # a node: slices by the share of its devices on each stage (unused last)
            shares = {j: on.count(j) for j in dict.fromkeys(on)}
            left = x
            for j, cnt in [*shares.items(), (None, len(devs) - len(on))]:
                if cnt:
                    w = cnt / len(devs)
                    ax.add_patch(Rectangle((left, y), w, 1, linewidth=0,
                                           facecolor=UNUSED if j is None else colors[j]))
                    left += w
            ax.add_patch(Rectangle((x, y), 1, 1, fill=False, edgecolor="black", linewidth=0.6))
    if unit == 1 and node > 1:  # node outlines, one per row a node covers (NVL72: 72 > a row)
        for u0 in range(0, num_units, node):
            u, end = u0, min(u0 + node, num_units)
            while u < end:
                x, y = origin(u)
                w = min(end - u, row - x)
                ax.add_patch(Rectangle((x, y), w, 1, fill=False, edgecolor="black",
                                       linewidth=1.0))
                u += w
    for first_row, label in groups:
        y = first_row + gap * (first_row // rows_per_group)
        ax.text(-0.3, y + 0.5, label, ha="right", va="center", fontsize=7)
    ax.set_xlim(-0.1, row + 0.1)
    ax.set_ylim(height + 0.1, -0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    what = ("one cell per device (black outline: a node), label r<replica>.<index in its "
            "tp x cp x ep group>" if unit == 1 else
            f"one cell per {cluster.levels[0].name} of {node} devices, split by stage")
    ax.set_title(title or f"{plan.planner}: {plan.model} on {plan.cluster}, {n} devices, "
                 f"pp={plan.pp} dp={plan.dp} tp={plan.tp} ep={plan.ep} cp={plan.cp} "
                 f"({plan.placement})\n{what}", fontsize=8, parse_math=False)
    step = max(1, -(-plan.pp // 16))  # at most ~16 legend entries
    handles = [Patch(color=colors[j], label=_position_label(plan, j))
               for j in range(0, plan.pp, step)]
    if len(roles) < n:
        handles.append(Patch(color=UNUSED, label="unused"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False)
    _save(fig, path)
    return fig


def _save(fig, path) -> None:
    """Write the figure atomically (a temporary file in the same folder, then a rename), with
    deterministic bytes (no software or date stamps)."""
    if path is None:
        return
    from nest.common.atomic_io import savefig_atomic

    fig.tight_layout()
    fmt = Path(path).suffix.lower().lstrip(".")
    meta = {"Software": None} if fmt == "png" else ({"CreationDate": None, "Producer": None}
                                                    if fmt == "pdf" else {"Date": None})
    savefig_atomic(fig, path, dpi=120, metadata=meta)


def memory_rows(plan, ev) -> list[tuple[str, dict[str, float], float]]:
    """(label, memory_bytes, peak) per stage; interleaved plans: per device group (totals)."""
    n = plan.pp if plan.schedule == "interleaved" else len(ev.stages)
    name = "device group" if plan.schedule == "interleaved" else "stage"
    return [(f"{name} {r.index}", r.memory_bytes, r.peak_memory_bytes) for r in ev.stages[:n]]


def memory_table(plan, ev, hbm_bytes: float) -> str:
    """Per stage, each memory term in GB, the peak and its share of HBM."""
    rows = memory_rows(plan, ev)
    keys = list(MEMORY_COLORS) + sorted({k for _, m, _ in rows for k in m} - set(MEMORY_COLORS))
    short = {"optimizer_states": "optimizer", "framework_overhead": "framework",
             "fragmentation": "fragment."}
    head = ["", *[short.get(k, k) for k in keys], "peak", "% HBM"]
    body = [[lab, *[f"{m.get(k, 0.0) / 1e9:.3f}" for k in keys], f"{peak / 1e9:.3f}",
             f"{peak / hbm_bytes:.1%}"] for lab, m, peak in rows]
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    fmt = [lambda c, w: c.ljust(w)] + [lambda c, w: c.rjust(w)] * (len(head) - 1)
    lines = [f"memory per {'device' if plan.schedule == 'interleaved' else 'stage'} (GB; "
             f"HBM {hbm_bytes / 1e9:.2f} GB):"]
    lines += ["  " + "  ".join(f(c, w) for f, c, w in zip(fmt, r, widths)) for r in (head, *body)]
    return "\n".join(lines)


def _net_step(m: dict) -> dict:
    """A record with the optimizer step's copy net of what of it fits in the freed activations
    (nest.costs.memory.with_overheads: step_reuse <= 0), so that every bar is non-negative."""
    from nest.costs.memory import REUSE_KEY, STEP_KEY

    if REUSE_KEY not in m:
        return m
    out = {k: x for k, x in m.items() if k != REUSE_KEY}
    out[STEP_KEY] = m[STEP_KEY] + m[REUSE_KEY]
    return out


def memory_picture(plan, ev, hbm_bytes: float, path=None):
    """Stacked bars of memory_bytes per stage, the HBM capacity as a line."""
    plt = _pyplot()
    rows = [(lab, _net_step(m), pk) for lab, m, pk in memory_rows(plan, ev)]
    fig, ax = plt.subplots(figsize=(min(max(7.5, 3.5 + 0.3 * len(rows)), 16), 4.5))
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    keys = list(MEMORY_COLORS) + sorted({k for _, m, _ in rows for k in m} - set(MEMORY_COLORS))
    for k in keys:
        vals = [m.get(k, 0.0) / 1e9 for _, m, _ in rows]
        if any(vals):
            ax.bar(x, vals, bottom=bottom, color=MEMORY_COLORS.get(k), label=k.replace("_", " "),
                   width=0.8)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(hbm_bytes / 1e9, color="black", linestyle="--", linewidth=1, label="HBM")
    step = max(1, len(rows) // 32)
    ax.set_xticks(list(x)[::step], [lab.split()[-1] for lab, _, _ in rows][::step], fontsize=7)
    ax.set_xlabel("device group" if plan.schedule == "interleaved" else "pipeline stage")
    ax.set_ylabel("GB per device")
    ax.set_title(f"{plan.planner}: {plan.model} on {plan.cluster}\nmemory per device "
                 f"(peak = the stack; HBM {hbm_bytes / 1e9:.1f} GB dashed)", fontsize=8,
                 parse_math=False)  # a plan's names are text
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _save(fig, path)
    return fig
