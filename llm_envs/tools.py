"""Tools a multi-turn environment offers the model: declared as typed Python callables, called by
the model in the Qwen/Hermes format, run under a time bound, answered with ``tool`` messages.

**Declaring.** ``tool(fn)`` turns a function with type hints and a Google-style docstring into a
``Tool`` whose JSON schema comes from transformers' ``get_json_schema`` (the schema
``apply_chat_template(tools=...)`` takes); ``Tool(name, function, schema)`` gives one by hand.

**The episode a call belongs to.** A tool's function may take either or both of two parameters
that the model never sees (``EPISODE_PARAMETERS``; left out of the schema, and a call that names
them is refused as an unknown argument):

- ``state``: the episode's state (what the env's ``begin(example)`` returned, as ``respond`` gets
  it), which the tool may read and update in place: the update is the episode's from then on;
- ``example``: the episode's ``Example``, hidden answer included (a secret code, a solution).

So a tool that reveals one digit of a hidden code reads ``example.answer`` and counts the reveal in
``state``; no other door into the episode is needed.

**Calling.** The model calls a tool by writing, anywhere in its turn::

    <tool_call>{"name": "calculator", "arguments": {"expression": "3 * (4 + 5)"}}</tool_call>

the format Qwen2.5's chat template (Hermes) asks for. It is the format for every model here:
SmolLM2's template has no tool support, so an env announces its tools itself in its prompt
(``tool_prompt``: the schemas inside ``<tools></tools>`` and the instruction above, as Qwen's
template words it). Each result comes back as ``{"role": "tool", "name": ..., "content": ...}``;
a template without a ``tool`` role (SmolLM2's ChatML) renders it as ``<|im_start|>tool``.

**Failures are answers, not crashes.** A malformed call (not JSON, no name), an unknown tool, bad
arguments (a missing or unknown key, a wrong JSON type), an exception in the tool and a call that
runs past ``timeout`` seconds each become a ``tool`` message starting with ``error:`` and count
as a tool error; at most ``max_calls`` calls of a turn run (the rest are errors).

**Time and sandbox.** A call runs under the same interval timer as scoring
(``llm_envs.scoring.score_with_timer``), nested inside the bound of the whole turn; an env whose
turns run in worker processes (``score_workers != 0``) runs its tools there too. A tool must not
execute model-written code in the process it runs in: run such code through
``llm_envs.sandbox.run_function`` (its own process, killed at its deadline).
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_envs.scoring import score_with_timer, timer_usable
from llm_envs.types import Example, Message, Score

#: A tool result longer than this is cut (tokens of tool output cost context in every later turn).
MAX_OUTPUT_CHARS = 2000
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}
#: Parameters of a tool's function that the env fills from the episode, never the model.
EPISODE_PARAMETERS = ("state", "example")


@dataclass(frozen=True)
class Tool:
    """A tool: its ``name``, the ``function`` that runs it (keyword arguments) and its JSON
    ``schema`` (``{"type": "function", "function": {"name", "description", "parameters"}}``)."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any] = field(hash=False)

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema.get("function", {}).get("parameters", {}) or {}

    @property
    def episode_parameters(self) -> tuple[str, ...]:
        """Which of ``EPISODE_PARAMETERS`` the function takes (the env passes them)."""
        try:
            names = inspect.signature(self.function).parameters
        except (TypeError, ValueError):  # a builtin without a signature
            return ()
        return tuple(p for p in EPISODE_PARAMETERS if p in names)


def tool(function: Callable[..., Any], name: str | None = None) -> Tool:
    """A ``Tool`` from a typed callable with a Google-style docstring (transformers'
    ``get_json_schema``; it raises on a missing type hint or argument description). The
    parameters ``state`` and ``example`` (``EPISODE_PARAMETERS``) are the env's to fill: they need
    neither a type hint nor a description, and the schema leaves them out."""
    from transformers.utils import get_json_schema

    schema = get_json_schema(_model_facing(function))
    if name:
        schema["function"]["name"] = name
    return Tool(schema["function"]["name"], function, schema)


def _model_facing(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` as the model sees it: a stand-in without the episode's parameters (its
    signature, resolved type hints, name and docstring), for ``get_json_schema``."""
    signature = inspect.signature(function)
    if not any(p in signature.parameters for p in EPISODE_PARAMETERS):
        return function
    hints = typing.get_type_hints(function)

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    stand_in.__signature__ = signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name not in EPISODE_PARAMETERS])
    stand_in.__annotations__ = {k: v for k, v in hints.items() if k not in EPISODE_PARAMETERS}
    stand_in.__name__, stand_in.__doc__ = function.__name__, function.__doc__
    return stand_in


def tool_prompt(tools: Sequence[Tool]) -> str:
    """How an env tells the model about its tools (the Hermes wording, for templates without
    tool support): the schemas and the call format."""
    listed = "\n".join(json.dumps(t.schema) for t in tools)
    return ("You may call tools. They are listed as JSON schemas inside <tools></tools>:\n"
            f"<tools>\n{listed}\n</tools>\n"
            "To call one, write a JSON object with its name and arguments inside <tool_call></tool_call> tags, "
            'e.g. <tool_call>{"name": "' + tools[0].name + '", "arguments": {...}}</tool_call>, then end your turn. '
            "Each result comes back in a message from the tool.")


def has_tool_call(text: str) -> bool:
    """Whether the turn ``text`` calls a tool (holds an opening ``<tool_call>`` tag)."""
    return "<tool_call>" in text


@dataclass
class ToolResults:
    """The ``tool`` messages answering one turn's calls, and how many calls there were and failed."""

    messages: list[Message]
    calls: int
    errors: int


def run_tool_calls(text: str, tools: Sequence[Tool], timeout: float = 5.0, max_calls: int = 4, state: Any = None,
                   example: Example | None = None) -> ToolResults:
    """Run every ``<tool_call>`` of ``text`` (an unclosed one is a malformed call) against
    ``tools``; each failure is an ``error:`` message, never an exception. ``state`` and ``example``
    are the episode's, passed to the tools that take them (updates to ``state`` stay in it)."""
    episode = {"state": state, "example": example}
    by_name = {t.name: t for t in tools}
    blocks = TOOL_CALL.findall(text)
    if text.count("<tool_call>") > len(blocks):
        blocks.append(None)  # an opened, never closed call
    messages, errors = [], 0
    for k, block in enumerate(blocks):
        if k >= max_calls:
            name, content = "", f"error: at most {max_calls} tool calls per turn; this one was not run"
        else:
            name, content = _call(block, by_name, timeout, episode)
        errors += content.startswith("error:")
        messages.append({"role": "tool", "name": name, "content": content[:MAX_OUTPUT_CHARS]})
    return ToolResults(messages, len(blocks), errors)


def _call(block: str | None, tools: Mapping[str, Tool], timeout: float, episode: Mapping[str, Any]) -> tuple[str, str]:
    """(tool name, result text or ``error: ...``) of one call block."""
    if block is None:
        return "", "error: malformed tool call: <tool_call> without </tool_call>"
    try:
        call = json.loads(block)
    except (ValueError, RecursionError):
        return "", 'error: malformed tool call: not JSON; write {"name": ..., "arguments": {...}}'
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return "", 'error: malformed tool call: expected {"name": ..., "arguments": {...}}'
    name, arguments = call["name"], call.get("arguments", {})
    if name not in tools:
        return name, f"error: unknown tool {name[:60]!r}; available: {', '.join(sorted(tools))}"
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = None
    problem = check_arguments(arguments, tools[name].parameters)
    if problem:
        return name, f"error: bad arguments for {name}: {problem}"
    hidden = {p: episode.get(p) for p in tools[name].episode_parameters}
    return name, _bounded(tools[name], arguments, timeout, hidden)


def check_arguments(arguments: Any, parameters: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the schema's ``parameters`` (required and unknown keys, JSON
    types of the top-level values), or ``None``."""
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object"
    properties = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        return f"missing {', '.join(missing)}"
    unknown = [k for k in arguments if k not in properties]
    if unknown:
        return f"unknown argument {unknown[0][:40]!r}; expected {', '.join(properties) or 'none'}"
    for key, value in arguments.items():
        wanted = properties[key].get("type")
        kinds = [wanted] if isinstance(wanted, str) else list(wanted or [])
        types = tuple(t for kind in kinds for t in _JSON_TYPES.get(kind, (object,)))
        if types and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            return f"{key} must be {' or '.join(kinds)}"
    return None


@dataclass
class _Output(Score):
    """What a tool call returns through the scoring timer: a ``Score`` carrying the result text."""

    text: str = ""


class _ToolRun:
    """One tool as a ``Scorable``, so that a call runs under ``score_with_timer``, the scoring
    path's own time bound (the "completion" is the arguments as JSON)."""

    score_workers = 0

    def __init__(self, tool: Tool, timeout: float, hidden: Mapping[str, Any]):
        self.tool, self.score_timeout, self.hidden = tool, timeout, hidden

    def prepare_scoring(self) -> None:
        pass

    def score_completion(self, completion: str, example: Example) -> Score:
        try:
            result = self.tool.function(**json.loads(completion), **self.hidden)
        except Exception as exc:  # the tool's own failure is an answer to the model
            return _Output(0.0, False, text=f"error: {self.tool.name} raised {type(exc).__name__}: {exc}")
        return _Output(0.0, True, text=result if isinstance(result, str) else json.dumps(result, default=str))


_NO_EXAMPLE = Example("tool-call", [], None)


def _bounded(tool: Tool, arguments: dict[str, Any], timeout: float, hidden: Mapping[str, Any]) -> str:
    """The tool's result text, within ``timeout`` seconds where a timer can bound it (the main
    thread: always so in scoring workers and in-process turns); ``hidden``: the episode's
    parameters the tool takes."""
    run = _ToolRun(tool, timeout, hidden)
    payload = json.dumps(arguments)
    if not timer_usable():  # off the main thread turns run in worker processes, bounded there
        out = run.score_completion(payload, _NO_EXAMPLE)
    else:
        out = score_with_timer(run, payload, _NO_EXAMPLE, timeout)
    if isinstance(out, _Output):
        return out.text
    if out.error == "timeout":
        return f"error: {tool.name} timed out after {timeout:g} s"
    return f"error: {tool.name} failed: {out.error}"
