"""GPU energy per training step from NVML (nvidia-ml-py): `energy_j` of this rank's GPU; a no-op on CPU or without NVML."""

from __future__ import annotations

import os
from typing import Any

import torch

# NVML's total energy counter (mJ since the driver loaded) exists on Volta and later; older GPUs, a
# missing library or a container without NVML access leave the rows without `energy_j`.


def _nvml() -> Any | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no package, no driver, no permission: no energy figures
        return None


def _by_visible(nvml: Any, index: int) -> Any:
    """NVML's handle of CUDA device `index` through CUDA_VISIBLE_DEVICES (indices or GPU-UUIDs), else by index."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        entry = visible[index]
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return nvml.nvmlDeviceGetHandleByIndex(index)


def nvml_handle(device: torch.device) -> tuple[Any, Any] | None:
    """(pynvml, handle) of the GPU behind a CUDA device (by its UUID, else through CUDA_VISIBLE_DEVICES), or
    None when NVML cannot read its energy counter."""
    if device.type != "cuda":
        return None
    nvml = _nvml()
    if nvml is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    lookups = [lambda: _by_visible(nvml, index)]
    if uuid:
        lookups.insert(
            0, lambda: nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        )
    for lookup in lookups:
        try:
            handle = lookup()
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            return nvml, handle
        except Exception:  # not found this way, or no energy counter (pre-Volta, some vGPUs)
            continue
    return None


class StepEnergy:
    """Reads the GPU's energy counter around each step: `stop()` gives {"energy_j": J} (or {} without NVML).

    Every rank reads its own GPU; the rows global rank 0 writes carry its GPU's figure, which stands for each
    GPU's under data/expert parallelism (every rank runs the same step). No collective, no device sync: the
    step already ends with one."""

    def __init__(self, device: torch.device):
        self._nvml = nvml_handle(device)
        self._start_mj: int | None = None

    @property
    def active(self) -> bool:
        return self._nvml is not None

    def _read_mj(self) -> int | None:
        if self._nvml is None:
            return None
        nvml, handle = self._nvml
        try:
            return int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except Exception:  # a transient NVML error: this step has no figure
            return None

    def start(self) -> None:
        self._start_mj = self._read_mj()

    def stop(self) -> dict[str, float]:
        """Joules this GPU used since `start()` (the step ends with a device synchronize, so its work is in)."""
        end = self._read_mj()
        if end is None or self._start_mj is None or end < self._start_mj:
            return {}
        return {"energy_j": (end - self._start_mj) / 1000.0}
