"""A content-addressed cache of evaluation generations, so re-running a table does not regenerate.

An entry is keyed by a hash of everything that determines it: the model's weight fingerprint, the
device type and dtype it runs in, the environment (id, options, hash of any data file), the split
and the decoding settings (``max_new_tokens``, samples, temperature, top_p, seed, ...). It holds
generated text and token ids, never rewards: the harness scores them on every read, so a change to
an environment's reward code takes effect at once. A split's generations are also cached chunk by
chunk as they are made (``harness.generate_chunks``), so a killed evaluation resumes from them. Entries are JSON files written atomically. Location: ``--cache DIR``, else ``$LLM_ENVS_EVAL_CACHE``, else
``$LLM_ENVS_CACHE/eval`` (default ``~/.cache/llm_envs/eval``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

#: Bump when the harness changes what an entry holds or how it is computed.
CACHE_VERSION = 2  # 2: generations only (1 held rewards); dtype and device type in the key
CACHE_ENV = "LLM_ENVS_EVAL_CACHE"


def default_dir() -> Path:
    """``$LLM_ENVS_EVAL_CACHE``, else ``$LLM_ENVS_CACHE/eval``, else ``~/.cache/llm_envs/eval``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    root = os.environ.get("LLM_ENVS_CACHE") or Path.home() / ".cache" / "llm_envs"
    return Path(root).expanduser() / "eval"


def file_hash(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, or of a directory's files (names and bytes, sorted)."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else "").encode())
        with open(f, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def cache_key(**parts: Any) -> str:
    """A stable hex key of ``parts`` (JSON-serialisable values; order of keywords is irrelevant)."""
    blob = json.dumps({"version": CACHE_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class Cache:
    """JSON entries under ``root``; ``enabled=False`` makes every lookup miss and stores nothing."""

    def __init__(self, root: str | os.PathLike | None = None, enabled: bool = True):
        self.root = Path(root).expanduser() if root is not None else default_dir()
        self.enabled = enabled

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry stored under ``key``, or None (also for an unreadable entry)."""
        if not self.enabled:
            return None
        try:
            return json.loads(self.path(key).read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def put(self, key: str, value: dict[str, Any]) -> None:
        if not self.enabled:
            return
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)

    def delete(self, key: str) -> None:
        """Drop the entry under ``key`` (none there: nothing to do)."""
        if self.enabled:
            self.path(key).unlink(missing_ok=True)
