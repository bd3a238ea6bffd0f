"""The hf engine computes a group's prompt once (``trainers.engines.prompt_cache``): the same tokens
as every row computing its own, one prompt pass per distinct row, and nothing shared where a
model's cache cannot be copied row by row."""

import pytest
import torch

from conftest import build_tiny_model
from trainers.engines import make_engine
from trainers.engines.generation import encode_prompts, generate
from trainers.engines.prompt_cache import can_share_prompts, shared_prompt_cache

# Three prompts of different lengths (left padding in one batch); "hi" is a single token.
PROMPTS = ["Solve: 3 + 5 =", "What is the capital of France? Answer in one word please.", "hi"]
GROUP = 4


def prompt_passes(model):
    """Record the (rows, tokens) of every forward pass of ``model``'s decoder."""
    shapes: list[tuple[int, int]] = []

    def hook(module, args, kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))

    return shapes, model.model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.fixture(scope="module")
def double_model(tiny_tokenizer):
    # float64: computing a prompt's last token apart from the rest rounds too little to change a token
    return build_tiny_model(tiny_tokenizer).double()


@pytest.mark.parametrize("interleaved", [False, True], ids=["a-group-together", "copies-apart"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_groups_prompt_is_computed_once_with_the_same_tokens(double_model, tiny_tokenizer, temperature,
                                                               interleaved):
    width = max(len(ids) for ids in encode_prompts(tiny_tokenizer, PROMPTS))
    rows = len(PROMPTS) * GROUP
    if interleaved:  # A B C A B C ...: each row copies a distinct row that is not its neighbour
        prompts, kw = PROMPTS * GROUP, dict(num_return_sequences=1, sort=False)
    else:  # A A A A B B B B ...
        prompts, kw = PROMPTS, dict(num_return_sequences=GROUP)
    kw |= dict(max_new_tokens=10, batch_size=rows, temperature=temperature, seed=3)
    shapes, handle = prompt_passes(double_model)
    try:
        alone = generate(double_model, tiny_tokenizer, prompts, share_prompts=False, **kw)
        assert shapes[0] == (rows, width)  # every row computes its own prompt
        shapes.clear()
        shared = make_engine("hf", double_model, tiny_tokenizer).generate(prompts, **kw)
        # each distinct prompt once but its last token, then every row's last prompt token
        assert shapes[:2] == [(len(PROMPTS), width - 1), (rows, 1)]
    finally:
        handle.remove()
    assert shared.token_ids == alone.token_ids
    assert shared.texts == alone.texts


def test_a_batch_of_distinct_prompts_computes_them_as_generate_does(double_model, tiny_tokenizer):
    ids = encode_prompts(tiny_tokenizer, PROMPTS)
    width = max(map(len, ids))
    batch = torch.tensor([[0] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    assert shared_prompt_cache(double_model, batch, mask) is None  # nothing to share
    rows, masks = batch.repeat_interleave(2, 0), mask.repeat_interleave(2, 0)
    assert shared_prompt_cache(double_model, rows, masks).get_seq_length() == width - 1
    empty = masks.clone()
    empty[0] = 0  # an empty prompt: no last token to leave for generate
    assert shared_prompt_cache(double_model, rows, empty) is None


def test_a_population_on_the_hf_engine_shares_no_prompt(tiny_model, tiny_tokenizer):
    """Low-rank members are hooks that give each row its own weights: rows of one prompt under
    two members differ, so no prompt pass may be shared among them."""
    from trainers.es.noise import lowrank
    from trainers.es.noise.members import LowRankMembers

    engine = make_engine("hf", tiny_model, tiny_tokenizer)
    members = LowRankMembers(lowrank.select_layers(tiny_model, None, 1), [1, 2], [1.0, -1.0], 0.05, 1)
    shapes, handle = prompt_passes(tiny_model)
    try:
        out = engine.generate([PROMPTS[0]] * 4, max_new_tokens=4, perturbation=members)
    finally:
        handle.remove()
    assert shapes[0][0] == 4 and shapes[0][1] > 1  # all four rows computed their prompt
    assert out.token_ids[0] == out.token_ids[1] and out.token_ids[2] == out.token_ids[3]


def test_a_model_whose_cache_cannot_be_copied_by_row_shares_nothing(tiny_tokenizer):
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(num_hidden_layers=2, hidden_size=32, state_size=4, vocab_size=len(tiny_tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        mamba = MambaForCausalLM(config).eval()
    assert not can_share_prompts(mamba)
    assert not make_engine("hf", mamba, tiny_tokenizer).shares_prompts
    out = make_engine("hf", mamba, tiny_tokenizer).generate(PROMPTS[:1], max_new_tokens=4, num_return_sequences=2)
    assert out.token_ids[0] == out.token_ids[1]  # generated as before, every row its own prompt


def test_a_peft_model_shares_its_prompt_with_its_adapter_on(double_model, tiny_tokenizer):
    import copy

    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(copy.deepcopy(double_model), LoraConfig(r=2, target_modules=["q_proj", "v_proj"],
                                                                  init_lora_weights=False))
    assert can_share_prompts(peft)
    kw = dict(max_new_tokens=8, batch_size=8, temperature=1.0, seed=5, num_return_sequences=GROUP)
    alone = generate(peft, tiny_tokenizer, PROMPTS[:2], share_prompts=False, **kw)
    shared = make_engine("hf", peft, tiny_tokenizer).generate(PROMPTS[:2], **kw)
    assert shared.token_ids == alone.token_ids
