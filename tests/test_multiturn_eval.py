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
