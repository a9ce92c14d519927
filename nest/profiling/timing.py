"""Callable -> median seconds per call on the current device; device/software metadata."""

from __future__ import annotations

import datetime as _dt
import platform
import re
import statistics
import subprocess
import time

import torch


def pick_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class Timer:
    """Median time of ``fn()`` over many runs after a warm-up.

    CUDA: one pair of CUDA events around each call, the L2 cache flushed (a 256 MiB buffer
    zeroed) before each call so that no run reads its inputs from the previous run's cache; the
    flush also keeps the GPU busy while the host enqueues the next call. The number of runs is
    chosen from a first estimate so that each measurement takes about ``rep_s`` seconds, within
    ``[min_reps, max_reps]``. CPU: ``time.perf_counter`` around each call, same median rule.
    """

    def __init__(
        self, device: str, *, warmup_s=0.005, rep_s=0.02, min_reps=5, max_reps=200, flush_l2=True
    ):
        self.device = device
        self.warmup_s = warmup_s
        self.rep_s = rep_s
        self.min_reps = min_reps
        self.max_reps = max_reps
        self._cache = None
        if device == "cuda" and flush_l2:
            self._cache = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")

    @property
    def method(self) -> str:
        if self.device == "cuda":
            return (
                f"CUDA events per call, L2 flushed before each call "
                f"({'256 MiB' if self._cache is not None else 'off'}), median of "
                f"{self.min_reps}..{self.max_reps} runs (~{self.rep_s * 1e3:.0f} ms), "
                f"warm-up ~{self.warmup_s * 1e3:.0f} ms"
            )
        return (
            f"time.perf_counter per call, median of {self.min_reps}..{self.max_reps} runs "
            f"(~{self.rep_s * 1e3:.0f} ms), warm-up ~{self.warmup_s * 1e3:.0f} ms"
        )

    def _flush(self):
        if self._cache is not None:
            self._cache.zero_()

    def __call__(self, fn) -> tuple[float, int]:
        """Return (median seconds per call, number of timed runs)."""
        if self.device == "cuda":
            return self._time_cuda(fn)
        return self._time_cpu(fn)

    def _count(self, est_s: float) -> tuple[int, int]:
        est_s = max(est_s, 1e-7)
        n_warm = int(min(50, max(1, self.warmup_s / est_s)))
        n_rep = int(min(self.max_reps, max(self.min_reps, self.rep_s / est_s)))
        return n_warm, n_rep

    def _time_cuda(self, fn):
        fn()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            fn()
        end.record()
        torch.cuda.synchronize()
        n_warm, n_rep = self._count(start.elapsed_time(end) / 3e3)
        for _ in range(n_warm):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            self._flush()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]
        return statistics.median(times), n_rep

    def _time_cpu(self, fn):
        t0 = time.perf_counter()
        fn()
        n_warm, n_rep = self._count(time.perf_counter() - t0)
        for _ in range(n_warm):
            fn()
        times = []
        for _ in range(n_rep):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), n_rep


def _nvidia_smi(query: str) -> list[str] | None:
    try:
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return [x.strip() for x in r.stdout.strip().splitlines()[0].split(",")]


def gpu_state() -> dict | None:
    """Clocks, temperature and power now (nvidia-smi), or None without it."""
    fields = "clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu"
    vals = _nvidia_smi(fields)
    return dict(zip(fields.split(","), vals)) if vals else None


def hardware_name(device_name: str) -> str:
    """Profile folder name from the device name; H200 numbers are never labelled H100."""
    up = device_name.upper()
    for chip in ("H200", "H100", "A100", "B200", "GH200"):
        if chip in up:
            base = chip.lower()
            if "PCIE" in up:
                return f"{base}_pcie"
            if "NVL" in up:
                return f"{base}_nvl"
            return f"{base}_sxm"
    slug = re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")
    return slug or "unknown"


def device_meta(device: str) -> dict:
    meta = {
        "date_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "host_cpu": platform.processor() or platform.machine(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        meta.update(
            {
                "device_name": torch.cuda.get_device_name(0),
                "compute_capability": f"{props.major}.{props.minor}",
                "multiprocessor_count": props.multi_processor_count,
                "total_memory_bytes": int(props.total_memory),
                "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
                "cudnn": torch.backends.cudnn.version()
                if torch.backends.cudnn.is_available()
                else None,
            }
        )
        smi = _nvidia_smi("driver_version,name,memory.total,clocks.max.sm,power.limit")
        if smi:
            meta.update(
                {
                    "driver_version": smi[0],
                    "nvidia_smi_name": smi[1],
                    "nvidia_smi_memory_total": smi[2],
                    "clocks_max_sm": smi[3],
                    "power_limit": smi[4],
                }
            )
        else:
            meta["driver_version"] = None
        try:
            import triton

            meta["triton"] = triton.__version__
        except Exception:  # noqa: BLE001 - optional
            meta["triton"] = None
    else:
        meta["device_name"] = platform.processor() or platform.machine() or "cpu"
        meta["driver_version"] = None
    return meta


def measure_ceilings(device: str, timer: Timer) -> dict:
    """Two reference numbers: a large device copy (bytes read + written) and a square bf16 GEMM."""
    n_copy, n_mm = (256 * 1024 * 1024, 8192) if device == "cuda" else (1 << 22, 256)
    src = torch.randn(n_copy // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t_copy, _ = timer(lambda: dst.copy_(src))
    a = torch.randn(n_mm, n_mm, device=device, dtype=torch.bfloat16)
    b = torch.randn(n_mm, n_mm, device=device, dtype=torch.bfloat16)
    t_mm, _ = timer(lambda: torch.mm(a, b))
    out = {
        "copy_bytes": 2 * n_copy,
        "copy_time_s": t_copy,
        "copy_bytes_per_s": 2 * n_copy / t_copy,
        "square_gemm_n": n_mm,
        "square_gemm_time_s": t_mm,
        "square_gemm_flops_per_s": 2 * n_mm**3 / t_mm,
    }
    return out
