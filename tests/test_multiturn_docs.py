"""docs/writing-an-env.md's multi-turn example: it runs as a script, and ES and GRPO train on it
for a step each on a tiny model (as ``--env module:Product-v0``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from trainers.es import train as es
from trainers.rl import grpo

PAGE = Path(__file__).resolve().parents[1] / "docs" / "writing-an-env.md"


def example_code() -> str:
    block = PAGE.read_text().split("<!-- multiturn-env-example -->", 1)[1]
    return re.search(r"```python\n(.*?)```", block, re.DOTALL).group(1)


def test_the_example_runs_and_trains(tiny_model_dir, tmp_path, monkeypatch):
    module = tmp_path / "product_envs.py"
    module.write_text(example_code())
    result = subprocess.run([sys.executable, str(module)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    monkeypatch.syspath_prepend(str(tmp_path))
    common = ["--env", "product_envs:Product-v0", "--model", str(tiny_model_dir), "--max-new-tokens", "8",
              "--eval-every", "0", "--seed", "0"]
    es.main([*common, "--out", str(tmp_path / "es"), "--iterations", "1", "--population", "2", "--sigma", "0.05"])
    grpo.main([*common, "--out", str(tmp_path / "grpo"), "--steps", "1", "--batch-size", "2", "--group-size", "2"])
    for run in ("es", "grpo"):
        log = [json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
        assert any("eval_reward" in r for r in log) and (tmp_path / run / "final").is_dir()
