"""A tiny environment for testing the core and the trainers (importable, so worker processes
can unpickle it)."""

from __future__ import annotations

import os
import time

from llm_envs import Example, Score, TaskEnv, chat, register, require


class EchoEnv(TaskEnv):
    """Say the number back. Completions "hang" (a Python loop), "sleep" (a blocking call that a
    signal interrupts), "c-loop" (hours in C code that no signal interrupts) and "exit" (the process
    exits with code 3, as a crash in a C extension would) misbehave on purpose."""

    max_new_tokens = 8

    def build_split(self, split: str) -> list[Example]:
        return [Example(f"{split}-{i}", chat(f"Say {i}."), str(i)) for i in range(5)]

    def parse_row(self, row, index):
        return Example(str(row.get("id", index)), chat(require(row, "question")), require(row, "answer"))

    def score_completion(self, completion: str, example: Example) -> Score:
        if completion == "hang":
            while True:
                pass
        if completion == "sleep":
            time.sleep(60)
        if completion == "c-loop":
            sum(range(10**12))
        if completion == "exit":
            os._exit(3)
        if completion == "boom":
            raise RuntimeError("scorer bug")
        ok = completion.strip() == example.answer
        return Score(float(ok), ok, {"exact": float(ok)})


register("Echo-v0", EchoEnv)


class CheapEchoEnv(EchoEnv):
    """EchoEnv declared a cheap pure-Python scorer: scored in this process under a timer."""

    score_workers = 0


register("CheapEcho-v0", CheapEchoEnv)


class LetterEnv(TaskEnv):
    """Write the letter "a": reward = the share of the completion's characters that are "a" (0 for
    an empty one). Trivially learnable: RL trainers' tests check that the reward rises."""

    max_new_tokens = 6
    score_workers = 0

    def __init__(self, train_size: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.train_size = train_size

    def build_split(self, split: str) -> list[Example]:
        n = self.train_size if split == "train" else 4
        return [Example(f"{split}-{i}", chat(f"Write the letter a. ({i})"), "a") for i in range(n)]

    def parse_row(self, row, index):
        return Example(str(row.get("id", index)), chat(require(row, "question")), require(row, "answer"))

    def score_completion(self, completion: str, example: Example) -> Score:
        share = completion.count(example.answer) / len(completion) if completion else 0.0
        return Score(share, share >= 0.5, {"share": share})


register("Letter-v0", LetterEnv)


class OpenedEchoEnv(CheapEchoEnv):
    """Say the number back after an opening of the assistant's turn: "The number is " for the env,
    "Number: " for example 4 (its own). ``correct`` when the scorer receives exactly the whole turn
    (``answer``), so it tells whether the opening was put in front of the completion."""

    opening = "The number is "

    def build_split(self, split: str) -> list[Example]:
        return [Example(f"{split}-{i}", chat(f"Say {i}."), f"The number is {i}") for i in range(4)] + [
            Example(f"{split}-4", chat("Say 4.", opening="Number: "), "Number: 4")]


register("OpenedEcho-v0", OpenedEchoEnv)
