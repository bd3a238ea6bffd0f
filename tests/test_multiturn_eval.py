"""``python -m eval`` and its tables on a multi-turn env: pass@1 and mean return of episodes, turns,
tool calls and tool errors per episode."""

from __future__ import annotations

import json

import eval.__main__ as cli
from eval import harness, table
from tests.test_multiturn import Scripted

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "78 - 51 + 21 + 22"}}</tool_call>'
BAD = '<tool_call>{"name": "calc", "arguments": {}}</tool_call>'
ANSWER = "<think>70</think>\n<answer>78 - 51 + 21 + 22</answer>"  # right for test example 0 only


def test_eval_measures_episodes(tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch, capsys):
    engines = []
    monkeypatch.setattr(harness.LazyModel, "engine",
                        lambda self: engines.append(Scripted(tiny_tokenizer, [CALL, BAD, ANSWER])) or engines[-1])
    args = ["--env", "Countdown-calc-v0", "--model", str(tiny_model_dir), "--limit", "2", "--out", str(tmp_path),
            "--max-new-tokens", "400", "--env-args", '{"test_size": 2}']
    [summary] = cli.main(args)
    assert summary["pass@1"] == 0.5 and abs(summary["reward_mean"] - (1.1 + 0.1) / 2) < 1e-9
    assert (summary["turns_mean"], summary["tool_calls_mean"], summary["tool_errors_mean"]) == (3, 2, 1)
    assert summary["solved_at_turn"] == {"1": 0.0, "2": 0.0, "3": 0.5}  # two tool turns, then the answer
    assert "turns 3.00  tool calls 2.00  tool errors 1.00" in capsys.readouterr().out
    rows = [json.loads(line) for line in open(next(tmp_path.glob("*.jsonl")))]
    assert [m["role"] for m in rows[0]["messages"]][-5:] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert rows[0]["return"] > 1 and rows[1]["tool_errors"] == 1
    [second] = cli.main(args)  # episodes are regenerated, never read from the generation cache
    assert not second["cached"] and [len(e.calls) for e in engines] == [3, 3]
    [t] = table.build([summary], "episodes")
    assert t.header[1:] == ["pass@1 (%)", "pass@k (%)", "Return", "Turns", "Tool calls", "Tool errors",
                            "Solved at turn 1 / 2 / ... (%)"]
    assert t.rows[0][1:] == ["50.0", "50.0 (k=1)", "0.600", "3.00", "2.00", "1.00", "0.0 / 0.0 / 50.0"]
    older = {k: v for k, v in summary.items() if k != "solved_at_turn"}  # a summary written before the column
    assert table.build([older], "episodes")[0].rows[0][-1] == "–"


def test_the_last_reply_stays_and_a_missing_part_counts_zero(tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch,
                                                            capsys):
    """The env's reply to a truncated last turn is in the record, and a part only some episodes end
    with ("guesses" here is every episode's, "solved" too) is averaged over all of them, missing = 0."""
    monkeypatch.setattr(harness.LazyModel, "engine", lambda self: Scripted(tiny_tokenizer, ["<guess>0</guess>", "hmm"]))
    [summary] = cli.main(["--env", "GuessNumber-v0", "--model", str(tiny_model_dir), "--limit", "2", "--out",
                          str(tmp_path), "--env-args", '{"max_turns": 2, "test_size": 2}'])
    rows = [json.loads(line) for line in open(next(tmp_path.glob("*.jsonl")))]
    assert rows[0]["truncated"] and rows[0]["messages"][-1] == {
        "role": "user", "content": "I could not read a guess: write it as <guess>N</guess>."}
    assert summary["return_mean"] == summary["reward_mean"] == 0.0 and summary["truncated_rate"] == 1.0
    rows_with_gaps = [{"parts": {"malformed": 1.0}, "reward": 0.0, "correct": False, "error": None}] + \
                     [{"parts": {}, "reward": 0.0, "correct": False, "error": None}] * 3
    entry = {"tokens": 4, "seconds": 1.0}
    parts = harness.summarize_split(rows_with_gaps, entry, harness.EvalConfig(samples=1), None)["parts_mean"]
    assert parts == {"malformed": 0.25}  # not 1.0, the mean of the one row that has it


def test_eval_warns_when_most_episodes_end_cut_at_their_first_turn(tiny_model_dir, tiny_tokenizer, tmp_path,
                                                                   monkeypatch, capsys):
    class Rambling(Scripted):  # every turn runs to the token limit: no stop token, no stop string
        def generate(self, prompts, max_new_tokens=64, **kwargs):
            out = super().generate(prompts, max_new_tokens=3, **kwargs)
            out.finished = [False] * len(prompts)
            return out

    monkeypatch.setattr(harness.LazyModel, "engine", lambda self: Rambling(tiny_tokenizer, ["I think the number is"]))
    cli.main(["--env", "GuessNumber-v0", "--model", str(tiny_model_dir), "--limit", "2", "--out", str(tmp_path),
              "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if "warning:" in x]
    assert "2 of 2 episodes ended at their first turn, cut at 3 new tokens" in line and "'</guess>'" in line
    assert f"python -m llm_envs.check GuessNumber-v0 --model {tiny_model_dir} --max-new-tokens 3" in line


def test_tables_never_average_unlike_evaluations():
    """Two evaluations of the base model with other token limits and openings were one row, as if
    seeds; now each setting gets its own row, and only seeds of one setting are averaged."""
    common = dict(env="GuessNumber-v0", split="test", base_model="m", method="Original", samples=1, temperature=0.0,
                  n=8, turns_mean=2.0, tool_calls_mean=0.0, tool_errors_mean=0.0, reward_mean=0.5)
    records = [dict(common, **{"pass@1": 0.5}, max_new_tokens=48, env_args={}),
               dict(common, **{"pass@1": 0.25}, max_new_tokens=160, env_args={"opening": "<guess>"}),
               dict(common, **{"pass@1": 0.75}, method="ES", seed=0, max_new_tokens=48, env_args={}),
               dict(common, **{"pass@1": 0.25}, method="ES", seed=1, max_new_tokens=48, env_args={})]
    [t] = table.episode_table(records)
    rows = {r[0]: r[1] for r in t.rows}
    assert rows == {'m Original (env_args={}, max_new_tokens=48)': "50.0",
                    'm Original (env_args={"opening": "<guess>"}, max_new_tokens=160)': "25.0",
                    "m ES": "50.0"}  # the two ES seeds are like evaluations: their mean
    [t1] = table.method_table([dict(r, env="Countdown-v0") for r in records])  # Table 1: the odd one's own row
    assert t1.rows == [["m", "50.0", "50.0"], ['m (env_args={"opening": "<guess>"}, max_new_tokens=160)', "25.0‡", "–"]]
