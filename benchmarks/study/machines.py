"""Which machine trained what. A run's record and a curve's point name the machines their training
ran on (``trainers.common.hardware.describe``: the CPU, its bf16 units, the GPU), per start and
resume. Seconds compare only within one machine, and so do bf16 results: two CPUs' matrix kernels
(AMX against avx512_bf16) round their sums differently, so a seed trained on another CPU is another
sample. A verdict over runs from several machines must hold on each machine's runs alone
(``benchmarks.study.verdicts.per_machine``), costs are reported per machine, and a study may be
pinned to one (``check_machine``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def machine_label(machine: dict[str, Any]) -> str:
    """One recorded machine in words, without its thread count: runs that differ only in threads
    ran on the same machine."""
    from trainers.common.hardware import describe_line

    return describe_line({k: v for k, v in machine.items() if k != "threads"})


def machines_line(machines: list[dict[str, Any]]) -> str:
    """A run's recorded machines in one line, without thread counts."""
    return " and ".join(dict.fromkeys(machine_label(m) for m in machines))


def measured_on(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The machines that measured a run or a point (its evaluations' recorded ``machine``)."""
    return [s["machine"] for s in (entry.get("greedy"), entry.get("kl")) if isinstance(s, dict) and s.get("machine")]


def trained_on(entry: dict[str, Any]) -> tuple[str, ...]:
    """The labels of the machines ``entry`` (a run's record or a curve point) trained on, sorted;
    () where none was recorded."""
    return tuple(sorted({machine_label(m) for m in entry.get("machines") or []}))


def one_machine(entry: dict[str, Any]) -> str | None:
    """The machine ``entry`` trained on, where it trained on exactly one (else None: unrecorded, or
    resumed on another machine, so it belongs to no single machine's results)."""
    labels = trained_on(entry)
    return labels[0] if len(labels) == 1 else None


def this_machine(device: torch.device | str | None = None) -> str:
    """This machine's label, as a run trained here on ``device`` would record it."""
    from trainers.common.hardware import describe

    return machine_label(describe(device))


def check_machine(pinned: str | None, device: torch.device | str | None = None, cpu_model: str | None = None) -> None:
    """Refuses (``ConfigError``) to run a study pinned to ``pinned`` (``--machine``), or to a CPU's
    ``cpu_model`` (``--cpu-model``: its family and model numbers), on another machine: its runs would
    be another machine's, judged apart (``verdicts.per_machine``), and a machine holding one side's
    selected runs without the other's makes a verdict "not shown"."""
    from trainers.common.config import ConfigError
    from trainers.common.hardware import cpu_model as this_cpu_model

    why = ("a run here would be judged apart from the others (a verdict must hold on each machine's runs "
           "alone); resume it on that machine, or drop {flag} to let this one's runs count as another machine's")
    if pinned is not None and (here := this_machine(device)) != pinned:
        raise ConfigError(f"--machine: this study is pinned to {pinned}, and this machine is {here}: "
                          + why.format(flag="--machine"))
    if cpu_model is not None and (here := this_cpu_model()) != cpu_model:
        raise ConfigError(f"--cpu-model: this study is pinned to a CPU of {cpu_model}, and this one is "
                          f"{here or 'of no listed family and model'}: " + why.format(flag="--cpu-model"))
