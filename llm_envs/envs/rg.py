"""reasoning-gym: every task of the installed reasoning-gym as an environment, ``rg/<task>-v0``.

``gym.make("rg/basic_arithmetic-v0", min_terms=2, max_terms=2)`` builds the task's own dataset
(reasoning-gym's ``DATASETS[task]``: a dataset class and its config dataclass) and wraps it:

- **Arguments**: any field of the task's config dataclass (reasoning-gym validates the values; a
  bad one is a one-line ``ValueError`` naming the task and the problem, an unknown name a
  one-line ``TypeError`` listing the fields), plus the env's own ``data``, ``seed``,
  ``train_size`` (1000), ``test_size`` (200), ``opening`` and ``system_prompt``. The config's
  ``seed`` and ``size`` are the env's to set (from ``seed`` and the split sizes).
- **Splits** come from disjoint generator seeds. reasoning-gym generates item ``i`` of a dataset
  with seed ``dataset seed + i``; the test split's dataset seed is drawn (from the env's
  ``seed``) in ``[0, 2**30)`` and the train split's in ``[2**31, 2**31 + 2**30)``, so a split's
  items (at most ``MAX_SPLIT`` = 2**30) stay in its half of ``[0, 2**32)`` and no train item
  shares a generator seed with a test item (32 bits: some generators seed numpy's legacy RNG,
  which takes no more).
  Procedural generators can still repeat small problems, so the train split then drops every
  example whose question text equals a test question (including a test split read from
  ``data=``): it may hold fewer than ``train_size`` examples (``dropped_from_train`` says how
  many went), while the test split always holds ``test_size``. The same ``seed`` and config
  give the same examples; the test split does not depend on ``train_size``, and a smaller split
  is a prefix of a larger one (for the generators that seed each item on its own, nearly all).
- **Prompt** (the paper's answer format, as Countdown and Sudoku): the paper's system prompt
  followed by the instruction to think in ``<think> </think>`` and put the final answer in
  ``<answer> </answer>`` tags, with one worked example of that format (``SYSTEM_PROMPT``); the task's question as the user's message; the assistant's turn
  opened with "Let me solve this step by step.\\n<think>" (``opening=False``: none; a string:
  that one).
- **Reward**: exactly reasoning-gym's: the task's own ``score_answer(extract_answer(turn), entry)``
  of the whole assistant turn (opening + completion). ``extract_answer`` reads the content of the
  LAST closed ``<answer>...</answer>`` block, stripped (the leftmost-lazy match: a nested
  ``<answer>a<answer>b</answer>`` reads ``a<answer>b``); an unclosed ``<answer>``, e.g. an answer
  cut off by ``max_new_tokens``, is no answer, as is a turn without a block: the task scores
  ``None`` (0 in most tasks; countdown gives it 0.01).
  ``lenient_unclosed=True`` (off by default, and then said in ``reset``'s info) also reads a turn
  with no closed block from its last ``<answer>`` to its end (``parsing.final_answer``): more
  generous than the task, which a trainer can learn to exploit (docs/environments.md).
  ``correct`` is ``reward == 1.0`` exactly:
  reasoning-gym's scorers give a literal 1.0 for an answer they accept, while spell_backward's and
  letter_jumble's partial credits (float sums of 1/n) land a rounding error off 1 (e.g.
  0.9999999999999999, 1.0000000000000002) for an answer with junk after the right one; letter_jumble's also reaches exactly 1.0 for it, so
  its ``correct`` also needs its own exact match (``EXACT_MATCH_CORRECT``). ``parts``: ``format``
  for the block scored (1 when it is closed, 0.5 when an open one was read under
  ``lenient_unclosed``, 0 for none) and ``answer``
  (the task's score). Each example keeps its reasoning-gym entry: ``answer`` is the
  entry's answer (``None`` for tasks with many valid answers, scored by checking the model's),
  ``meta`` holds the ``task``, ``question`` and ``metadata`` (``entry(example)`` rebuilds it).
- **Time bounds**: reasoning-gym scorers are arbitrary Python, some with sympy, which can spend
  long in C code no signal interrupts, so scoring runs in worker processes killed at the
  deadline (the base class default). ``prepare_scoring`` imports reasoning-gym and builds the
  task's dataset (its ``score_answer`` reads the config) before a worker's first item; a pickled
  env carries only the task's name and config, not its examples.

Registration is cheap: ``import llm_envs`` registers the ids from the static list ``TASKS``
without importing reasoning-gym (~0.7 s); building an env imports it, registers any task a newer
reasoning-gym added (``register_installed``), and a listed task missing from an older one is a
one-line error. ``python -m llm_envs.list --namespace rg`` lists them with a line each.

Tasks that need more than their default config: ``composite`` mixes other tasks and needs
``datasets=[{"name": "chain_sum", "weight": 1, "config": {...}}, ...]`` (dicts or
reasoning-gym ``DatasetSpec``s; ``weight`` defaults to 1, ``config`` to ``{}``); without it,
``gym.make`` says so (``NEEDS_CONFIG``).

Own data (``data={"test": path}``): rows with ``question`` (str), optional ``answer``,
``metadata`` (a dict, what the task's scorer reads) and ``id``, e.g. entries a reasoning-gym
dataset produced, saved as JSONL.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import sys
from collections.abc import Mapping
from os import PathLike
from typing import Any

import gymnasium as gym

from llm_envs.core import TaskEnv, chat
from llm_envs.data import FieldError, require
from llm_envs.envs.countdown import OPENING, PAPER_SYSTEM_PROMPT
from llm_envs.parsing import final_answer, last_tag
from llm_envs.types import Example, Score

NAMESPACE = "rg"

#: reasoning-gym's task names (``sorted(reasoning_gym.factory.DATASETS)`` of reasoning-gym 0.1.25),
#: registered at import without importing reasoning-gym. A test checks it against the installed one.
TASKS: tuple[str, ...] = (
    'ab', 'acre', 'advanced_geometry', 'aiw', 'arc_1d', 'arc_agi', 'base_conversion',
    'basic_arithmetic', 'bf', 'binary_alternation', 'binary_matrix', 'bitwise_arithmetic', 'boxnet',
    'caesar_cipher', 'calendar_arithmetic', 'chain_sum', 'circuit_logic', 'codeio', 'coin_flip',
    'color_cube_rotation', 'complex_arithmetic', 'composite', 'count_bits', 'count_primes',
    'countdown', 'course_schedule', 'cryptarithm', 'decimal_arithmetic', 'decimal_chain_sum',
    'dice', 'emoji_mystery', 'family_relationships', 'figlet_font', 'fraction_simplification',
    'futoshiki', 'game_of_life', 'game_of_life_halting', 'gcd', 'graph_color', 'group_anagrams',
    'gsm_symbolic', 'intermediate_integration', 'isomorphic_strings', 'jugs', 'kakurasu',
    'knight_swap', 'knights_knaves', 'largest_island', 'lcm', 'leg_counting', 'letter_counting',
    'letter_jumble', 'list_functions', 'mahjong_puzzle', 'manipulate_matrix', 'maze', 'mini_sudoku',
    'modulo_grid', 'n_queens', 'needle_haystack', 'number_filtering', 'number_format',
    'number_sequence', 'number_sorting', 'palindrome_generation', 'palindrome_partitioning',
    'path_star', 'polynomial_equations', 'polynomial_multiplication', 'pool_matrix',
    'power_function', 'prime_factorization', 'products', 'propositional_logic', 'puzzle24',
    'quantum_lock', 'ransom_note', 'rearc', 'rectangle_count', 'rotate_matrix', 'rotten_oranges',
    'rubiks_cube', 'rush_hour', 'self_reference', 'sentence_reordering', 'shortest_path',
    'simple_equations', 'simple_geometry', 'simple_integration', 'sokoban', 'spell_backward',
    'spiral_matrix', 'string_insertion', 'string_manipulation', 'string_splitting',
    'string_synthesis', 'sudoku', 'survo', 'syllogism', 'time_intervals', 'tower_of_hanoi',
    'tsumego', 'word_ladder', 'word_sequence_reversal', 'word_sorting', 'zebra_puzzles',
)

#: Tasks whose default config cannot build a dataset, and what to pass (``gym.make`` says so).
NEEDS_CONFIG: dict[str, str] = {
    "composite": "it mixes other tasks: pass datasets=[{'name': 'chain_sum', 'weight': 1, 'config': {}}, ...]",
}

#: Tasks whose partial credit can reach exactly 1.0 for an answer their own exact-match check
#: rejects: ``correct`` there also needs that check (the answer equals the entry's, ignoring case).
#: letter_jumble credits each expected word in its place, ignores extra words and clamps the sum of
#: the 1/n's to 1.0, so "<the words> and a lot of junk" scores exactly 1.0 for most word counts
#: (n = 3, 4, 5, 8, 9, ...) and 0.9999999999999997 for others. (spell_backward sums 1/n per letter
#: too, but takes 0.2 off a sum equal to 1.0: its junk answers never score exactly 1.0.)
EXACT_MATCH_CORRECT = frozenset({"letter_jumble"})

#: The env's own keyword arguments (every other one is a field of the task's config).
ENV_ARGS = ("data", "seed", "train_size", "test_size", "opening", "system_prompt", "lenient_unclosed")

#: The paper's system prompt (Countdown's and Sudoku's), its answer-format instruction (reasoning-gym
#: questions say what to answer, not where) and one worked example of the format. The example is
#: what a small model needs: measured on the default model (basic_arithmetic, two one-digit terms,
#: 32 test prompts, the paper's opening, greedy), the instruction alone gave 0 of 32 answers in the
#: format; with the example, 19 of 32 were correct (docs/task-selection/).
SYSTEM_PROMPT = (
    PAPER_SYSTEM_PROMPT + " Show your work in <think> </think> tags and return the final answer in "
    "<answer> </answer> tags.\nExample:\nUser: What is 2 + 3?\nAssistant: <think>2 + 3 = 5</think>\n"
    "<answer>5</answer>"
)

#: ``rg/<task>-v0`` ids registered so far, in registration order (``llm_envs.ENV_IDS`` holds the
#: built-in environments; these are kept apart so that loops over those stay short).
RG_ENV_IDS: list[str] = []

_HALF = 2**31  # test seeds in [0, _HALF), train seeds in [_HALF, 2 * _HALF)
_SEED_MARGIN = 1024  # seeds past a split's last item that a generator may use (composite: one per sub-task)
MAX_SPLIT = 2**30


def env_id(task: str) -> str:
    """The Gymnasium id of a reasoning-gym task: ``rg/<task>-v0``."""
    return f"{NAMESPACE}/{task}-v0"


def register_tasks(tasks: tuple[str, ...] | list[str]) -> None:
    """Register ``rg/<task>-v0`` for each task not registered yet (no reasoning-gym import)."""
    for task in tasks:
        id_ = env_id(task)
        if id_ not in gym.registry:
            gym.register(id=id_, entry_point=ReasoningGymEnv, kwargs={"task": task})
        if id_ not in RG_ENV_IDS:
            RG_ENV_IDS.append(id_)


def installed_tasks() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registry, ``{task: (dataset class, config class)}`` (imports reasoning-gym)."""
    importlib.import_module("reasoning_gym")  # its subpackages fill the registry as they import
    from reasoning_gym.factory import DATASETS

    return DATASETS


def register_installed() -> list[str]:
    """Register every task of the installed reasoning-gym (a newer one may add tasks to
    ``TASKS``); returns the installed task names, sorted."""
    names = sorted(installed_tasks())
    register_tasks(names)
    return names


def rg_version() -> str:
    """The installed reasoning-gym's version (its distribution's: ``__version__`` can lag)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reasoning-gym")
    except PackageNotFoundError:
        return getattr(sys.modules.get("reasoning_gym"), "__version__", "?")


def describe(task: str) -> str:
    """One line about a task: the first line of its dataset class's docstring, else of its
    module's, else its config's fields (imports reasoning-gym)."""
    dataset_cls, config_cls = installed_tasks()[task]
    for doc in (dataset_cls.__doc__, getattr(sys.modules.get(dataset_cls.__module__), "__doc__", None)):
        lines = (doc or "").strip().splitlines()
        if lines and lines[0].strip():
            return lines[0].strip()
    return "config: " + ", ".join(config_fields(config_cls))


def config_fields(config_cls: type) -> list[str]:
    """The fields of a task's config that ``gym.make`` accepts (``seed`` and ``size`` are the env's)."""
    return [f.name for f in dataclasses.fields(config_cls) if f.init and f.name not in ("seed", "size")]


def entry(example: Example) -> dict[str, Any]:
    """The reasoning-gym entry of an example, as its task's ``score_answer`` takes it."""
    return {"question": example.meta["question"], "answer": example.answer, "metadata": example.meta["metadata"]}


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (an empty ``assert`` message: the exception's name)."""
    return " ".join(str(exc).split()) or type(exc).__name__


class ReasoningGymEnv(TaskEnv):
    """One reasoning-gym task; registered as ``rg/<task>-v0`` (see the module docstring).

    Args:
        task: reasoning-gym's name of the task (set by the registered id).
        data: ``{split: path}`` of JSON/JSONL files of entries replacing built-in splits.
        seed: seed of both splits' generator seeds (see ``split_seed``).
        train_size, test_size: examples generated per split (train then loses the questions of
            test, see the module docstring).
        opening: ``True``: "Let me solve this step by step.\\n<think>" (``OPENING``); ``False``:
            none; a string: that opening instead.
        system_prompt: the system message (``SYSTEM_PROMPT``); ``None`` for none.
        lenient_unclosed: also score a turn with no closed ``<answer>`` block from its last
            ``<answer>`` to its end (off: reasoning-gym's own scoring, an unclosed block scores 0).
        **config: fields of the task's config dataclass (not ``seed`` or ``size``).
    """

    max_new_tokens = 1024
    opening = OPENING
    # score_workers stays None (worker processes): reasoning-gym scorers are arbitrary Python,
    # some spend long in sympy's C code, which only killing a process can stop.

    def __init__(
        self,
        task: str,
        data: Mapping[str, str | PathLike] | None = None,
        seed: int = 0,
        train_size: int = 1000,
        test_size: int = 200,
        opening: bool | str = True,
        system_prompt: str | None = SYSTEM_PROMPT,
        lenient_unclosed: bool = False,
        **config: Any,
    ):
        super().__init__(data=data, seed=seed, opening=opening)
        self.task = task
        self.env_id = env_id(task)
        sizes = {"train": train_size, "test": test_size}
        for split, size in sizes.items():
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_SPLIT:
                raise ValueError(f"{self.env_id}: {split}_size must be an int in 0..{MAX_SPLIT}, got {size!r}")
        self.sizes = sizes
        self.system_prompt = system_prompt
        if not isinstance(lenient_unclosed, bool):
            raise TypeError(f"{self.env_id}: lenient_unclosed must be true or false, got {lenient_unclosed!r}")
        self.lenient_unclosed = lenient_unclosed
        self.task_config = self._check_config(config)
        self.dropped_from_train = 0  # train examples dropped for repeating a test question
        self._scoring_dataset: Any = None  # built by prepare_scoring

    # ----- the task's config ----------------------------------------------------------------------
    def classes(self) -> tuple[type, type]:
        """The task's ``(dataset class, config class)`` from the installed reasoning-gym."""
        tasks = installed_tasks()
        if self.task not in tasks:
            raise ValueError(f"{self.env_id}: reasoning-gym {rg_version()} has no task {self.task!r} "
                             f"(pip install -U reasoning-gym)")
        return tasks[self.task]

    def _check_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` checked against the task's config dataclass and its own ``validate``
        (one-line errors: ``TypeError`` for an unknown field, ``ValueError`` for a bad value)."""
        register_installed()  # reasoning-gym is imported now anyway: register what it adds
        _, config_cls = self.classes()
        fields = config_fields(config_cls)
        for name in config:
            if name in ("size", "seed"):
                raise TypeError(f"{self.task}: {name!r} is the env's to set: pass train_size/test_size "
                                f"and seed instead")
            if name not in fields:
                raise TypeError(f"unknown argument {name!r} for {self.task}; its config fields: "
                                f"{', '.join(fields)}; the env's own: {', '.join(ENV_ARGS)}")
        config = _coerce(self.task, dict(config))
        self._config("test", config=config)  # validated now, the datasets are built when needed
        return config

    def _config(self, split: str, size: int | None = None, config: dict[str, Any] | None = None) -> Any:
        """The task's config for ``split``'s dataset, validated (a bad value: one-line ``ValueError``)."""
        _, config_cls = self.classes()
        values = self.task_config if config is None else config
        try:
            size = max(1, self.sizes[split] if size is None else size)
            cfg = config_cls(**values, seed=self.split_seed(split), size=size)
            if callable(getattr(cfg, "validate", None)):
                cfg.validate()
        except Exception as exc:  # reasoning-gym validates with assert, ValueError, TypeError...
            hint = f" ({NEEDS_CONFIG[self.task]})" if self.task in NEEDS_CONFIG else ""
            raise ValueError(f"{self.env_id}: invalid config: {_one_line(exc)}{hint}") from None
        return cfg

    def split_seed(self, split: str) -> int:
        """The generator seed of ``split``'s dataset: item ``i`` uses ``split_seed + i``. Test items'
        seeds lie in ``[0, 2**31)``, train items' in ``[2**31, 2**32)``, so the splits never share one."""
        # Drawn from a span that does not depend on the size: a smaller split is a prefix of a larger one.
        offset = random.Random(f"llm_envs/{NAMESPACE}/{self.seed}/{split}").randrange(_HALF - MAX_SPLIT - _SEED_MARGIN)
        return offset + (_HALF if split == "train" else 0)

    # ----- built-in data ----------------------------------------------------------------------------
    def build_split(self, split: str) -> list[Example]:
        if split not in self.sizes:
            return super().build_split(split)
        examples = [self._example(f"{self.task}-{split}-{i}", item) for i, item in enumerate(self._generate(split))]
        if split == "train":
            # The test split first (built-in or a file): train drops what it repeats.
            test_questions = {e.meta["question"] for e in self.examples("test")}
            kept = [e for e in examples if e.meta["question"] not in test_questions]
            self.dropped_from_train = len(examples) - len(kept)
            examples = kept
        return examples

    def _generate(self, split: str) -> list[dict[str, Any]]:
        """The entries of ``split``'s reasoning-gym dataset."""
        size = self.sizes[split]
        if size == 0:
            return []
        dataset = self._dataset(self._config(split))
        items = []
        for i in range(size):
            try:
                items.append(dataset[i])
            except Exception as exc:  # a generator bug: say where, keep its traceback
                raise RuntimeError(f"{self.env_id}: reasoning-gym failed to generate item {i} of the {split} "
                                   f"split: {_one_line(exc)}") from exc
        return items

    def _dataset(self, config: Any) -> Any:
        dataset_cls, _ = self.classes()
        try:
            return dataset_cls(config=config)
        except Exception as exc:  # e.g. a composite naming a task that does not exist
            raise ValueError(f"{self.env_id}: reasoning-gym cannot build the dataset: {_one_line(exc)}") from None

    def _example(self, id_: str, item: Mapping[str, Any]) -> Example:
        meta = {"task": self.task, "question": item["question"], "metadata": item.get("metadata") or {}}
        return Example(id=id_, prompt=chat(item["question"], self.system_prompt), answer=item.get("answer"), meta=meta)

    # ----- users' data ---------------------------------------------------------------------------------
    def parse_row(self, row: Mapping[str, Any], index: int) -> Example:
        question = require(row, "question", str)
        metadata = row.get("metadata", {})
        if not isinstance(metadata, dict):
            raise FieldError("metadata", f"expected an object, got {type(metadata).__name__}")
        item = {"question": question, "answer": row.get("answer"), "metadata": metadata}
        return self._example(str(row.get("id", index)), item)

    # ----- scoring -----------------------------------------------------------------------------------
    def prepare_scoring(self) -> None:
        """Import reasoning-gym and build the task's dataset (its ``score_answer`` reads the config):
        a worker does it before its first item, so it does not count against the item's time."""
        if self._scoring_dataset is None:
            # One item: a dataset's own init work (data files, pre-drawn questions) stays small.
            self._scoring_dataset = self._dataset(self._config("test", size=1))

    def good_reply(self, example: Example) -> str | None:
        """reasoning-gym's answer to the question, after a closed think."""
        return f"</think>\n<answer>{example.answer}</answer>"

    def score_completion(self, completion: str, example: Example) -> Score:
        # reasoning-gym's extract_answer: the last closed <answer> block (an open one only if lenient).
        answer = last_tag(completion, "answer")
        closed = answer is not None
        if answer is None and self.lenient_unclosed:
            answer = final_answer(completion)
        self.prepare_scoring()
        # No answer goes to the scorer too: some tasks give it a floor (countdown: 0.01), as in reasoning-gym.
        reward = float(self._scoring_dataset.score_answer(answer, entry(example)))
        if answer is None:
            return Score(reward, False, {"format": 0.0, "answer": reward})
        # Exactly 1.0, no tolerance: scorers return a literal 1.0 (or n/n) for an answer they accept;
        # what lands a rounding error off 1 is a float sum of partial credits (see EXACT_MATCH_CORRECT).
        # Golden answers score exactly 1.0 in every task that has them (30 items each, reasoning-gym 0.1.25).
        correct = reward == 1.0
        if correct and example.meta["metadata"].get("source_dataset", self.task) in EXACT_MATCH_CORRECT:
            correct = answer.lower() == str(example.answer).strip().lower()
        return Score(reward, correct, {"format": 1.0 if closed else 0.5, "answer": reward})

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)
        if self.lenient_unclosed:  # scoring more generous than the task's own: said where it is on
            info["lenient_unclosed"] = True
        return obs, info

    def __getstate__(self) -> dict[str, Any]:
        # What a scoring worker needs: the task and its config, not the examples or the dataset
        # (the worker rebuilds the dataset in prepare_scoring; examples come with each item).
        state = self.__dict__.copy()
        state.update(_splits={}, _scoring_dataset=None, _scorers={})
        return state


def _coerce(task: str, config: dict[str, Any]) -> dict[str, Any]:
    """Config values given in plain data where reasoning-gym wants its own types: composite's
    ``datasets`` as dicts (from YAML or a command line) become ``DatasetSpec``s."""
    if task == "composite" and isinstance(config.get("datasets"), (list, tuple)):
        from reasoning_gym.composite import DatasetSpec

        specs = []
        for spec in config["datasets"]:
            if isinstance(spec, Mapping):
                unknown = set(spec) - {"name", "weight", "config"}
                if unknown or "name" not in spec:
                    raise ValueError(f"{env_id(task)}: each of datasets needs 'name' (and may have 'weight', "
                                     f"'config'); got {dict(spec)!r}")
                spec = DatasetSpec(name=spec["name"], weight=spec.get("weight", 1.0),
                                   config=dict(spec.get("config") or {}))
            specs.append(spec)
        config["datasets"] = specs
    return config


register_tasks(TASKS)
