"""The held-out evaluation before training, made once for runs that share it (``--base-eval FILE``).

Every run logs its model's held-out numbers at iteration 0, before any update. Runs that start from
the same weights (a study's or a sweep's settings and seeds) evaluate the same model there, on the
same examples, with the same greedy decoding: the same numbers, recomputed by each. With
``--base-eval FILE`` the first such run adds its record to FILE and the others log that record
instead of recomputing it.

A record is reused only where everything that decides it is equal (``key``): a digest of the
weights as evaluated (adapters included), the evaluation settings (env and its options, split,
limit, tokens, batch size, engine and its options, compute dtype, device, processes), this package's
code and its main libraries' versions, and the machine (CPU, its threads, the GPU). Anything else
makes a new record, so a reused one is what this run would have computed. A record lost or damaged
(runs writing FILE at the same moment) is made again by the next run that needs it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from trainers.common.files import atomic_write
from trainers.common.hardware import describe
from trainers.common.models import model_fingerprint

#: The file's name where a study or a sweep keeps it (in its own directory).
FILE = "base_held_out.json"

#: The config fields an evaluation before training depends on (beside the weights, which are hashed).
EVAL_FIELDS = ("env", "env_args", "eval_split", "eval_limit", "max_new_tokens", "val_size", "val_carve", "device",
               "dtype")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of the Python files of ``trainers`` and ``llm_envs`` (engines, envs and scorers) and of
    torch's and transformers' versions: a change to any makes new records."""
    import transformers

    import llm_envs

    h = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    for root in (Path(__file__).parents[1], Path(llm_envs.__file__).parent):  # trainers/ and llm_envs/
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def key(cfg: Any, engine: Any, batch_size: int, world: int) -> str:
    """What decides the evaluation before training of ``engine``'s model under ``cfg``, as a digest."""
    from trainers.engines import ENGINE_FIELDS

    what = {name: getattr(cfg, name, None) for name in (*EVAL_FIELDS, *ENGINE_FIELDS)}
    what |= {"weights": model_fingerprint(engine.model, engine.tokenizer), "engine": engine.name,
             "engine_class": type(engine).__name__, "batch_size": batch_size, "world": world, "code": code_digest(),
             "machine": describe(engine.device)}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


class BaseEvals:
    """The records of ``path`` (a JSON object: key -> the logged record and the run that made it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):  # none yet, or damaged: records are made again
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry of ``key`` (``record``: what the run logged; ``run``: the run that made it), or None."""
        entry = self._read().get(key)
        return entry if isinstance(entry, dict) and isinstance(entry.get("record"), dict) else None

    def put(self, key: str, record: dict[str, Any], run: str) -> None:
        """Add ``record``, made by the run in directory ``run``."""
        data = self._read()
        data[key] = {"record": record, "run": run}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(data, indent=1) + "\n")
