"""A rank map -> the launch environment and a torchrun / SLURM launch that starts exactly its ranks.

Environment (Megatron-LM megatron/training/arguments.py, validate_args, read at d98e8a64):
    CUDA_DEVICE_MAX_CONNECTIONS=1   asserted whenever tp > 1 or cp > 1 without FSDP on compute
                                    capability < 10 (Ampere, Hopper): one hardware queue keeps
                                    the tensor-parallel communication kernels ordered before the
                                    GEMMs they overlap with. Harmless on Blackwell (not asserted).
    (unset)                         with Megatron-FSDP (--use-megatron-fsdp), which asserts that it
                                    is NOT 1; the launch then unsets it explicitly.

Processes. torchrun (static rendezvous: --node-rank, --master-addr) gives the agent with node
rank n the global ranks base_n .. base_n + k_n - 1 (base_n = k_0 + ... + k_{n-1}, k_n its
--nproc-per-node; torch.distributed.elastic assigns contiguous blocks also when the k_n differ).
So the rank map's ranks, in rank order, are cut into maximal runs on one cluster node; run n is
agent n, started on that node with k_n processes. Every node holds one run (else the map is not
launchable: nest.interfaces.export re-scores the nearest launchable order). World size = sum k_n exactly:
63 ranks on 8-GPU nodes are 7 agents of 8 and one of 7, never 64 processes.
A rank's device: Megatron-LM binds local rank i to cuda:i; CUDA_VISIBLE_DEVICES lists the node's
devices in rank order, so local rank i lands on the i-th device the rank map gives that node.

Script text (issue 22: a plan is a shared file, and whoever runs its export runs what it holds).
Every string that reaches a generated file passes check_text (no control or line-separating
character: a newline, U+0085, U+2028 ... would start a new command line or cut the #SBATCH block
off); every argument is shlex-quoted; a comment carries user text only through `comment`, which
keeps printable ASCII and writes anything else as a \\uXXXX escape; the SLURM job name is
job_name's [A-Za-z0-9._-] (every scheduler accepts it).
"""

from __future__ import annotations

import re
import shlex
import unicodedata

from nest.common.errors import SpecError

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}\Z")  # catalog / registry names
MAX_TEXT = 1024  # characters of one string in a script (a path, a name, an argument)


def check_text(value: object, what: str) -> str:
    """`value` as a string that may appear in a script: SpecError naming `what` if it holds a
    control, format or line / paragraph separator character, or is longer than MAX_TEXT."""
    s = str(value)
    if len(s) > MAX_TEXT:
        raise SpecError(f"{what}: {len(s)} characters; expected at most {MAX_TEXT}")
    bad = next((c for c in s if unicodedata.category(c)[0] in "CZ" and c != " "), None)
    if bad is not None:
        raise SpecError(f"{what}: {_escape(s)[:120]!r} holds the character "
                        f"{_escape(bad)} ({unicodedata.category(bad)}); expected printable text "
                        f"without control characters or line separators")
    return s


def check_name(value: object, what: str) -> str:
    """A name (planner, catalog entry): SAFE_NAME, or SpecError naming `what`."""
    s = check_text(value, what)
    if not SAFE_NAME.match(s):
        raise SpecError(f"{what}: {s[:120]!r} is not a name; expected letters, digits and "
                        f"'._+-' (at most 128, starting with a letter or digit)")
    return s


def _escape(s: str) -> str:
    return "".join(c if " " <= c <= "~" else f"\\u{ord(c):04x}" for c in s)


def comment(text: str, limit: int = 400) -> str:
    """A bash comment line holding `text` inertly: printable ASCII only (anything else escaped),
    at most `limit` characters."""
    s = _escape(str(text))
    return "# " + (s if len(s) <= limit else s[:limit - 3] + "...")


def job_name(text: str) -> str:
    """A SLURM job name any scheduler accepts: [A-Za-z0-9._-], at most 64 characters."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "nest"
    return s[:64]


def launch_env(tp: int, cp: int, megatron_fsdp: bool) -> dict[str, str]:
    """The environment Megatron-LM's validate_args requires for these degrees (docstring)."""
    if megatron_fsdp:
        return {}
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if tp > 1 or cp > 1 else {}


def node_runs(rank_map: list[dict]) -> list[tuple[int, list[dict]]]:
    """(cluster node, its ranks in rank order) for each maximal run of consecutive ranks on one
    node, in rank order: torchrun's agents (docstring)."""
    runs: list[tuple[int, list[dict]]] = []
    for r in sorted(rank_map, key=lambda r: r["rank"]):
        if runs and runs[-1][0] == r["node"]:
            runs[-1][1].append(r)
        else:
            runs.append((r["node"], [r]))
    return runs


def identity_devices(rank_map: list[dict], devices_per_node: int) -> bool:
    """Local rank i of every agent is the node's device i (no CUDA_VISIBLE_DEVICES needed)."""
    return all(r["local_rank"] == i for _, rs in node_runs(rank_map) for i, r in enumerate(rs))


def _pairs(args: list[str]) -> list[str]:
    """One `--flag value` (or `--flag`) per line, every word checked and shlex-quoted."""
    words = [shlex.quote(check_text(a, f"argument {i + 1}")) for i, a in enumerate(args)]
    out, i = [], 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            out.append(words[i])
            i += 1
    return out


DATA_ARGS = ["--mock-data", "--tokenizer-type", "NullTokenizer"]
TRAIN_ARGS = ["--train-iters", "100", "--lr", "1.0e-4", "--min-lr", "1.0e-5",
              "--lr-decay-style", "cosine", "--lr-warmup-iters", "10", "--weight-decay", "0.1",
              "--clip-grad", "1.0", "--eval-iters", "0", "--log-interval", "1",
              "--save", "checkpoints", "--load", "checkpoints", "--save-interval", "50"]
# The variables a user sets (README, "Launch template"); launch.sh documents each in a comment.
VARIABLES = (
    ("MEGATRON_LM", "the Megatron-LM checkout whose pretrain_gpt.py runs (default: .)"),
    ("DATA_ARGS", "data and tokenizer; default mock data. E.g. '--data-path /data/tok_text_document "
                  "--split 99,1,0 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "
                  "/models/tokenizer'"),
    ("TRAIN_ARGS", "iterations, learning-rate schedule with warmup, checkpoint save / load / "
                   "interval; default a 100-iteration run saving to ./checkpoints"),
    ("NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_GID_INDEX", "the network interfaces and "
     "InfiniBand / RoCE adapters NCCL uses; unset: NCCL's own detection (set them for RoCE)"),
)


def torchrun_script(args: list[str], script: str, env: dict[str, str], rank_map: list[dict],
                    devices_per_node: int, *, unset: tuple[str, ...] = ()) -> str:
    """The bash lines that start exactly the rank map's ranks on this node ($NODE_RANK = the
    torchrun agent, $MASTER_ADDR = agent 0's host); DATA_ARGS / TRAIN_ARGS default to mock data
    and a short run and may be replaced from the environment."""
    runs = node_runs(rank_map)
    sizes = [len(rs) for _, rs in runs]
    lines = [f"# {len(rank_map)} ranks: {len(runs)} torchrun agents (NODE_RANK 0..{len(runs) - 1})"]
    lines += ["# variables (set them in the environment; README, Launch template):"]
    lines += [comment(f"  {k}: {what}") for k, what in VARIABLES]
    hosts = [n for n, _ in runs]
    if hosts != list(range(len(runs))):
        lines.append("# agent NODE_RANK=i runs on cluster node NODES[i] (rank_map.csv)")
    lines.append(f"NODES=({' '.join(map(str, hosts))})")
    for k in [*env, *unset]:
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", k), k  # launch_env's own names
    lines += [f"export {k}={shlex.quote(check_text(v, k))}" for k, v in env.items()]
    lines += [f"unset {k}" for k in unset]
    if len(set(sizes)) == 1:
        nproc = str(sizes[0])
    else:
        lines.append(f"NPROC=({' '.join(map(str, sizes))})  # processes of agent NODE_RANK")
        nproc = "${NPROC[$NODE_RANK]}"
    if not identity_devices(rank_map, devices_per_node):
        vis = [",".join(str(r["local_rank"]) for r in rs) for _, rs in runs]
        lines.append("VISIBLE=(" + " ".join(f'"{v}"' for v in vis) + ")  # local rank i -> "
                     "device VISIBLE[NODE_RANK][i]")
        lines.append('export CUDA_VISIBLE_DEVICES="${VISIBLE[$NODE_RANK]}"')
    lines.append('cd "${MEGATRON_LM:-.}"')
    lines.append(f"DATA_ARGS=${{DATA_ARGS:-{' '.join(DATA_ARGS)}}}")
    lines.append(f"TRAIN_ARGS=${{TRAIN_ARGS:-{' '.join(TRAIN_ARGS)}}}")
    lines.append(f"torchrun --nnodes {len(runs)} --nproc-per-node {nproc} --node-rank "
                 f"\"${{NODE_RANK:?}}\" --master-addr \"${{MASTER_ADDR:?}}\" --master-port "
                 f"\"${{MASTER_PORT:-6000}}\" \\")
    lines.append(f"    {shlex.quote(check_text(script, 'entry point'))} \\")
    lines += [f"    {p} \\" for p in _pairs(args)]
    lines.append("    $DATA_ARGS $TRAIN_ARGS")
    return "\n".join(lines)


def slurm_script(num_agents: int, devices_per_node: int, job: str) -> str:
    """An sbatch file beside launch.sh: one task per node runs launch.sh with NODE_RANK =
    SLURM_NODEID (a non-identity NODES list needs the job's nodes in that order: --nodelist).
    Partition and account go on the command line (sbatch -p PARTITION -A ACCOUNT slurm.sbatch
    overrides the #SBATCH lines, as does -t for the 4-hour default time); a container (pyxis /
    enroot) comes from CONTAINER_IMAGE and CONTAINER_MOUNTS in sbatch's environment."""
    return "\n".join([
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={job_name(job)}",
        f"#SBATCH --nodes={num_agents}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={devices_per_node}",
        "#SBATCH --exclusive",
        "#SBATCH --time=04:00:00",
        "set -euo pipefail",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'srun --ntasks-per-node=1 ${CONTAINER_IMAGE:+--container-image="$CONTAINER_IMAGE"} '
        '${CONTAINER_MOUNTS:+--container-mounts="$CONTAINER_MOUNTS"} '
        "bash -c 'NODE_RANK=$SLURM_NODEID exec bash "
        '"$SLURM_SUBMIT_DIR/launch.sh"\'',
    ]) + "\n"
