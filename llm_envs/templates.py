"""A prompt as the text a model generates from: the one rendering rule of every engine
(``trainers.engines``) and of ``trainers.trl``, so a prompt is the same text wherever it is used."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Prompt = list[dict[str, Any]] | str


def render_chat(tokenizer, prompt: Prompt) -> str:
    """The text of one prompt: chat messages through the chat template (with the assistant
    generation prompt); a plain string is used as it is.

    Chat messages that end with an assistant message (an example's opening) render with
    ``continue_final_message``: the text ends exactly with that message's content, so every engine
    that generates from this text continues the opening."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, Sequence) or not all(isinstance(m, dict) for m in prompt):
        raise TypeError(f"a prompt must be a list of chat messages ({{'role': ..., 'content': ...}}) or a string, "
                        f"got {type(prompt).__name__}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template, so chat-message prompts cannot be rendered; "
                         "pass plain-string prompts or set tokenizer.chat_template")
    if not prompt or prompt[-1].get("role") != "assistant":
        return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    opening = prompt[-1].get("content") or ""
    text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=False, continue_final_message=True,
                                         tokenize=False)
    if not text.endswith(opening) and text.endswith(opening.rstrip()):
        text += opening[len(opening.rstrip()):]  # a template that trims message content drops trailing space
    if not text.endswith(opening):
        raise ValueError(f"the chat template does not end the rendered prompt with the assistant opening "
                         f"{opening!r}, so generation cannot continue it")
    return text
