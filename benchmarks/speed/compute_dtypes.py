"""Which dtypes a program's matrix products actually compute in: observed, not taken from a flag.

``MatmulDtypes`` records, for every linear layer and matrix product run while it is active
(``F.linear``, which ``nn.Linear`` calls, and ``matmul``/``mm``/``bmm``/``addmm``/``baddbmm``), the dtype
of its result: under autocast an fp32 weight's product comes out in bf16, under FSDP's
``MixedPrecisionPolicy`` the gathered weights are bf16, so the result's dtype is the compute dtype
whatever the mechanism. Every engine's products go through these functions (the native engine's
``W @ x^T`` too).

As a command it runs a module under the recorder, on every rank of a ``torchrun`` launch, and
writes ``OUT.rank<R>.json`` (counts of linear results per dtype):

    python -m benchmarks.speed.compute_dtypes OUT trainers.grpo --dtype fp32 ...
    python -m torch.distributed.run --nproc-per-node 2 -m benchmarks.speed.compute_dtypes OUT trainers.grpo ...

(``benchmarks.gpu.check``'s FSDP check and ``tests/test_precision.py`` use it.)
"""

from __future__ import annotations

import collections
import json
import os
import runpy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_PRODUCTS = {F.linear: "linear", torch.matmul: "matmul", torch.Tensor.matmul: "matmul",
             torch.Tensor.__matmul__: "matmul", torch.mm: "matmul", torch.bmm: "matmul", torch.addmm: "matmul",
             torch.baddbmm: "matmul", torch.Tensor.baddbmm_: "matmul"}


class MatmulDtypes(TorchFunctionMode):
    """``with MatmulDtypes() as seen: ...``; then ``seen.counts["linear"]`` is a Counter of result
    dtypes (``"float32"``, ``"bfloat16"``) of the linear layers run inside, ``seen.counts["matmul"]``
    of the other matrix products."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, collections.Counter] = {"linear": collections.Counter(),
                                                       "matmul": collections.Counter()}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kind = _PRODUCTS.get(func)
        if kind is not None and isinstance(out, torch.Tensor):
            self.counts[kind][str(out.dtype).removeprefix("torch.")] += 1
        return out

    def dtypes(self, kind: str = "linear") -> set[str]:
        """The result dtypes seen for ``kind``."""
        return set(self.counts[kind])

    def record(self) -> dict[str, dict[str, int]]:
        return {k: dict(v) for k, v in self.counts.items()}


def main(argv: list[str] | None = None) -> None:
    import argparse

    from trainers.common.config import Parser

    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("out", help="prefix of the result files: OUT.rank<R>.json")
    parser.add_argument("module", help="the module to run (python -m MODULE), e.g. trainers.grpo")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    seen = MatmulDtypes()
    sys.argv = [args.module, *args.args]
    code = 0
    try:
        with seen:
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        Path(f"{args.out}.rank{rank}.json").write_text(json.dumps(seen.record()) + "\n")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
