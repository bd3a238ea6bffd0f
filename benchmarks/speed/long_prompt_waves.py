"""Long prompts: the native engine's waves sized with a group's prompt pass counted once (now)
against once per response (before), side by side in one run:

    python -m benchmarks.speed.long_prompt_waves
    python -m benchmarks.speed.long_prompt_waves --min-tokens 9000 --max-tokens 11000

The call: ARC-AGI-v0's GRPO CPU preset's sampling (2 prompts x G=4 responses of at most 256
tokens, temperature 1) on the first two training prompts of ``--min-tokens`` to ``--max-tokens``
tokens, the default model's fp32 weights on the native engine. A wave's size comes from free memory
(``generation.wave_room``): each row keeps its KV cache, and each prompt pass needs room for its
attention scores, which grow as the prompt's length squared. Before, every row was charged a prompt
pass, so a 6-7k-token prompt's group of 4 ran in waves of 2 (its prompt computed twice); now the
group's one pass is charged once. Both sides sample the same rows with the same seeds, in one
process, in BAAB order. Printed: each side's waves and seconds, the ratio, and how many rows gave
the same tokens (all, unless a sum's order flips a near-tie).
"""

from __future__ import annotations

import statistics
import time

from trainers.common.config import Parser

ENV, PROMPTS, GROUP, TOKENS = "ARC-AGI-v0", 2, 4, 256


def main(argv: list[str] | None = None) -> dict:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-tokens", type=int, default=6000, help="the shortest prompt taken, in tokens")
    parser.add_argument("--max-tokens", type=int, default=7000, help="the longest prompt taken, in tokens")
    parser.add_argument("--repeats", type=int, default=1, help="measured calls per side")
    args = parser.parse_args(argv)
    if args.min_tokens > args.max_tokens:
        parser.error(f"--min-tokens {args.min_tokens} is above --max-tokens {args.max_tokens}")

    import llm_envs
    from trainers.common.hardware import machine_line
    from trainers.common.models import DEFAULT_MODEL, load_model
    from trainers.engines import make_engine
    from trainers.engines.generation import encode_prompts, free_memory
    from trainers.engines.native import engine as native

    model, tokenizer = load_model(DEFAULT_MODEL)
    env = llm_envs.make(ENV)
    examples = list(env.examples("train"))
    env.close()
    lengths = [len(ids) for ids in encode_prompts(tokenizer, [e.prompt for e in examples])]
    chosen = [k for k, n in enumerate(lengths) if args.min_tokens <= n <= args.max_tokens][:PROMPTS]
    if len(chosen) < PROMPTS:
        parser.error(f"fewer than {PROMPTS} {ENV} training prompts of {args.min_tokens}-{args.max_tokens} tokens")
    prompts = [examples[k].prompt for k in chosen]
    print(f"{ENV} sampling on {machine_line('cpu')}: {DEFAULT_MODEL} fp32, training prompts {chosen} "
          f"({[lengths[k] for k in chosen]} tokens) x G={GROUP} responses of at most {TOKENS} tokens, temperature 1, "
          f"native engine, {free_memory(model.device) / 2**30:.1f} GiB free")
    engine = make_engine("native", model, tokenizer)
    now = native.cut_waves

    def each_row_its_own_pass(order, keys, room, slots=lambda n: n):
        return now(order, list(range(len(keys))), room, slots)

    def call(side: int):
        native.cut_waves = now if side else each_row_its_own_pass
        try:
            start = time.perf_counter()
            out = engine.generate(prompts, TOKENS, temperature=1.0, seed=7, num_return_sequences=GROUP)
            return time.perf_counter() - start, out
        finally:
            native.cut_waves = now

    engine.generate(["Say hi."], 4)  # warm-up: first-call costs outside both sides
    seconds: dict[int, list[float]] = {0: [], 1: []}
    outs = {}
    for side in ([1, 0, 0, 1] * args.repeats)[:2 * args.repeats]:
        t, outs[side] = call(side)
        seconds[side].append(t)
        print(f"  {('before', 'now')[side]}: {outs[side].batches} waves, {t:.1f} s", flush=True)
    before, after = (statistics.median(seconds[s]) for s in (0, 1))
    same = sum(a == b for a, b in zip(outs[0].token_ids, outs[1].token_ids))
    result = {"prompt_tokens": [lengths[k] for k in chosen], "before_s": before, "after_s": after,
              "speedup": before / after, "before_waves": outs[0].batches, "after_waves": outs[1].batches,
              "same_rows": same, "rows": len(outs[1].token_ids), "new_tokens": sum(outs[1].num_tokens)}
    print(f"each row charged a prompt pass (before): {outs[0].batches} waves, {before:.1f} s; the group's pass "
          f"charged once (now): {outs[1].batches} waves, {after:.1f} s: {before / after:.2f}x "
          f"({result['new_tokens']} new tokens; {same} of {result['rows']} rows the same tokens on both sides)")
    return result


if __name__ == "__main__":
    main()
