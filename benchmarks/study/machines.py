"""Which machine trained what. A run's record and a curve's point name the machines their training
ran on (``trainers.common.hardware.describe``: the CPU, its bf16 units, the GPU), per start and
resume. Seconds compare only within one machine, and so do bf16 results: two CPUs' matrix kernels
(AMX against avx512_bf16) round their sums differently, so a seed trained on another CPU is another
sample. A verdict over runs from several machines must hold on each machine's runs alone
(``benchmarks.study.verdicts.per_machine``), costs are reported per machine, and a study may be
pinned to one (``check_machine``)."""

from __future__ import annotations

from dataclasses import dataclass
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


#: How a machine reads under a shared label when it recorded no family and model (before 2026-12-02).
UNNUMBERED = "family and model not recorded"


def shared_labels(entries: list[dict[str, Any]]) -> frozenset[str]:
    """The machine labels under which ``entries`` (a study's runs' records or curve points) record more
    than one CPU family and model: two CPUs share a label (a Zen 1 and a Zen 3 are both
    ``CPU AMD EPYC (bf16 units: none)``), and records hold the numbers that tell them apart since
    2026-12-02."""
    models: dict[str, set[str]] = {}
    for e in entries:
        for m in e.get("machines") or []:
            if m.get("cpu_model"):
                models.setdefault(machine_label(m), set()).add(m["cpu_model"])
    return frozenset(label for label, found in models.items() if len(found) > 1)


def machine_name(machine: dict[str, Any], shared: frozenset[str] = frozenset()) -> str:
    """``machine_label``, and under a label in ``shared`` (``shared_labels``) the CPU's family and model
    too, or ``UNNUMBERED`` where the record predates them."""
    label = machine_label(machine)
    return f"{label}, {machine.get('cpu_model') or UNNUMBERED}" if label in shared else label


def trained_on(entry: dict[str, Any], shared: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The machines ``entry`` (a run's record or a curve point) trained on (``machine_name``), sorted;
    () where none was recorded."""
    return tuple(sorted({machine_name(m, shared) for m in entry.get("machines") or []}))


def one_machine(entry: dict[str, Any], shared: frozenset[str] = frozenset()) -> str | None:
    """The machine ``entry`` trained on, where it trained on exactly one that its record tells apart
    from the others (else None: unrecorded, resumed on another machine, or under a label ``shared``
    by several CPUs without the numbers that say which, so it belongs to no single machine's
    results)."""
    machines = entry.get("machines") or []
    if any(machine_label(m) in shared and not m.get("cpu_model") for m in machines):
        return None
    names = trained_on(entry, shared)
    return names[0] if len(names) == 1 else None


def this_machine(device: torch.device | str | None = None) -> str:
    """This machine's label, as a run trained here on ``device`` would record it."""
    from trainers.common.hardware import describe

    return machine_label(describe(device))


@dataclass(frozen=True)
class Pin:
    """One way a study is pinned to a machine, and whether this machine meets it."""
    flag: str  # the study's option: --machine or --cpu-model
    pinned: str  # what it is pinned to, in words ("a CPU of family 25 model 1")
    here: str  # what this machine is, in words ("this one is family 25 model 17")
    holds: bool


def this_cpu_model_words() -> str:
    """This CPU's family and model numbers in words, for a line about ``--cpu-model``."""
    from trainers.common.hardware import cpu_model

    return cpu_model() or "of no listed family and model"


def pins(pinned: str | None, device: torch.device | str | None = None, cpu_model: str | None = None) -> list[Pin]:
    """The pins a study sets (``--machine`` to a machine label, ``--cpu-model`` to a CPU's family and
    model numbers), each against this machine: the one comparison the study's command
    (``check_machine``) and its status both make."""
    from trainers.common.hardware import cpu_model as this_cpu_model

    out = []
    if pinned is not None:
        here = this_machine(device)
        out.append(Pin("--machine", pinned, f"this machine is {here}", here == pinned))
    if cpu_model is not None:
        out.append(Pin("--cpu-model", f"a CPU of {cpu_model}", f"this one is {this_cpu_model_words()}",
                       this_cpu_model() == cpu_model))
    return out


def check_machine(pinned: str | None, device: torch.device | str | None = None, cpu_model: str | None = None) -> None:
    """Refuses (``ConfigError``) to run a study pinned to ``pinned`` (``--machine``), or to a CPU's
    ``cpu_model`` (``--cpu-model``: its family and model numbers), on another machine: its runs would
    be another machine's, judged apart (``verdicts.per_machine``), and a machine holding one side's
    selected runs without the other's makes a verdict "not shown"."""
    from trainers.common.config import ConfigError

    consequence = {
        "--machine": "a run here would be judged apart from the others (a verdict must hold on each machine's "
                     "runs alone); resume it on that machine, or drop --machine to let this one's runs count as "
                     "another machine's",
        "--cpu-model": "a run here could share a machine label with another CPU's runs; resume it on that "
                       "machine, or drop --cpu-model to let this one's runs count as another machine's, told "
                       "apart by the family and model its records name (runs recorded before 2026-12-02 name "
                       "none: they count with the one CPU their study records under their label, and with none "
                       "where it records several)"}
    for pin in pins(pinned, device, cpu_model):
        if not pin.holds:
            raise ConfigError(f"{pin.flag}: this study is pinned to {pin.pinned}, and {pin.here}: "
                              f"{consequence[pin.flag]}")
