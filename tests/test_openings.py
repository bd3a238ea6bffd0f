"""Openings of the assistant's turn: declared per env or per example, rendered so that generation
continues them (ChatML and Qwen2.5 templates), put in front of the completion on every scoring
path, and recorded with each response by ``rollout`` and the eval harness (whose KL covers the
generated tokens only)."""

import copy
import json

import pytest
import torch
import yaml

import eval.__main__ as cli
import llm_envs
from llm_envs import BatchScorer, Example, chat, with_opening
from toy_envs import OpenedEchoEnv
from trainers.common.rollout import rollout
from trainers.engines.generation import encode_prompts, generate, render_prompt
from trainers.engines.hf import HFEngine

# Qwen2.5-Instruct's chat template without its tool-calling branches.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PAPER_OPENING = "Let me solve this step by step.\n<think>"


def test_example_opening_and_chat():
    plain = chat("Hi", system="Be brief.")
    opened = chat("Hi", system="Be brief.", opening=PAPER_OPENING)
    assert opened == plain + [{"role": "assistant", "content": PAPER_OPENING}]
    assert Example("a", opened, None).opening == PAPER_OPENING and Example("b", plain, None).opening == ""
    assert with_opening(opened, "Sure: ")[-1] == {"role": "assistant", "content": "Sure: "}
    assert with_opening(opened, "") == plain and with_opening(plain, "") == plain


def test_env_declares_openings_per_env_and_per_example(tmp_path):
    env = OpenedEchoEnv()
    assert [e.opening for e in env.examples("test")] == ["The number is "] * 4 + ["Number: "]
    obs, info = env.reset(options={"split": "test", "index": 2})
    assert obs.endswith("Say 2.\n\nThe number is ") and info["messages"][-1]["role"] == "assistant"
    off = OpenedEchoEnv(opening=False).examples("test")
    assert all(e.opening == "" and e.prompt[-1]["role"] == "user" for e in off)
    assert {e.opening for e in OpenedEchoEnv(opening="Sure: ").examples("test")} == {"Sure: "}
    rows = tmp_path / "q.jsonl"
    rows.write_text(json.dumps({"question": "Say 9.", "answer": "The number is 9"}) + "\n")
    [from_file] = OpenedEchoEnv(data={"test": rows}).examples("test")
    assert from_file.opening == "The number is "
    with pytest.raises(TypeError, match="opening must be"):
        OpenedEchoEnv(opening=None)
    # The paper's two envs open with the paper's text; an env option turns it off.
    for env_id in ("Sudoku-v0", "Countdown-v0"):
        assert llm_envs.make(env_id).examples("test")[0].opening == PAPER_OPENING
        assert llm_envs.make(env_id, opening=False).examples("test")[0].opening == ""


def test_the_scorer_receives_opening_plus_completion():
    """``correct`` means the scorer saw exactly the whole assistant turn; every path agrees."""
    env = OpenedEchoEnv()
    examples = list(env.examples("test"))
    completions = ["0", "1", "2", "The number is 3", "4"]  # the 4th repeats its opening: not the turn
    expected = [True, True, True, False, True]
    assert [env.score(c, e).correct for c, e in zip(completions, examples)] == expected
    assert [s.correct for s in env.score_batch(completions, examples)] == expected
    with BatchScorer(env, workers=1) as in_a_worker:
        assert [s.correct for s in in_a_worker.score_batch(completions, examples)] == expected
    env.reset(options={"split": "test", "index": 4})
    assert env.step("4")[1] == 1.0
    env.close()


@pytest.mark.parametrize("template", ["chatml", "qwen2.5"])
@pytest.mark.parametrize("opening", [PAPER_OPENING, "Answer: ", "Let me think.\n\n"])
def test_the_rendered_prompt_ends_exactly_with_the_opening(tiny_tokenizer, template, opening):
    tok = copy.deepcopy(tiny_tokenizer)
    if template == "qwen2.5":
        tok.chat_template = QWEN25_TEMPLATE
    for system in (None, "You are a helpful assistant."):
        plain = chat("Solve the puzzle.", system=system)
        text = render_prompt(tok, with_opening(plain, opening))
        # the generation prompt, then the opening: the model continues the assistant's turn
        assert text == render_prompt(tok, plain) + opening
    assert encode_prompts(tok, [with_opening(plain, opening)])[0] == tok(text, add_special_tokens=False)["input_ids"]


def test_generation_continues_the_opening(tiny_model, tiny_tokenizer):
    prompt = chat("Solve the puzzle step by step.", opening=PAPER_OPENING)
    out = generate(tiny_model, tiny_tokenizer, [prompt], max_new_tokens=5, stop_ids=[])
    ids = encode_prompts(tiny_tokenizer, [prompt])[0]
    assert out.prompt_tokens == [len(ids)]
    with torch.no_grad():  # greedy by hand from the rendered prompt, opening included
        for _ in range(5):
            ids = ids + [int(tiny_model(torch.tensor([ids])).logits[0, -1].argmax())]
    assert out.token_ids[0] == ids[-5:]
    assert out.texts[0] == tiny_tokenizer.decode(ids[-5:])  # the generated text only, not the opening


def test_rollout_records_the_opening_of_each_response(tiny_model, tiny_tokenizer):
    env = OpenedEchoEnv()
    examples = list(env.examples("test"))
    with BatchScorer(env) as scorer:
        r = rollout(HFEngine(tiny_model, tiny_tokenizer), scorer, examples, max_new_tokens=4, samples=2)
    assert r.openings == [e.opening for e in examples for _ in range(2)]
    assert r.scores == [env.score(t, e) for t, e in zip(r.texts, r.examples)]
    assert not any(t.startswith(("The number is", "Number:")) for t in r.texts)


def test_eval_records_the_opening_and_its_kl_covers_generated_tokens_only(tiny_model, tiny_tokenizer,
                                                                          tiny_model_dir, tmp_path):
    from conftest import build_tiny_model
    from trainers.common.models import save_model

    run = tmp_path / "es-Conciseness-v0-x"
    tuned = build_tiny_model(tiny_tokenizer, seed=1)  # "fine-tuned": other weights, the same vocabulary
    save_model(tuned, tiny_tokenizer, run / "final")
    (run / "config.yaml").write_text(yaml.safe_dump({"env": "Conciseness-v0", "model": str(tiny_model_dir)}))
    opening = "The answer is"
    [summary] = cli.main(["--env", "Conciseness-v0", "--env-args", json.dumps({"opening": opening}), "--model",
                          str(run), "--samples", "2", "--kl-to", "base", "--limit", "2", "--max-new-tokens", "6",
                          "--score-workers", "0", "--cache", "off"])
    rows = [json.loads(line) for line in open(summary["file"].replace(".summary.json", ".jsonl"))]
    assert [r["opening"] for r in rows] == [opening] * 4
    env = llm_envs.make("Conciseness-v0", opening=opening)
    examples = list(env.examples("test"))[:2]
    assert [r["reward"] for r in rows] == [env.score(r["completion"], examples[i // 2]).reward
                                           for i, r in enumerate(rows)]
    # The same samples again, and k3 by hand over the generated tokens, the opening in the prompt.
    out = generate(tuned, tiny_tokenizer, [e.prompt for e in examples], max_new_tokens=6, temperature=1.0, seed=0,
                   num_return_sequences=2)
    assert out.texts == [r["completion"] for r in rows]
    prompts = encode_prompts(tiny_tokenizer, [e.prompt for e in examples])
    for i, (row, c) in enumerate(zip(rows, out.token_ids)):
        p = prompts[i // 2]
        with torch.no_grad():
            lm = torch.log_softmax(tuned(torch.tensor([p + c])).logits[0].double(), -1)
            lb = torch.log_softmax(tiny_model(torch.tensor([p + c])).logits[0].double(), -1)
        log_r = torch.stack([lb[len(p) - 1 + k, t] - lm[len(p) - 1 + k, t] for k, t in enumerate(c)])
        assert row["kl"] == pytest.approx(float((log_r.exp() - log_r - 1).mean()), rel=1e-4, abs=1e-7)
