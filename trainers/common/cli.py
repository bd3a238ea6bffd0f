"""The parser every command uses (``Parser``). Standard library alone, so a launcher that runs
before the project's dependencies are installed (``benchmarks.lent_gpu``) parses as the rest do."""

from __future__ import annotations

import argparse
import sys
import typing
from typing import Any


class Parser(argparse.ArgumentParser):
    """The parser of every command: a bad flag or value ends the program with one line (exit code
    2), not argparse's usage block; the program is named as it is run (``python -m trainers.es``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        main = sys.modules.get("__main__")
        module = getattr(getattr(main, "__spec__", None), "name", None)
        if kwargs.get("prog") is None and module:
            kwargs["prog"] = f"python -m {module.removesuffix('.__main__')}"
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")
