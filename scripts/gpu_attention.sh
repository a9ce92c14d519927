#!/usr/bin/env bash
# One-shot GPU measurement of attention only: scaled_dot_product_attention with PyTorch's DEFAULT
# backend (attention_default.csv; the implementation PyTorch picked is in its `backend` column),
# and, in the same process for comparison, the same shapes with the flash backend forced
# (attention_flash.csv, the method of the committed attention.csv).
#
# Run on the GPU machine from the repository root:   bash scripts/gpu_attention.sh
# Needs python3 with torch (CUDA); nothing else from the project (nest/__init__.py is bypassed
# through a shim, as in scripts/gpu_profile.sh). Shapes and timer settings are those of the full
# profile sweep (nest.profiling.gpu_run.SWEEPS["full"]: the five paper models, mbs 1, t and c in
# {1, 2, 4, 8}; 80 attention shapes). Takes ~15 s of GPU work; hard limit NEST_ATTN_TIMEOUT_S
# (default 150 s). NEST_ATTN_CPU_DRY_RUN=1 checks the script on a CPU with tiny shapes.
# Writes into $OUT/<hardware>/ (OUT defaults to ./gpu_out; <hardware> from the device name, so an
# H200 is never filed as h100_sxm): attention_default.csv, attention_flash.csv,
# attention_meta.json (device, software, date, timing method, backends picked), run.log.
# Copy attention_default.csv into profiles/<hardware>/ to use it.
set -u
REPO=$(pwd)
OUT=${OUT:-$REPO/gpu_out}
PY=${PYTHON:-python3}
LIMIT_S=${NEST_ATTN_TIMEOUT_S:-150}
export PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/nest_attn.XXXXXX)
SHIM=$(mktemp -d /tmp/nest_shim.XXXXXX)

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv \
    || echo "nvidia-smi not available"

mkdir -p "$SHIM/nest"
echo '"""shim"""' > "$SHIM/nest/__init__.py"
ln -s "$REPO/nest/profiling" "$SHIM/nest/profiling"

echo "== attention timing (limit ${LIMIT_S} s)"
(cd "$SHIM" && timeout -s INT "$LIMIT_S" "$PY" - "$WORK" <<'EOF'
import collections, json, os, sys, time
import torch
from nest.profiling import operators as ops
from nest.profiling.gpu_run import SWEEPS, build_shapes
from nest.profiling.shapes import PAPER_MODELS, TINY_MODELS
from nest.profiling.timing import Timer, device_meta, gpu_state, hardware_name, pick_device

t0 = time.monotonic()
work = sys.argv[1]
device = pick_device()
dry = os.environ.get("NEST_ATTN_CPU_DRY_RUN") == "1"  # CPU check of this script, tiny shapes
if device != "cuda" and not dry:
    sys.exit("no CUDA device: this script measures GPU attention only")
meta = device_meta(device)
hw = hardware_name(meta["device_name"]) if device == "cuda" else "cpu"
out = os.path.join(work, hw)
os.makedirs(out, exist_ok=True)
print(f"device {meta['device_name']} -> {hw} | torch {meta['torch']} | cuda {meta['cuda']} | "
      f"cudnn {meta['cudnn']} | driver {meta.get('driver_version')}", flush=True)
sweep = SWEEPS["tiny" if dry else "full"]
timer = Timer(device, **sweep["timer"])
models = TINY_MODELS if dry else PAPER_MODELS
shapes = [s for s in build_shapes(models, sweep) if s["family"] == "attention"]
print(f"{len(shapes)} attention shapes", flush=True)
meta.update({"schema": "nest.attention_meta/v1", "hardware": hw,
             "sweep": "tiny" if dry else "full",
             "timer": sweep["timer"], "timing_method": timer.method,
             "gpu_state_start": gpu_state(),
             "sdpa_flags": {k: getattr(torch.backends.cuda, k)() for k in (
                 "flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled",
                 "cudnn_sdp_enabled") if hasattr(torch.backends.cuda, k)}})
# default backend first (the table this run is for), then flash forced into a side file
summary = ops.profile_operators(shapes, out, device=device, timer=timer,
                                families={"attention_default"}, progress=print)
flash_dir = os.path.join(work, "flash")
summary.update(ops.profile_operators(shapes, flash_dir, device=device, timer=timer,
                                     families={"attention"}, progress=print))
os.replace(os.path.join(flash_dir, "attention.csv"), os.path.join(out, "attention_flash.csv"))
import csv
rd = lambda p: {tuple(r[c] for c in ("b", "s_q", "s_kv", "heads", "kv_heads", "head_dim",
                                      "causal")): r for r in csv.DictReader(open(p))}
dflt = rd(os.path.join(out, "attention_default.csv"))
fl = rd(os.path.join(out, "attention_flash.csv"))
meta["backends_default"] = dict(collections.Counter(r["backend"] for r in dflt.values()))
meta["errors"] = {k: v["errors"] for k, v in summary.items()}
meta["gpu_state_end"] = gpu_state()
meta["elapsed_s"] = time.monotonic() - t0
json.dump(meta, open(os.path.join(out, "attention_meta.json"), "w"), indent=2, default=str)
print("backends picked by default:", meta["backends_default"])
print("shape (s heads kv d causal): default fwd/bwd ms | flash fwd/bwd ms | default backend")
for key in sorted(dflt, key=lambda k: (-int(k[1]) * int(k[3]), k)):
    a, b = dflt[key], fl.get(key, {})
    ms = lambda r, c: f"{float(r[c]) * 1e3:7.3f}" if r.get(c) else "      -"
    if dry or int(key[3]) * int(key[1]) >= 32 * 2048 or key[1] == "512" and key[6] == "0":
        print(f"  {key[1]:>5} {key[3]:>3} {key[4]:>3} {key[5]} {key[6]}: "
              f"{ms(a, 'fwd_time_s')} {ms(a, 'bwd_time_s')} | {ms(b, 'fwd_time_s')} "
              f"{ms(b, 'bwd_time_s')} | {a['backend']} {a['error']}")
print(f"done in {meta['elapsed_s']:.1f} s")
EOF
) 2>&1 | tee "$WORK/run.log"
rc=${PIPESTATUS[0]}
echo "== exit code $rc"
for d in "$WORK"/*/; do
    hw=$(basename "$d")
    [ "$hw" = flash ] && continue
    mkdir -p "$OUT/$hw"
    cp "$WORK/run.log" "$d/run.log"
    cp "$d"/* "$OUT/$hw/"
    ls -l "$OUT/$hw"
done
rm -rf "$SHIM" "$WORK"
exit "$rc"
