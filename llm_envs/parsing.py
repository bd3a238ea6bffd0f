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
    """The content of the last ``<tag>...</tag>`` block, stripped, or ``None``: what reasoning-gym's
    ``extract_answer`` reads. Linear in the text: it is cut after the last closing tag first, so no
    unclosed opening tag after it sends the lazy regex scanning to the end again and again."""
    end = text.rfind(f"</{tag}>")
    blocks = tag_blocks(text[:end + len(tag) + 3], tag) if end >= 0 else []
    return blocks[-1].strip() if blocks else None


def final_answer(text: str, tag: str = "answer") -> str | None:
    """The model's answer, stripped: the content of the last closed ``<tag>...</tag>`` block (as
    reasoning-gym's ``extract_answer`` reads it, whatever follows it); only when the text has no
    closed block, everything after its last opening tag (the model wrote its answer, then its stop
    token, and never closed the tag); ``None`` without either. Linear in the text. More lenient
    than reasoning-gym: rg envs use it only with ``lenient_unclosed=True``."""
    closed = last_tag(text, tag)
    if closed is not None:
        return closed
    opened = text.rfind(f"<{tag}>")
    return text[opened + len(tag) + 2:].strip() if opened >= 0 else None


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def last_code_block(text: str) -> str | None:
    """The last fenced (```python) code block, or ``None``."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None
