"""Reading users' data files: JSON, JSONL, or a directory of JSON files, with errors that name
the file, the row and the field."""

from __future__ import annotations

import json
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A data file is missing or malformed (the message names the file, row and field)."""


class FieldError(ValueError):
    """One field of one row is missing or malformed; ``TaskEnv`` adds the file and row."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def load_rows(path: str | PathLike) -> list[dict[str, Any]]:
    """The rows of a data file.

    - ``.jsonl``: one JSON object per line (blank lines skipped);
    - ``.json``: a list of objects, a mapping ``{id: object}`` (ids become the ``id`` field),
      or one object (one row);
    - a directory: every ``*.json`` file in it, sorted, one row each, ``id`` = the file's stem.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_dir():
        rows = []
        for file in sorted(path.glob("*.json")):
            (row,) = _rows_from_json(file, _read_json(file), single=True)
            rows.append({**row, "id": file.stem})
        if not rows:
            raise DataError(f"{path}: directory holds no .json files")
        return rows
    if path.suffix == ".jsonl":
        rows = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: line {lineno}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
        return rows
    return _rows_from_json(path, _read_json(path))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON at line {exc.lineno} ({exc.msg})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a UTF-8 text file") from None


def _rows_from_json(path: Path, obj: Any, single: bool = False) -> list[dict[str, Any]]:
    if isinstance(obj, list) and not single:
        for index, row in enumerate(obj):
            if not isinstance(row, dict):
                raise DataError(f"{path}: row {index}: expected a JSON object, got {type(row).__name__}")
        return obj
    if isinstance(obj, dict):
        if not single and obj and all(isinstance(v, dict) for v in obj.values()):
            return [{**v, "id": str(k)} for k, v in obj.items()]
        return [obj]
    raise DataError(f"{path}: expected a JSON object or a list of objects, got {type(obj).__name__}")


def require(row: Mapping[str, Any], field: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[field]``, checked to be of ``kind``; raises ``FieldError`` otherwise."""
    if field not in row:
        raise FieldError(field, "missing")
    value = row[field]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool) and bool not in _tuple(kind)):
        names = "/".join(t.__name__ for t in _tuple(kind))
        raise FieldError(field, f"expected {names}, got {type(value).__name__} {value!r:.60}")
    return value


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
