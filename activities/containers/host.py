"""The host as it is: how many GPUs (and how much memory each) this machine really has, from NVML or
`nvidia-smi`, so a fleet started without a hardware profile plans for the host it runs on (0 GPUs on a
machine without an NVIDIA driver) instead of a made-up 8-GPU box; and the check that refuses, before
any row starts, a profile or a row that asks for GPUs the host lacks.

`discover_gpus` does the I/O (NVML through ctypes first: no extra package; then nvidia-smi); the parse
and the check are pure."""

from __future__ import annotations

import ctypes
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.fleet import HardwareProfile
from contracts.fleet_job import ManifestRow


@dataclass(frozen=True)
class HostGpus:
    count: int
    memory_gb: int
    """The smallest GPU's memory (what a row may count on), 0 without GPUs."""
    how: str
    """How it was found out, for a person: `NVML: 2 x NVIDIA H100 80GB HBM3` or why there is none."""


def parse_nvidia_smi(text: str) -> list[tuple[str, int]]:
    """(name, memory MiB) per GPU from `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        name, _, mem = line.rpartition(",")
        if name.strip() and mem.strip().isdigit():
            gpus.append((name.strip(), int(mem.strip())))
    return gpus


def _summary(source: str, gpus: Sequence[tuple[str, int]]) -> HostGpus:
    if not gpus:
        return HostGpus(0, 0, f"{source}: no GPU")
    names = sorted({n for n, _ in gpus})
    return HostGpus(len(gpus), min(m for _, m in gpus) // 1024, f"{source}: {len(gpus)} x {', '.join(names)}")


def _nvml() -> list[tuple[str, int]] | None:
    """GPUs through libnvidia-ml (None when the library or the driver is not there)."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None

        class Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        gpus = []
        for i in range(count.value):
            handle, mem, name = ctypes.c_void_p(), Memory(), ctypes.create_string_buffer(96)
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                return None
            lib.nvmlDeviceGetName(handle, name, 96)
            if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0:
                return None
            gpus.append((name.value.decode(errors="replace"), mem.total // (1024 * 1024)))
        return gpus
    finally:
        lib.nvmlShutdown()


def discover_gpus() -> HostGpus:
    """This machine's GPUs: NVML, else nvidia-smi, else none (and why)."""
    if (gpus := _nvml()) is not None:
        return _summary("NVML", gpus)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return HostGpus(0, 0, "no NVIDIA driver (no libnvidia-ml.so.1, no nvidia-smi): no GPU")
    try:
        r = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return HostGpus(0, 0, f"nvidia-smi failed ({e}): no GPU")
    if r.returncode != 0:
        return HostGpus(0, 0, f"nvidia-smi failed: {(r.stderr or r.stdout).strip()[:120]}: no GPU")
    return _summary("nvidia-smi", parse_nvidia_smi(r.stdout))


def host_profile(gpus: HostGpus, base: HardwareProfile | None = None) -> HardwareProfile:
    """The default profile: `base`'s ports and cache, this host's GPUs."""
    base = base or HardwareProfile()
    return base.model_copy(update={"name": socket.gethostname() or "this host", "gpu_count": gpus.count,
                                   "gpu_memory_gb": gpus.memory_gb,
                                   "source": f"discovered on {socket.gethostname()} ({gpus.how})"})


def gpu_problems(profile: HardwareProfile, host: HostGpus, rows: Sequence[ManifestRow], where: str) -> list[str]:
    """What asks for GPUs the host lacks, each with what to change (empty: nothing). `where` names the
    profile (its file) for the message."""
    problems = []
    if profile.gpu_count > host.count:
        problems.append(f"{where} says gpu_count {profile.gpu_count}, but this host has {host.count} ({host.how}): "
                        f"set gpu_count: {host.count} in it, or run the fleet on a host with the GPUs")
    have = min(profile.gpu_count, host.count)
    wanting = [r for r in rows if not r.finished and r.gpus is not None and r.gpus > have]
    for r in wanting[:5]:
        problems.append(f"CSV line {r.row + 2} ({r.model_name}) asks for {r.gpus} GPU(s), the host has {have}: set its gpus "
                        f"cell to {have}{' or less' if have else ''}, or test it on a host with {r.gpus}")
    if len(wanting) > 5:
        problems.append(f"... and {len(wanting) - 5} more rows ask for more than {have} GPU(s)")
    return problems
