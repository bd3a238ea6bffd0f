"""Files and directories that appear whole or not at all: a run killed at any moment leaves either
the old version or the new one, never half of one (a half-written model directory would fail every
later load, and a study that found it would stop there for good)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line, flushed to disk (a kill leaves at most a torn last line,
    which readers skip)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A directory filled under a temporary name beside ``path`` and renamed to ``path`` when the
    block ends without error; an earlier ``path`` is replaced. If the block fails (or the process
    dies in it), ``path`` is as it was and the temporary directory is removed (or, after a kill,
    by the next save to ``path``)."""
    path = Path(path)
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    for leftover in (tmp, old):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():  # two renames: between them ``path`` is absent, never half-written
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
