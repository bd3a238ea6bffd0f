"""What each rank holds of the RL trainers' trainable state under FSDP2: bytes of parameters,
gradients and AdamW state, counted from the local shards, next to one process's on the same model.

    torchrun --standalone --nproc-per-node 2 -m benchmarks.memory.sharded                 # default model
    torchrun --standalone --nproc-per-node 2 -m benchmarks.memory.sharded --critic true   # + PPO's critic

Every rank first takes one AdamW step on an unsharded copy (one process's state), then shards the
models as ``trainers.rl.loop`` does (``Ranks.shard``) and takes one step on its share of a batch;
rank 0 gathers the counts and prints one ``RESULT {json}`` line per rank (ranks printing
themselves could interleave their lines). Sharded, a rank holds 1/W of each (the last shard
of a parameter that does not split evenly is shorter); gathering a parameter for the engine or a
checkpoint adds at most the largest full parameter (``largest_full_param``). The frozen reference
model (2 bytes per parameter on CUDA) is sharded too and not counted here. Activations, the
engine's own copy of the weights (hf/native: the compute dtype; vLLM: its own) and the
generation cache come on top.
"""

from __future__ import annotations

import copy
import json

import torch

from trainers.common import distributed
from trainers.common.config import Parser
from trainers.common.models import DEFAULT_MODEL
from trainers.rl.policy import load_critic_trunk, load_policy, make_optimizer
from trainers.rl.sharding import Ranks, state_bytes


def one_step(modules: list[torch.nn.Module], forward) -> dict[str, int]:
    """One AdamW step on ``forward()``'s loss over the modules' parameters; the bytes held of
    parameters, gradients (just before the step) and optimizer state (just after)."""
    params = [p for m in modules for p in m.parameters()]
    optimizer = make_optimizer([{"params": params}], lr=1e-6)
    forward().backward()
    grads = state_bytes(params)["grads"]
    optimizer.step()
    out = {**state_bytes(params, optimizer), "grads": grads}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    optimizer.zero_grad(set_to_none=True)
    return out


def main(argv: list[str] | None = None) -> None:
    from trainers.rl.ppo import ValueHead

    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--critic", default="false", choices=["true", "false"],
                        help="add PPO's separate critic (a second trunk and a value head)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per row of the batch (4 rows)")
    args = parser.parse_args(argv)
    ranks = Ranks(distributed.init())
    with ranks.dist.main_first():
        policy, _ = load_policy(args.model, ranks.dist.device)
    modules = [policy]
    if args.critic == "true":
        modules += [load_critic_trunk(args.model, ranks.dist.device), ValueHead(policy.config.hidden_size)]
    ids = torch.randint(0, policy.config.vocab_size, (4, args.tokens), generator=torch.Generator().manual_seed(0))
    ids = ids.to(next(policy.parameters()).device)

    def loss(ms, rows):
        out = ms[0](input_ids=ids[rows], use_cache=False).logits.float().mean()
        if len(ms) > 1:
            out = out + ms[2](ms[1](input_ids=ids[rows], use_cache=False).last_hidden_state).mean()
        return out

    whole = copy.deepcopy(modules)  # one process: everything, every row
    one = one_step(whole, lambda: loss(whole, slice(None)))
    del whole
    ranks.shard(*modules)
    mine = one_step(modules, lambda: loss(modules, ranks.share(len(ids))))
    row = {"rank": ranks.rank, "world": ranks.world, "model": args.model, "critic": args.critic == "true",
           "one_process": one, "this_rank": mine}
    rows = ranks.gather([row])
    if ranks.is_main:
        for r in rows:
            print("RESULT " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
