#!/usr/bin/env bash
# Prepared, NOT yet run: sustained back-to-back kernel throughput on a lent GPU (H100 / H200),
# what the burst-timed operator profiles cannot see (nest.profiling.sustained: bf16 GEMMs of
# transformer shapes, causal attention forward + backward, Transformer Engine's FP8 te.Linear if
# importable, wgrad accumulation into an FP32 main gradient), with clocks, power and temperature
# before and after each test.
#
# Run on the GPU machine from the repository root:   bash scripts/gpu_measure.sh
# Needs python3 with torch (CUDA); nest/__init__.py is bypassed through a shim, as in
# scripts/gpu_profile.sh. Fixed call counts (50 warm-up + 200 timed per shape); a few seconds per
# shape, about 2-4 minutes in all; hard limit NEST_MEASURE_TIMEOUT_S (default 540 s).
# NEST_MEASURE_CPU_DRY_RUN=1 checks the script on a CPU with tiny shapes.
# Writes $OUT/<hardware>/sustained.csv, sustained_meta.json, run.log (OUT defaults to ./gpu_out;
# <hardware> from the device name). Copy them into profiles/<hardware>/ to commit them.
set -u
REPO=$(pwd)
OUT=${OUT:-$REPO/gpu_out}
PY=${PYTHON:-python3}
LIMIT_S=${NEST_MEASURE_TIMEOUT_S:-540}
export PYTHONUNBUFFERED=1
SHIM=$(mktemp -d /tmp/nest_shim.XXXXXX)
mkdir -p "$SHIM/nest" "$OUT"
echo '"""shim"""' > "$SHIM/nest/__init__.py"
ln -s "$REPO/nest/profiling" "$SHIM/nest/profiling"

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv \
    || echo "nvidia-smi not available"
EXTRA=()
if [ "${NEST_MEASURE_CPU_DRY_RUN:-0}" = 1 ]; then EXTRA=(--tiny); fi
echo "== sustained measurements (limit ${LIMIT_S} s)"
(cd "$SHIM" && timeout -s INT "$LIMIT_S" "$PY" -m nest.profiling.sustained --out "$OUT" \
    "${EXTRA[@]}") 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
echo "== exit code $rc"
for d in "$OUT"/*/; do
    [ -f "$d/sustained_meta.json" ] && cp "$OUT/run.log" "$d/run.log" && ls -l "$d"
done
rm -rf "$SHIM"
exit "$rc"
