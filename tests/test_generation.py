"""Batched chat generation on the tiny in-process model (plus one ``slow`` test on the real default
model): completion-only text, stopping at EOS, left padding, order, determinism, sampling seeds."""

import copy

import pytest
import torch

from trainers.engines.generation import GenerationResult, encode_prompts, generate, stop_token_ids
from trainers.engines.sampling import row_seeds

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Solve the puzzle step by step and "
                                                                               "give the answer in tags."}],
    [{"role": "user", "content": "1 2 3"}],
    [{"role": "user", "content": "Countdown: use the numbers 4 5 6 to reach the target 42."}],
]


def forced(model, tokenizer, script):
    """A copy of ``model`` whose every forward pass emits the next token of ``script`` (then repeats
    the last one), whatever the input."""
    model = copy.deepcopy(model)
    vocab = tokenizer.get_vocab()
    ids = [vocab[t] for t in script]
    calls = {"n": 0}

    def hook(module, args, out):
        tok = ids[min(calls["n"], len(ids) - 1)]
        calls["n"] += 1
        out = torch.full_like(out, -1e4)
        out[..., tok] = 1e4
        return out

    model.lm_head.register_forward_hook(hook)
    return model


def test_completion_only_and_counts(tiny_model, tiny_tokenizer):
    r = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=7)
    assert isinstance(r, GenerationResult)
    assert len(r.texts) == len(r.num_tokens) == len(r.finished) == len(PROMPTS)
    for text, n, ids, done in zip(r.texts, r.num_tokens, r.token_ids, r.finished):
        assert len(ids) == n <= 7
        if not done:
            assert n == 7
            assert text == tiny_tokenizer.decode(ids, skip_special_tokens=True)
        assert "<|im_start|>" not in text and "capital of France" not in text
    assert r.prompt_tokens == [len(x) for x in encode_prompts(tiny_tokenizer, PROMPTS)]
    assert r.seconds > 0 and r.batches == 1 and r.total_tokens == sum(r.num_tokens)


def test_stops_at_eos_and_skips_special_tokens(tiny_model, tiny_tokenizer):
    eos_first = forced(tiny_model, tiny_tokenizer, ["<|im_end|>"])
    r = generate(eos_first, tiny_tokenizer, PROMPTS[:2], max_new_tokens=10)
    assert r.texts == ["", ""] and r.num_tokens == [1, 1] and r.finished == [True, True]

    # a special token mid-text is dropped from the text; <|endoftext|> stops too; counts include the stop
    word = tiny_tokenizer.convert_ids_to_tokens(tiny_tokenizer("Paris")["input_ids"][0])
    text = tiny_tokenizer.convert_tokens_to_string([word])
    script = forced(tiny_model, tiny_tokenizer, [word, "<|im_start|>", word, "<|endoftext|>", word])
    r = generate(script, tiny_tokenizer, PROMPTS[:1], max_new_tokens=10)
    assert r.texts == [text * 2] and r.num_tokens == [4] and r.finished == [True]

    never = forced(tiny_model, tiny_tokenizer, [word])
    r = generate(never, tiny_tokenizer, PROMPTS[:1], max_new_tokens=5)
    assert r.texts == [text * 5] and r.num_tokens == [5] and r.finished == [False]


def test_stop_token_ids(tiny_model, tiny_tokenizer):
    ids = stop_token_ids(tiny_tokenizer, tiny_model)
    assert ids[0] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>") in ids
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_start|>") not in ids


def test_batching_and_left_padding_match_single_prompts(tiny_model, tiny_tokenizer):
    batched = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=12, batch_size=8)
    small = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=12, batch_size=2)
    singles = [generate(tiny_model, tiny_tokenizer, [p], max_new_tokens=12) for p in PROMPTS]
    assert batched.token_ids == [s.token_ids[0] for s in singles]  # and in the original order
    assert small.token_ids == batched.token_ids and small.batches == 3
    assert batched.texts == [s.texts[0] for s in singles]


def test_greedy_is_deterministic_and_ignores_model_generation_defaults(tiny_model, tiny_tokenizer):
    first = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=10)
    assert generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=10).token_ids == first.token_ids
    model = copy.deepcopy(tiny_model)
    model.generation_config.do_sample = True
    model.generation_config.temperature = 5.0
    model.generation_config.repetition_penalty = 50.0
    model.train()
    assert generate(model, tiny_tokenizer, PROMPTS, max_new_tokens=10).token_ids == first.token_ids
    assert model.training and model.generation_config.repetition_penalty == 50.0  # restored


def test_sampling_is_seeded_without_touching_global_rng(tiny_model, tiny_tokenizer):
    state = torch.random.get_rng_state()
    a = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=10, temperature=1.0, seed=1)
    b = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=10, temperature=1.0, seed=1)
    c = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=10, temperature=1.0, seed=2)
    assert torch.equal(state, torch.random.get_rng_state())
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    greedy = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=10)
    assert a.token_ids != greedy.token_ids
    nucleus = generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=10, temperature=1.0, top_p=1e-6, seed=3)
    assert nucleus.token_ids == greedy.token_ids  # top_p -> 0 keeps only the argmax


def test_a_rows_sample_depends_on_its_seed_alone(tiny_model, tiny_tokenizer):
    """One random stream per row: the batch size, the rows beside it and its position do not change
    a row's sample; one seed per call derives row k's seed from (seed, k) alone."""
    prompts = PROMPTS * 3
    whole = generate(tiny_model, tiny_tokenizer, prompts, max_new_tokens=10, temperature=1.0, seed=5, batch_size=64)
    for batch_size in (1, 4, 7):
        assert generate(tiny_model, tiny_tokenizer, prompts, max_new_tokens=10, temperature=1.0, seed=5,
                        batch_size=batch_size).token_ids == whole.token_ids, batch_size
    seeds = row_seeds(5, len(prompts))
    assert seeds == row_seeds(5, len(prompts) + 7)[:len(prompts)]  # not a function of the call's size
    assert generate(tiny_model, tiny_tokenizer, prompts, max_new_tokens=10, temperature=1.0,
                    seed=seeds).token_ids == whole.token_ids
    last = generate(tiny_model, tiny_tokenizer, prompts[-1:], max_new_tokens=10, temperature=1.0, seed=seeds[-1:])
    assert last.token_ids == whole.token_ids[-1:]
    with pytest.raises(ValueError, match="2 sampling seeds for 3 rows"):
        generate(tiny_model, tiny_tokenizer, PROMPTS[:3], max_new_tokens=4, temperature=1.0, seed=[1, 2])


def test_num_return_sequences_is_prompt_major(tiny_model, tiny_tokenizer):
    r = generate(tiny_model, tiny_tokenizer, PROMPTS[:3], max_new_tokens=8, temperature=1.0, seed=0,
                 num_return_sequences=4, batch_size=5)
    assert len(r.texts) == 12
    lengths = [len(x) for x in encode_prompts(tiny_tokenizer, PROMPTS[:3])]
    assert r.prompt_tokens == [n for n in lengths for _ in range(4)]
    assert len({tuple(ids) for ids in r.token_ids[:4]}) > 1  # distinct samples of one prompt
    g = generate(tiny_model, tiny_tokenizer, PROMPTS[:2], max_new_tokens=6, num_return_sequences=2)
    assert g.token_ids[0] == g.token_ids[1] and g.token_ids[2] == g.token_ids[3]


def test_plain_string_prompts_and_errors(tiny_model, tiny_tokenizer):
    r = generate(tiny_model, tiny_tokenizer, ["raw text prompt", "another"], max_new_tokens=3)
    assert len(r.texts) == 2
    assert generate(tiny_model, tiny_tokenizer, [], max_new_tokens=3).texts == []
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=0)
    with pytest.raises(ValueError, match="batch_size"):
        generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=2, batch_size=0)
    with pytest.raises(ValueError, match="top_p"):
        generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=2, top_p=0)
    with pytest.raises(TypeError, match="list of prompts"):
        generate(tiny_model, tiny_tokenizer, "a bare string", max_new_tokens=2)
    no_template = copy.deepcopy(tiny_tokenizer)
    no_template.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        generate(tiny_model, no_template, PROMPTS, max_new_tokens=2)


@pytest.mark.slow
def test_real_model_answers_and_stops(smollm2):
    model, tok = smollm2
    france = [{"role": "user", "content": "What is the capital of France?"}]
    other = [{"role": "user", "content": "Write one sentence about the sea, then list three fish and explain why "
                                         "each of them is interesting."}]
    r = generate(model, tok, [france, other], max_new_tokens=32)
    assert "Paris" in r.texts[0]
    assert r.finished[0] and r.num_tokens[0] < 32  # stopped at <|im_end|>
    assert r.token_ids[0][-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "<|im_end|>" not in r.texts[0] and "assistant" not in r.texts[0] and "capital of France?" not in r.texts[0]
    alone = generate(model, tok, [france], max_new_tokens=32)
    assert alone.token_ids[0] == r.token_ids[0]  # left padding next to a longer prompt changes nothing
