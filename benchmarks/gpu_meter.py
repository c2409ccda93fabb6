"""GPU utilisation while a block runs, for benchmarks/train.py: NVML's mean utilisation sampled on a thread (through
torch.cuda.utilization() when pynvml is installed, else libnvidia-ml through ctypes) and, with `profile`, the union of
the CUDA kernels' intervals (torch.profiler, CUPTI) over the block's wall time."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import numpy as np
import torch


class GpuMeter:
    """Mean GPU utilisation (NVML's: the share of time a kernel ran) sampled on a thread while the block runs; with
    `profile`, also the union of CUDA kernel intervals (torch.profiler) over the block's wall time."""

    def __init__(self, device: torch.device, profile: bool = False):
        self.on = device.type == "cuda"
        self.profile = profile and self.on
        self.read, self.source = _utilisation_reader(device) if self.on else (None, "na")
        self.samples: list[float] = []
        self.kernel_busy: float | None = None
        self.wall = 0.0

    def __enter__(self) -> GpuMeter:
        self._stop = threading.Event()
        if self.read is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self._prof = None
        if self.profile:
            from torch.profiler import ProfilerActivity, profile
            self._prof = profile(activities=[ProfilerActivity.CUDA])
            self._prof.__enter__()
        self._t0 = time.perf_counter()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.samples.append(float(self.read()))
            except Exception:  # noqa: BLE001 - a failed read ends sampling, not the benchmark
                return

    def __exit__(self, *exc) -> None:
        if self.on:
            torch.cuda.synchronize()
        self.wall = time.perf_counter() - self._t0
        self._stop.set()
        if self.read is not None:
            self._thread.join()
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            try:
                busy = kernel_busy_seconds(self._prof)
                self.kernel_busy = None if busy is None else busy / max(self.wall, 1e-9)
            except Exception as e:  # noqa: BLE001
                print(f"warning: reading the profiler's kernels failed ({type(e).__name__}: {e})", file=sys.stderr)

    def fields(self) -> str:
        if not self.on:
            return ""
        util = f"{np.mean(self.samples) / 100:.3f}" if self.samples else "na"
        line = f" gpu_util={util} gpu_util_source={self.source} gpu_util_samples={len(self.samples)}"
        if self.profile:
            line += f" gpu_kernel_busy={'na' if self.kernel_busy is None else f'{self.kernel_busy:.3f}'}"
        return line


def _utilisation_reader(device: torch.device):
    """(a function returning the GPU's utilisation in percent, where it came from), or (None, "na")."""
    try:
        torch.cuda.utilization(device)
        return (lambda: torch.cuda.utilization(device)), "torch.cuda.utilization"
    except Exception:  # noqa: BLE001 - no pynvml: NVML itself
        pass
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None, "na"
        handle = ctypes.c_void_p()
        uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
        uuid = uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        if not uuid or nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            index = int(visible) if visible.isdigit() else (device.index or 0)
            if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                return None, "na"

        class Utilization(ctypes.Structure):
            _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

        def read() -> float:
            u = Utilization()
            if nvml.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(u)) != 0:
                raise OSError("nvmlDeviceGetUtilizationRates failed")
            return u.gpu

        read()
        return read, "nvml_ctypes"
    except Exception:  # noqa: BLE001 - no driver library, MIG, ...
        return None, "na"


def kernel_busy_seconds(prof) -> float | None:
    """Seconds during which at least one CUDA kernel ran: the union of the profiled kernels' intervals (None: the
    profiler saw no kernel, e.g. without CUPTI)."""
    spans = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == torch.autograd.DeviceType.CUDA and e.duration_ns() > 0:
            spans.append((e.start_ns(), e.start_ns() + e.duration_ns()))
    return union_length(spans) / 1e9 if spans else None


def union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total
