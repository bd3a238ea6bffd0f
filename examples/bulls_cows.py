import random

import gymnasium as gym
from llm_envs import Example, MultiTurnEnv, Reply, chat, register, require, tool, tool_prompt

COST = 0.1  # what each revealed digit costs the episode's reward


def digit_at(position: int, state: dict, example: Example) -> str:
    """Reveal one digit of the secret code. Each use costs 0.1 of the reward.

    Args:
        position: which digit, counted from 1 on the left
    """
    code = example.answer  # the hidden code: the env passes `example` and `state`, the model never sees them
    if not 1 <= position <= len(code):
        raise ValueError(f"position must be 1 to {len(code)}")
    state["reveals"] += 1
    return f"digit {position} is {code[position - 1]}"


DIGIT_AT = tool(digit_at)  # the schema shows `position` only


class BullsAndCowsEnv(MultiTurnEnv):
    """Find a code of distinct digits from bulls-and-cows feedback, with a digit_at tool."""

    max_turns = 6  # assistant turns per episode, tool turns included
    max_new_tokens = 48  # per turn
    score_workers = 0  # cheap pure Python: turns are processed in this process, under a timer
    stop_strings = ("</tool_call>", "</guess>")  # a turn ends after a call or a guess

    def __init__(self, length: int = 3, train_size: int = 200, test_size: int = 50, **kwargs):
        super().__init__(**kwargs)  # data, seed, opening, max_turns, stop_strings
        self.length, self.sizes = length, {"train": train_size, "test": test_size}

    def prompt(self) -> list[dict[str, str]]:
        return chat(f"I am thinking of a code of {self.length} different digits. Guess it as <guess>"
                    f"{'123456789'[:self.length]}</guess>. After each guess I say how many digits are right and "
                    f"in the right place (bulls) and how many are right but elsewhere (cows). You have "
                    f"{self.max_turns} turns.", system=tool_prompt([DIGIT_AT]))

    def build_split(self, split: str) -> list[Example]:  # the code is hidden: every prompt is the same text
        rng = random.Random(f"{self.seed}-{split}")
        codes = ["".join(rng.sample("0123456789", self.length)) for _ in range(self.sizes[split])]
        return [Example(f"{split}-{i}", self.prompt(), answer=code) for i, code in enumerate(codes)]

    def parse_row(self, row, index: int) -> Example:  # rows of data={"test": "codes.jsonl"}: {"code": "042"}
        return Example(str(index), self.prompt(), answer=require(row, "code", str))

    def tools(self):
        return [DIGIT_AT]

    def begin(self, example: Example) -> dict:
        return {"reveals": 0}  # the episode's state: `digit_at` and `respond` both get it

    def respond(self, text: str, state: dict, example: Example) -> Reply:  # a turn that called no tool
        guess = text.rsplit("<guess>", 1)[-1].split("</guess>", 1)[0].strip() if "<guess>" in text else ""
        parts = {"solved": 0.0, "reveals": float(state["reveals"])}  # the same keys on every turn
        if guess == example.answer:
            return Reply(reward=max(0.0, 1.0 - COST * state["reveals"]), done=True, correct=True,
                         parts=dict(parts, solved=1.0))
        if len(guess) != self.length:
            return Reply([{"role": "user", "content": f"Write a guess of {self.length} digits in <guess></guess>."}],
                         parts=parts)
        bulls = sum(g == c for g, c in zip(guess, example.answer))
        cows = len(set(guess) & set(example.answer)) - bulls
        return Reply([{"role": "user", "content": f"{bulls} bulls, {cows} cows."}], parts=parts)

    def good_reply(self, example: Example) -> str:  # what `python -m llm_envs.check` steps as a solving turn
        return f"<guess>{example.answer}</guess>"


register("BullsAndCows-v0", BullsAndCowsEnv)

if __name__ == "__main__":
    env = gym.make("BullsAndCows-v0")
    messages, info = env.reset(options={"split": "test", "index": 0})
    code = env.unwrapped.examples("test")[0].answer
    reply, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "digit_at", "arguments": {"position": 1}}</tool_call>')
    assert reply == [{"role": "tool", "name": "digit_at", "content": f"digit 1 is {code[0]}"}] and not terminated
    reply, reward, terminated, truncated, info = env.step(f"<guess>{code}</guess>")
    assert terminated and info["correct"] and reward == 0.9 and info["tool_calls"] == 1
    print("ok: a digit revealed, the code guessed, reward", reward)
