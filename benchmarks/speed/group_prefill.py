"""One RL step's sampling with each group's prompt prefilled once against once per response (as
before), side by side in one run, on the native engine (``model.shared_prefill``) and the hf engine
(``prompt_cache.shared_prompt_cache``):

    python -m benchmarks.speed.group_prefill
    python -m benchmarks.speed.group_prefill --engines hf --dtypes fp32 --repeats 3

The call: ``benchmarks.speed.rl``'s step (rg/basic_arithmetic-v0, two one-digit terms; 8 prompts of
the training split x G=8 responses of at most 64 tokens at temperature 1), the default model's
fp32 weights on each of ``--engines``, computing in each of ``--dtypes`` (bf16: under autocast, as
the RL policy generates). Both sides sample the same rows with the same seeds, in one process, in
ABBA order (before, after, after, before, ...) after one warm-up call each. Printed per dtype:
each side's median seconds, the ratio, and how many rows gave the same tokens on both sides (all,
unless a sum's order flips a near-tie).
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.speed.rl import ENV, ENV_ARGS, GROUP, PROMPTS, TOKENS
from trainers.common.config import Parser

SIDES = ("per response (before)", "per group (after)")


def main(argv: list[str] | None = None) -> dict:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["native", "hf"], choices=["native", "hf"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=2, help="measured calls per side, in ABBA order")
    args = parser.parse_args(argv)

    import llm_envs
    from trainers.common.hardware import machine_line
    from trainers.common.models import DEFAULT_MODEL
    from trainers.engines import generation, make_engine
    from trainers.engines.native import engine as native
    from trainers.engines.native.model import prefill as unshared_prefill  # every row's prompt, as before
    from trainers.rl.policy import load_policy

    # Where each engine takes its shared prompt pass from, and what stands in for it before.
    switches = {"native": (native, "shared_prefill", unshared_prefill),
                "hf": (generation, "shared_prompt_cache", lambda *args: None)}

    env = llm_envs.make(ENV, **ENV_ARGS)
    prompts = [e.prompt for e in list(env.examples("train"))[:PROMPTS]]
    env.close()
    print(f"RL sampling on {machine_line('cpu')}: {DEFAULT_MODEL}, {ENV}, {PROMPTS} prompts x G={GROUP} responses "
          f"of at most {TOKENS} tokens, temperature 1")
    results = {}
    for engine_name in args.engines:
        module, attribute, before_side = switches[engine_name]
        shared = getattr(module, attribute)
        for name in args.dtypes:
            dtype = {"fp32": None, "bf16": torch.bfloat16}[name]
            model, tokenizer = load_policy(DEFAULT_MODEL, "cpu", compute=dtype)
            engine = make_engine(engine_name, model, tokenizer, dtype)

            def call(side: int):
                setattr(module, attribute, shared if side else before_side)
                try:
                    start = time.perf_counter()
                    out = engine.generate(prompts, TOKENS, batch_size=PROMPTS * GROUP, temperature=1.0, seed=7,
                                          num_return_sequences=GROUP)
                    return time.perf_counter() - start, out
                finally:
                    setattr(module, attribute, shared)

            outs = [call(0)[1], call(1)[1]]  # warm-up
            seconds: dict[int, list[float]] = {0: [], 1: []}
            order = [0, 1, 1, 0] * ((args.repeats + 1) // 2)
            for side in order[:2 * args.repeats]:
                t, outs[side] = call(side)
                seconds[side].append(t)
            same = sum(a == b for a, b in zip(outs[0].token_ids, outs[1].token_ids))
            before, after = (statistics.median(seconds[s]) for s in (0, 1))
            tokens = sum(outs[1].num_tokens)
            results[f"{engine_name} {name}"] = {
                "before_s": before, "after_s": after, "speedup": before / after, "same_rows": same,
                "rows": len(outs[1].token_ids), "new_tokens": tokens, "prompt_tokens": sum(outs[1].prompt_tokens)}
            print(f"{engine_name} {name}: {SIDES[0]} {before:.1f} s, {SIDES[1]} {after:.1f} s: {before / after:.2f}x "
                  f"({tokens} new tokens; {same} of {len(outs[1].token_ids)} rows the same tokens on both sides; "
                  f"seconds {[round(s, 1) for s in seconds[0]]} vs {[round(s, 1) for s in seconds[1]]})")
            engine.close()
            del engine, model
    return results


if __name__ == "__main__":
    main()
