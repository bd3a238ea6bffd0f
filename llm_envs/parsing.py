"""Pulling answers out of model text: tagged blocks and fenced code."""

from __future__ import annotations

import re

_BLOCK_CACHE: dict[str, re.Pattern[str]] = {}


def tag_blocks(text: str, tag: str) -> list[str]:
    """The contents of every ``<tag>...</tag>`` block in ``text``, in order."""
    pattern = _BLOCK_CACHE.get(tag)
    if pattern is None:
        pattern = _BLOCK_CACHE[tag] = re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL)
    return pattern.findall(text)


def last_tag(text: str, tag: str) -> str | None:
    """The content of the last ``<tag>...</tag>`` block, stripped, or ``None``."""
    blocks = tag_blocks(text, tag)
    return blocks[-1].strip() if blocks else None


def final_answer(text: str, tag: str = "answer") -> str | None:
    """The model's last answer, stripped: the content of the last ``<tag>...</tag>`` block, or, when
    the text ends inside an opened block that was never closed (the model wrote its answer and
    stopped), everything after that last opening tag; ``None`` without either. Linear in the text."""
    opened = text.rfind(f"<{tag}>")
    if opened >= 0 and text.find(f"</{tag}>", opened) < 0:
        return text[opened + len(tag) + 2:].strip()
    return last_tag(text, tag)


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def last_code_block(text: str) -> str | None:
    """The last fenced (```python) code block, or ``None``."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None
