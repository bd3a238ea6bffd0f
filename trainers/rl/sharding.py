"""The RL trainers on several processes (``torchrun`` / ``accelerate launch``): FSDP2 sharding and
what the loop and the algorithms exchange between ranks. With one process every method here is
the identity (or the plain single-process call), so one process computes exactly what it did
before this module existed.

What is sharded. The policy, PPO's critic (its trunk and its value head) and the frozen reference
model are each ``fully_shard``-ed: every decoder layer, then the root, over a 1-D mesh of all
ranks. Each rank then holds 1/W of every parameter, of its gradient and of AdamW's two moments
(``state_bytes`` counts them). On CUDA a run computing in bf16 gathers the trainable models'
parameters in bf16 and reduces their gradients in fp32 (``MixedPrecisionPolicy``): fp32 master
weights, bf16 compute, as one process's autocast; ``--dtype fp32`` gathers and computes in fp32.

What is sent. Forward and backward all-gather each layer's parameters and reduce-scatter its
gradients (FSDP2 itself). After each optimizer step the engine, which generates with its own full
copy of the weights, gets every parameter gathered one at a time (``full_parameters``: one
all-gather per parameter, so the peak extra memory is one full parameter). The loss normalisers
and the logged statistics are a handful of scalars summed over ranks (``Ranks.sum``), and the
step's rewards are gathered (``Ranks.gather``).

Gradients. FSDP2 averages gradients over ranks by default; here every rank divides its loss by
the whole step's normaliser (tokens or responses of all ranks, ``Ranks.sum``) and FSDP sums
(``set_gradient_divide_factor(1.0)``), so W ranks compute one process's whole-batch gradient.

Checkpoints (``checkpoints.save_sharded`` / ``restore_sharded``): the weights are gathered one
parameter at a time to rank 0, which writes them in Hugging Face format (``full_state_dict``); the
optimizer and the critic are saved with ``torch.distributed.checkpoint``, each rank writing its
own shard (``save_shards`` / ``load_shards``).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from trainers.common.distributed import Dist
from trainers.common.precision import fsdp_param_dtype

# HF models return views (a slice of the logits, hidden states); FSDP2 warns about in-place ops on
# them, which the RL losses never do.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


class Ranks:
    """This process among the run's processes, and the collectives the RL loop and algorithms use.
    ``Ranks()`` is one process: nothing is sharded and every collective returns its input."""

    def __init__(self, dist: Dist | None = None):
        self.dist = dist or Dist()
        self.mesh = None
        self.sharded_modules: list[torch.nn.Module] = []  # every fully_shard-ed root, for gradient sync

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world(self) -> int:
        return self.dist.world

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    @property
    def sharded(self) -> bool:
        return self.dist.world > 1

    # ----- splitting the work -----------------------------------------------------------------

    def share(self, n: int) -> slice:
        """This rank's contiguous chunk of ``range(n)`` (the first ``n % W`` ranks one item more), so
        the chunks concatenated in rank order are the one-process order."""
        bounds = np.cumsum([0] + [n // self.world + (r < n % self.world) for r in range(self.world)])
        return slice(int(bounds[self.rank]), int(bounds[self.rank + 1]))

    # ----- collectives ------------------------------------------------------------------------

    def sum(self, values: Sequence[float]) -> np.ndarray:
        """Elementwise sum over ranks (float64)."""
        return self.dist.sum(np.asarray(values, dtype=np.float64))

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of a tensor over ranks, in float64, returned in ``t``'s dtype and device
        (``t`` itself with one process)."""
        if not self.sharded:
            return t
        total = t.detach().to(torch.float64)
        with self.dist.collective("an all-reduce"):
            tdist.all_reduce(total)
        return total.to(t.dtype)

    def max(self, value: int) -> int:
        """The largest ``value`` over ranks (each rank then runs as many micro-batches)."""
        return max(self.gather([value]))

    def gather(self, items: Sequence[Any]) -> list[Any]:
        """Every rank's ``items`` (picklable, any number per rank), concatenated in rank order."""
        if not self.sharded:
            return list(items)
        out: list[Any] = [None] * self.world
        with self.dist.collective("an all-gather"):
            tdist.all_gather_object(out, list(items))
        return [x for part in out for x in part]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (``Dist.from_main``)."""
        return self.dist.from_main(obj)

    def wait_for_main(self) -> None:
        """Wait (long timeout) for rank 0's own work: logging, writing files."""
        self.dist.wait_for_main()

    # ----- sharding ---------------------------------------------------------------------------

    def shard(self, *modules: torch.nn.Module | None) -> None:
        """``fully_shard`` each module (None: skipped) in place: every decoder layer, then the root;
        trainable modules in the policy's precision (``mixed_precision``), frozen ones as they are.
        Nothing happens on one process."""
        if not self.sharded:
            return
        from torch.distributed.device_mesh import init_device_mesh

        if self.mesh is None:  # explicit: without one fully_shard picks a GPU even for a CPU run
            device_type = "cuda" if (self.dist.device or "").startswith("cuda") else "cpu"
            self.mesh = init_device_mesh(device_type, (self.world,))
        for module in modules:
            if module is not None:
                shard_module(module, self.mesh)
                self.sharded_modules.append(module)

    def gradient_sync(self, on: bool) -> None:
        """Whether the next backward reduce-scatters the gradients (the last micro-batch of a step)
        or keeps accumulating them locally (the others)."""
        for module in self.sharded_modules:
            if any(p.requires_grad for p in module.parameters()):
                module.set_requires_gradient_sync(on)

    def engine_model(self, model, engine: str, dtype: torch.dtype | None):
        """The model an ``engine`` generates with: the policy itself on one process; under FSDP a
        sharded policy cannot generate (its forward gathers every layer, a collective, and ranks
        decode different numbers of steps), so hf/native get a plain copy in the compute ``dtype``,
        made before sharding; vLLM copies the weights into itself, from the policy before sharding."""
        if not self.sharded or engine == "vllm":
            return model
        # each parameter copied straight into ``dtype`` (no full fp32 copy on the way); buffers
        # (rotary frequencies) keep theirs, as a model loaded in ``dtype`` keeps them
        memo = {id(p): torch.nn.Parameter(p.detach().to(dtype or p.dtype, copy=True), requires_grad=False)
                for p in model.parameters()}
        return copy.deepcopy(model, memo).eval()

    def sync_engine(self, engine, model, dtype: torch.dtype | None = None) -> None:
        """After an optimizer step: the engine generates with the new weights (gathered one
        parameter at a time under FSDP, in ``dtype`` when given)."""
        if not self.sharded:
            engine.sync_weights()
        else:
            engine.sync_weights(full_parameters(model, dtype))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules to shard on their own: those of the classes a Hugging Face model names in
    ``_no_split_modules`` (its decoder layers), else the children of its ``nn.ModuleList``s."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not layers:
        layers = [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList) for m in lst]
    return layers


def shard_module(module: torch.nn.Module, mesh) -> None:
    """``fully_shard`` every decoder layer of ``module``, then ``module`` itself; gradients are
    summed over ranks, not averaged (each rank's loss is already divided by the whole step's
    normaliser). A trainable fp32 transformer computing in bf16 on CUDA gathers in bf16 and
    reduces in fp32; in fp32 it gathers fp32."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    # the run's compute dtype decides (precision.fsdp_param_dtype): --dtype fp32 gathers fp32
    param_dtype = fsdp_param_dtype(module)
    policy = MixedPrecisionPolicy() if param_dtype is None else \
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # a sum over ranks (the default is the mean)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no AVG/PREMUL_SUM


# ----- full parameters, one at a time ----------------------------------------------------------


def full_parameters(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for each of ``model.named_parameters()``, gathered one at a time (a
    collective: every rank iterates to the end, in the same order), cast to ``dtype`` before the
    gather when given; plain tensors pass through."""
    from torch.distributed.tensor import DTensor

    for name, p in model.named_parameters():
        t = p.detach()
        if dtype is not None:
            t = t.to(dtype)
        yield name, t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The model's parameters and persistent buffers as full CPU tensors, gathered one parameter at
    a time; only a rank with ``keep`` (rank 0) keeps them, the others return ``{}``."""
    out = {name: t.cpu() for name, t in full_parameters(model) if keep}
    if keep:
        params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        out.update({name: b.detach().cpu() for name, b in model.state_dict().items()
                    if name not in params and name not in out and isinstance(b, torch.Tensor)})
    return out


# ----- sharded state: optimizer and modules ------------------------------------------------------


def _container(model: torch.nn.Module, modules: dict[str, torch.nn.Module]) -> torch.nn.Module:
    """One module holding every trainable model, so that each optimizer parameter has a name."""
    return torch.nn.ModuleDict({"policy": model, **modules})


def _sharded_state(container: torch.nn.Module, modules: dict[str, torch.nn.Module], optimizer) -> dict[str, Any]:
    """The optimizer's and ``modules``' state as ``torch.distributed.checkpoint`` saves and loads it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"optimizer": get_optimizer_state_dict(container, optimizer),
            "modules": {k: get_model_state_dict(m) for k, m in modules.items()}}


def save_shards(path: Path, model: torch.nn.Module, modules: dict[str, torch.nn.Module], optimizer) -> None:
    """The optimizer state and ``modules`` (a critic) with ``torch.distributed.checkpoint`` under
    ``path``: every rank writes its own shard (a collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_sharded_state(_container(model, modules), modules, optimizer), checkpoint_id=str(path))


def load_shards(path: Path, model: torch.nn.Module, modules: dict[str, torch.nn.Module], optimizer) -> None:
    """Load what ``save_shards`` wrote into the optimizer and ``modules`` (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    container = _container(model, modules)
    state = _sharded_state(container, modules, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    for k, m in modules.items():
        set_model_state_dict(m, state["modules"][k])
    set_optimizer_state_dict(container, optimizer, state["optimizer"])


# ----- memory per rank ---------------------------------------------------------------------------


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes this rank holds of ``t`` (its local shard for a DTensor)."""
    if t is None:
        return 0
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def state_bytes(params: Sequence[torch.Tensor], optimizer=None) -> dict[str, int]:
    """What this rank holds of ``params``: their bytes, their gradients' (present ones), the
    optimizer's state for them, and the largest full parameter (what one gather adds)."""
    params = list(params)
    out = {"params": sum(local_bytes(p) for p in params), "grads": sum(local_bytes(p.grad) for p in params),
           "optimizer": 0,
           "largest_full_param": max((p.numel() * p.element_size() for p in params), default=0)}
    if optimizer is not None:
        ids = {id(p) for p in params}
        out["optimizer"] = sum(local_bytes(v) for p, s in optimizer.state.items() if id(p) in ids
                               for v in s.values() if isinstance(v, torch.Tensor))
    return out
