"""Our environments in TRL's GRPOTrainer (``trainers.trl``, the ``trl`` extra; skipped without it):
the dataset's prompts are the token ids our engines feed the model, openings included; the
reward scores TRL's completions as our rollouts do; and docs/environments.md's example trains for
two steps on a tiny random model, on a CPU."""

import copy
import math
import re
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
pytest.importorskip("datasets")

import llm_envs  # noqa: E402
from llm_envs import BatchScorer  # noqa: E402
from trainers.trl import EnvReward, dataset, prompt_text  # noqa: E402
from trainers.common.rollout import rollout  # noqa: E402
from trainers.engines.generation import GenerationResult, encode_prompts, render_prompt  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "environments.md"
COUNTDOWN_RIGHT = "78 - 51 = 27, 27 + 21 + 22 = 70</think>\n<answer>78 - 51 + 21 + 22</answer>"


def trl_prompt_ids(tokenizer, text: str) -> list[int]:
    """How GRPOTrainer tokenizes a text prompt (``_tokenize_prompts``: ``processing_class(text=...)``)."""
    return tokenizer(text=[text])["input_ids"][0]


@pytest.mark.parametrize("env_id", [*llm_envs.ENV_IDS, "rg/basic_arithmetic-v0"])
def test_dataset_prompts_are_what_our_engines_feed_the_model(env_id, tiny_tokenizer, shared_data):
    kwargs = {"data_dir": shared_data("math"), "hub": False} if env_id == "MATH-v0" else {}
    env = llm_envs.make(env_id, **kwargs)
    rows = dataset(env, tiny_tokenizer, "test", limit=2)
    assert rows.column_names == ["prompt", "split", "index", "example_id"] and len(rows) == 2
    for row, example in zip(rows, env.examples("test")):
        assert row["prompt"] == render_prompt(tiny_tokenizer, example.prompt)
        assert row["prompt"].endswith(example.opening)
        assert trl_prompt_ids(tiny_tokenizer, row["prompt"]) == encode_prompts(tiny_tokenizer, [example.prompt])[0]
        assert (row["split"], row["example_id"]) == ("test", example.id)
    if env_id in ("Countdown-v0", "Sudoku-v0", "rg/basic_arithmetic-v0"):  # the paper's opening
        assert rows[0]["prompt"].endswith("<|im_start|>assistant\nLet me solve this step by step.\n<think>")


def test_a_tokenizer_that_adds_a_bos_gets_one_bos(tiny_tokenizer):
    """TRL tokenizes text prompts with the tokenizer's special tokens; a template that writes the
    BOS itself (Llama 3's) would then give two. Here the tiny tokenizer's BOS is <|im_start|>,
    which its ChatML template writes first."""
    from tokenizers import processors

    tok = copy.deepcopy(tiny_tokenizer)
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, bos)])
    assert tok("")["input_ids"] == [bos]
    example = llm_envs.make("Countdown-v0").examples("test")[0]
    ours = encode_prompts(tok, [example.prompt])[0]
    assert ours[0] == bos and trl_prompt_ids(tok, render_prompt(tok, example.prompt))[:2] == [bos, bos]
    assert trl_prompt_ids(tok, prompt_text(tok, example)) == ours


class FixedTexts:
    """An engine stand-in whose completions are given."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, **kwargs):
        n = len(self.texts)
        return GenerationResult(self.texts, [1] * n, [True] * n, [[0]] * n, [1] * n, 0.0)


def test_the_reward_is_our_rollouts_reward():
    env = llm_envs.make("Countdown-v0")
    example = env.examples("test")[0]
    completions = [COUNTDOWN_RIGHT, "</think>\n<answer>78 + 51</answer>", "no tags at all"]
    metrics = {}
    rewards = EnvReward(env)(prompts=["p"] * 3, completions=completions, completion_ids=[[1]] * 3,
                             split=["test"] * 3, index=[0] * 3, example_id=[example.id] * 3, trainer_state=None,
                             log_metric=metrics.__setitem__)
    with BatchScorer(env) as scorer:
        ours = rollout(FixedTexts(completions), scorer, [example] * 3, max_new_tokens=8)
    assert rewards == [s.reward for s in ours.scores] == [1.1, 0.1, 0.0]  # the opening's <think> counts
    assert metrics == {"correct": 1 / 3, "score_errors": 0.0, "parts/answer": 1 / 3, "parts/format": 2 / 3}
    with pytest.raises(KeyError, match="'split' and 'index' columns"):
        EnvReward(env)(prompts=["p"], completions=["x"])
    env.close()


@pytest.mark.parametrize("env_id", ["Countdown-v0", "Conciseness-v0", "rg/basic_arithmetic-v0"])
def test_the_docs_example_trains(env_id, tiny_model, tiny_tokenizer, tmp_path, monkeypatch, one_thread):
    """docs/environments.md's example as written, two steps, with the tiny model for the default
    one and CPU-sized settings in GRPOConfig."""
    code = re.search(r"```python\n(.*?)```", DOCS.read_text().split("<!-- trl-example -->", 1)[1], re.DOTALL)[1]
    assert code.count('"Countdown-v0"') == 1
    code = code.replace('"Countdown-v0"', repr(env_id))

    model = copy.deepcopy(tiny_model)
    before = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setattr("trainers.common.models.load_model", lambda *a, **k: (model, copy.deepcopy(tiny_tokenizer)))
    real_config = trl.GRPOConfig
    monkeypatch.setattr(trl, "GRPOConfig", lambda **kw: real_config(**{
        **kw, "output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "num_generations": 2,
        "per_device_train_batch_size": 4, "max_completion_length": 12, "max_steps": 2, "learning_rate": 1e-2,
        "save_strategy": "no", "report_to": [], "disable_tqdm": True, "seed": 0}))
    calls = []
    real_call = EnvReward.__call__

    def recorded(self, prompts, completions, **columns):
        rewards = real_call(self, prompts, completions, **columns)
        calls.append((prompts, columns["split"], columns["index"], rewards))
        return rewards

    monkeypatch.setattr(EnvReward, "__call__", recorded)

    namespace = {}
    exec(compile(code, str(DOCS), "exec"), namespace)

    trainer, env = namespace["trainer"], namespace["env"]
    assert trainer.state.global_step == 2 and len(calls) == 2
    steps = [h for h in trainer.state.log_history if f"rewards/{env_id}/mean" in h]
    assert len(steps) == 2
    for log in steps:
        assert math.isfinite(log[f"rewards/{env_id}/mean"]) and math.isfinite(log["loss"])
        assert log["score_errors"] == 0.0 and 0.0 <= log["correct"] <= 1.0
    rows = trainer.train_dataset
    for prompts, splits, indices, rewards in calls:  # TRL generated from the prompt of the example scored
        assert len(prompts) == len(rewards) == 4 and all(math.isfinite(r) for r in rewards)
        for prompt, split, index in zip(prompts, splits, indices):
            example = env.examples(split)[index]
            assert prompt == rows[index]["prompt"] == prompt_text(tiny_tokenizer, example)
            assert prompt.endswith(example.opening)
    changed = any(not p.detach().equal(b) for p, b in zip(model.parameters(), before))
    if env_id == "Conciseness-v0":  # a dense reward (length): every group has a signal
        assert changed
