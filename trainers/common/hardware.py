"""What the machine computes with: the CPU's name and which bf16 matrix units it lists.

The units are described, not trusted: a Xeon listing AVX512-BF16 (no AMX) ran SmolLM2's matrix
products at 0.55-0.66x in bf16, a Zen 4 at 1.5x. Whether bf16 pays is measured
(``precision.decide``). Runs and benchmark tables record ``describe()`` so a reader knows which
machine a time came from; benchmark headers print ``precision.header_line()``, this machine and
what ``--dtype auto`` decides on it and why.
"""

from __future__ import annotations

import functools
import platform

import torch

#: Where Linux lists the CPU (its name, family and model).
CPUINFO = "/proc/cpuinfo"
#: Forces ``--dtype auto`` on CPU: "1" bf16, "0" fp32 (the test suite sets "0"), skipping the probe.
FORCE_ENV = "LLM_ENVS_CPU_BF16"


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (``lscpu``'s), or the platform's processor string."""
    try:
        with open(CPUINFO) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.cache
def cpu_model() -> str | None:
    """The CPU's family and model numbers as ``/proc/cpuinfo`` lists them (``"family 25 model 17"``),
    or None where it lists none. Two CPUs can share a name and bf16 units (a Zen 4 and a Zen 5 are
    both "AMD EPYC" with avx512_bf16); these numbers tell them apart."""
    fields = {}
    try:
        with open(CPUINFO) as f:
            for line in f:
                if not line.strip() and fields:  # the first processor's block is enough
                    break
                key, _, value = line.partition(":")
                if key.strip() in ("cpu family", "model"):
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        return None
    if set(fields) != {"cpu family", "model"}:
        return None
    return f"family {fields['cpu family']} model {fields['model']}"


def cpu_bf16_units() -> str | None:
    """``"amx"`` or ``"avx512_bf16"`` when the CPU lists bf16 matrix units torch uses, else None
    (torch's own CPU feature checks, which oneDNN's bf16 kernels follow). A description only: it
    does not decide the dtype."""
    cpu = getattr(torch, "cpu", None)
    if cpu is None:
        return None
    if getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return "amx"
    if getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "avx512_bf16"
    return None


def describe(device: torch.device | str | None = None) -> dict:
    """What a run's or benchmark's times came from: the CPU (name, bf16 units, family and model where
    listed) and the GPU if used."""
    out = {"cpu": cpu_name(), "cpu_bf16_units": cpu_bf16_units() or "none", "threads": torch.get_num_threads()}
    if cpu_model():
        out["cpu_model"] = cpu_model()
    if device is not None and torch.device(device).type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


def describe_line(d: dict) -> str:
    """A ``describe`` record in one line."""
    gpu = f"; GPU {d['gpu']}" if "gpu" in d else ""
    threads = f"; {d['threads']} threads" if "threads" in d else ""
    return f"CPU {d['cpu']} (bf16 units: {d['cpu_bf16_units']}{threads}){gpu}"


def machine_line(device: torch.device | str | None = None) -> str:
    """This machine in one line, for logs (benchmark headers add the dtype decision:
    ``precision.header_line``)."""
    return describe_line(describe(device))
