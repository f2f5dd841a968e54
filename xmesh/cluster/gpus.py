"""The GPUs a ``local-cuda`` cluster gives one worker each, found without a CUDA context here.

:func:`visible_gpus` lists the devices as CUDA numbers them for this process: the entries of
``CUDA_VISIBLE_DEVICES`` where it is set (as CUDA reads it: up to the first empty entry), else
``0 .. n-1`` for the GPUs the NVIDIA driver lists (NVML through nvidia-ml-py where installed, else
the driver's ``/proc/driver/nvidia/gpus``). :func:`gpu_cpus` reads the CPUs near a GPU (its PCI
device's ``local_cpulist``), where the driver says which PCI device it is.
"""

from __future__ import annotations

import os
from pathlib import Path

DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU, named by its PCI bus id
PCI_DEVICES = Path("/sys/bus/pci/devices")


def _nvml_count() -> int | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, or a library without this GPU: the driver's folder answers instead
        return None


def driver_bus_ids(root: Path = DRIVER_GPUS) -> list[str]:
    """The PCI bus ids of the GPUs the NVIDIA driver lists, in bus order ([] without the driver)."""
    try:
        return sorted(p.name for p in root.iterdir())
    except OSError:
        return []


def visible_gpus(environ=None, driver_root: Path = DRIVER_GPUS, use_nvml: bool = True) -> list[str]:
    """The CUDA device entries this process sees (indices or UUIDs, as text); ``use_nvml``: ask NVML
    (where nvidia-ml-py is installed) before the driver's folder."""
    env = os.environ if environ is None else environ
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        entries = []
        for entry in listed.split(","):
            entry = entry.strip()
            if not entry:
                break
            entries.append(entry)
        return entries
    count = _nvml_count() if use_nvml else None
    if count is None:
        count = len(driver_bus_ids(driver_root))
    return [str(i) for i in range(count)]


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def gpu_cpus(device: str, driver_root: Path = DRIVER_GPUS, pci_root: Path = PCI_DEVICES) -> set[int] | None:
    """The CPUs near GPU ``device`` (a CUDA index), within this process's own CPUs; None where that is
    not known cheaply (a UUID entry, no driver folder, no NUMA information) or no such CPU is ours.
    CUDA's index is taken as the GPU's place in PCI bus order (CUDA's order on a machine of one GPU
    model; set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` to make it so on others)."""
    if not device.isdigit():
        return None
    buses = driver_bus_ids(driver_root)
    if int(device) >= len(buses):
        return None
    try:
        near = parse_cpu_list((pci_root / buses[int(device)].lower() / "local_cpulist").read_text())
    except (OSError, ValueError):
        return None
    own = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else near
    near &= set(own)
    return near or None
