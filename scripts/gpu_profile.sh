#!/usr/bin/env bash
# One-shot GPU measurement: operator profiles + single-block validation.
#
# Run on the GPU machine from the repository root:   bash scripts/gpu_profile.sh [--quick]
# Needs python3 with torch (CUDA); nothing else from the project (nest/__init__.py is bypassed
# through a shim, so the rest of the package's dependencies need not be installed there).
# Writes into $OUT/<hardware>/ (OUT defaults to ./gpu_out): profile_<hardware>.tar.gz (all CSVs,
# meta.json, blocks.json, run.log), plus meta.json, blocks.json and run.log beside it.
# Unpack into the repository with:   tar -xzf profile_<hw>.tar.gz -C profiles/
set -u
REPO=$(pwd)
OUT=${OUT:-$REPO/gpu_out}
PY=${PYTHON:-python3}
LIMIT_S=${NEST_PROFILE_TIMEOUT_S:-450}
export PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/nest_prof.XXXXXX)
SHIM=$(mktemp -d /tmp/nest_shim.XXXXXX)

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv \
    || echo "nvidia-smi not available"
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__,
'| cuda', torch.version.cuda, '| cudnn', torch.backends.cudnn.version(), '| gpu',
torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)" || exit 1

# package shim: nest/ with an empty __init__ and the profiling subpackage linked in
mkdir -p "$SHIM/nest"
echo '"""shim"""' > "$SHIM/nest/__init__.py"
ln -s "$REPO/nest/profiling" "$SHIM/nest/profiling"

echo "== profiling (limit ${LIMIT_S} s)"
(cd "$SHIM" && timeout -s INT "$LIMIT_S" "$PY" -m nest.profiling.gpu_run --out "$WORK" "$@") \
    2>&1 | tee "$WORK/run.log"
rc=${PIPESTATUS[0]}
echo "== gpu_run exit code $rc"

for d in "$WORK"/*/; do
    [ -d "$d" ] || continue
    hw=$(basename "$d")
    mkdir -p "$OUT/$hw"
    cp "$WORK/run.log" "$d/run.log"
    tar -czf "$OUT/$hw/profile_$hw.tar.gz" -C "$WORK" "$hw"
    for f in meta.json blocks.json run.log; do [ -f "$d/$f" ] && cp "$d/$f" "$OUT/$hw/"; done
    echo "== summary ($hw)"
    "$PY" - "$d" <<'EOF'
import csv, json, os, sys
d = sys.argv[1]
def rows(f):
    p = os.path.join(d, f)
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
mm = [r for r in rows("matmul.csv") if r["fwd_time_s"]]
mm.sort(key=lambda r: -int(r["m"]) * int(r["n"]) * int(r["k"]))
print("largest GEMMs (m n k: fwd / dgrad / wgrad TFLOP/s)")
for r in mm[:6]:
    m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
    f = 2 * m * n * k
    print(f"  {m:6d} {n:6d} {k:6d}: {f / float(r['fwd_time_s']) / 1e12:6.1f} /"
          f" {f / float(r['bwd_dgrad_time_s']) / 1e12:6.1f} / {f / float(r['bwd_wgrad_time_s']) / 1e12:6.1f}")
for fam in ("attention", "moe", "norm", "elementwise", "embedding", "cross_entropy"):
    rs = rows(fam + ".csv")
    ok = [r for r in rs if r["fwd_time_s"]]
    if ok:
        best = max(float(r["fwd_flops_per_s"] or 0) for r in ok) / 1e12
        bw = max(float(r["fwd_bytes_per_s"] or 0) for r in ok) / 1e12
        print(f"  {fam}: {len(ok)}/{len(rs)} rows, best fwd {best:.1f} TFLOP/s, {bw:.2f} TB/s")
p = os.path.join(d, "blocks.json")
if os.path.exists(p):
    print("blocks (step / fwd / bwd / opt ms, peak GiB, static GiB, activation-saved GiB)")
    for b in json.load(open(p))["blocks"]:
        if "error" in b:
            print(f"  {b['model']}: {b['error']}"); continue
        g = lambda k: (b.get(k) or 0) / 2**30
        print(f"  {b['model']:13s} s={b['seq_len']:5d} {b['time_step_s']*1e3:8.2f} {b['time_fwd_s']*1e3:7.2f}"
              f" {b['time_bwd_s']*1e3:7.2f} {b['time_optimizer_s']*1e3:7.2f}  {g('peak_memory_bytes'):6.2f}"
              f" {g('memory_static_bytes'):6.2f} {g('activation_saved_bytes'):6.2f}")
m = json.load(open(os.path.join(d, "meta.json")))
print("meta:", m.get("device_name"), "| driver", m.get("driver_version"), "| torch", m.get("torch"),
      "| cuda", m.get("cuda"), "| cudnn", m.get("cudnn"), "| elapsed %.0f s" % m.get("elapsed_s", 0),
      "| truncated", m.get("truncated"))
EOF
done
rm -rf "$SHIM"
exit "$rc"
