"""What the machine computes with: the CPU's name and whether it has bf16 matrix units.

A CPU with bf16 units (Intel AMX since Sapphire Rapids, AVX512-BF16 since Cooper Lake and AMD
Zen 4) runs bf16 matrix products 2-8x faster than fp32; one without them only emulates bf16, slower
than fp32. Runs and benchmark tables record ``describe()`` so a reader knows which machine a time
came from.
"""

from __future__ import annotations

import functools
import os
import platform

import torch

#: Set to "0" to report a CPU as having no bf16 units (tests simulate such a CPU with it).
FORCE_ENV = "LLM_ENVS_CPU_BF16"


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (``lscpu``'s), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_bf16_units() -> str | None:
    """``"amx"`` or ``"avx512_bf16"`` when the CPU has bf16 matrix units torch uses, else None.
    Detected through torch's own CPU feature checks, which oneDNN's bf16 kernels follow."""
    forced = os.environ.get(FORCE_ENV)
    if forced is not None and forced.strip() in ("0", "false", "no", ""):
        return None
    cpu = getattr(torch, "cpu", None)
    if cpu is None:
        return None
    if getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return "amx"
    if getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "avx512_bf16"
    return None


def cpu_has_bf16() -> bool:
    """Whether bf16 compute pays on this CPU (it has bf16 matrix units)."""
    return cpu_bf16_units() is not None


def describe(device: torch.device | str | None = None) -> dict:
    """What a run's or benchmark's times came from: the CPU (name, bf16 units) and the GPU if used."""
    out = {"cpu": cpu_name(), "cpu_bf16_units": cpu_bf16_units() or "none", "threads": torch.get_num_threads()}
    if device is not None and torch.device(device).type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


def describe_line(d: dict) -> str:
    """A ``describe`` record in one line."""
    gpu = f"; GPU {d['gpu']}" if "gpu" in d else ""
    threads = f"; {d['threads']} threads" if "threads" in d else ""
    return f"CPU {d['cpu']} (bf16 units: {d['cpu_bf16_units']}{threads}){gpu}"


def machine_line(device: torch.device | str | None = None) -> str:
    """This machine in one line, for logs and benchmark headers."""
    return describe_line(describe(device))
