"""Tool calls in chat, OpenAI's way: `tools` (functions with JSON-schema parameters) and
`tool_choice` ("none", "auto", "required", or one named function).

A call is the JSON object {"name": ..., "arguments": {...}}. When a call is required (or a
function named), the reply is constrained to exactly such an object, for one of the allowed
functions, its arguments valid against that function's parameter schema; with "auto" the
model is free, and a reply that is such an object for a known function is taken as a call.
The model hears of the tools through its chat template's `tools` variable; a template that
does not use it gets them in a system message instead, so that the model knows what exists.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ToolCall", "ToolSpec", "parse_tool_call", "parse_tools", "tool_call_schema", "tools_message"]

MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolSpec:
    """The functions offered and which of them a reply must call: `forced` is None ("auto":
    any reply), or the names a call must use ("required": all of them; a named function: it)."""

    functions: tuple[Mapping[str, Any], ...]  # {"name", "description"?, "parameters"?}
    forced: tuple[str, ...] | None

    @property
    def names(self) -> list[str]:
        return [f["name"] for f in self.functions]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI returns it

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


class ToolError(ValueError):
    """`tools` or `tool_choice` malformed; the message names the field (field attribute too)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_tools(tools: object, tool_choice: object) -> ToolSpec | None:
    """The ToolSpec of a request's `tools` and `tool_choice` (None: no tools, or "none")."""
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise ToolError("tool_choice", "tool_choice needs tools")
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)) or not 1 <= len(tools) <= MAX_TOOLS:
        raise ToolError("tools", f"tools must be a list of 1 to {MAX_TOOLS} functions")
    fns = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) and t.get("type", "function") == "function" else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolError("tools", f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, Mapping):
            raise ToolError("tools", f"tools[{i}].function.parameters must be a JSON schema object")
        fns.append({**fn, "parameters": params})
    try:  # rendered into the prompt, they must be text the tokenizer takes
        json.dumps(fns, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolError("tools", f"tools are not valid Unicode text: a lone surrogate at character {e.start} "
                                 "of their JSON") from None
    names = [f["name"] for f in fns]
    if len(set(names)) != len(names):
        raise ToolError("tools", "tools: two functions have the same name")
    if tool_choice in (None, "auto"):
        return ToolSpec(tuple(fns), None)
    if tool_choice == "none":
        return None
    if tool_choice == "required":
        return ToolSpec(tuple(fns), tuple(names))
    fn = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    named = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(named, str):
        raise ToolError("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if named not in names:
        raise ToolError("tool_choice", f"tool_choice names {named!r}, which is not among the tools")
    return ToolSpec(tuple(fns), (named,))


def tool_call_schema(spec: ToolSpec) -> dict[str, Any]:
    """The JSON schema of a call to one of spec.forced."""
    forced = spec.forced if spec.forced is not None else tuple(spec.names)
    options = [{"type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                "required": ["name", "arguments"], "additionalProperties": False}
               for f in spec.functions if f["name"] in forced]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tools_message(spec: ToolSpec) -> dict[str, str]:
    """A system message telling the model which functions exist and how a call is written
    (for templates that do not render `tools` themselves)."""
    listing = json.dumps([{k: f[k] for k in ("name", "description", "parameters") if k in f}
                          for f in spec.functions], ensure_ascii=False)
    return {"role": "system",
            "content": "You may call one of these functions by replying with only a JSON object "
                       '{"name": <function name>, "arguments": <its arguments>}: ' + listing}


def parse_tool_call(text: str, spec: ToolSpec) -> ToolCall | None:
    """The call a reply makes, or None when it is not a JSON call to one of the functions."""
    s = text.strip()
    if not s.startswith("{"):
        return None
    try:
        obj = json.loads(s)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in spec.names or not isinstance(obj.get("arguments"), dict):
        return None
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], json.dumps(obj["arguments"], ensure_ascii=False))
