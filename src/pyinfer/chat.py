"""Chat prompts: a GGUF's `tokenizer.chat_template` (Jinja2) rendered in a sandbox.

The template comes from the model file, so it is untrusted code: it runs in
`jinja2.sandbox.ImmutableSandboxedEnvironment`, never a plain Environment. A plain one let
a crafted GGUF run arbitrary Python (CVE-2024-34359, in llama-cpp-python). The sandbox
refuses attributes such as `__class__` or `__globals__` and any method that mutates a list
or dict, raising `jinja2.exceptions.SecurityError`.

The rendering environment matches what transformers gives templates: trim_blocks,
lstrip_blocks, the loop controls, a `tojson` filter that keeps non-ASCII text, and the
globals `raise_exception` and `strftime_now`; variables `messages`, `add_generation_prompt`,
`bos_token`, `eos_token` (and `tools` when given).

A rendered prompt already holds its special tokens as text, so it is tokenized with
add_bos=False, special=True (what llama-cpp-python does): see `ChatTemplate.encode`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyinfer.errors import ChatTemplateError, ParameterTypeError
from pyinfer.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")
TEMPLATE_KEY = "tokenizer.chat_template"


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to reject a conversation (roles that do not alternate, ...).
    raise ChatTemplateError(f"the chat template rejected the messages: {message}")


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters ('<' -> \u003c), which a prompt must not.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body: transformers uses the tag
    to mark assistant text for training masks, and some templates carry it."""

    tags = {"generation"}  # noqa: RUF012 (an instance attribute in jinja2's Extension)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Plain-dict copies of chat messages after checking them: a non-empty list of mappings,
    each with a role in ROLES and string content (an assistant message that carries
    `tool_calls` may have content None). Other keys (name, tool_call_id, ...) pass through.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ParameterTypeError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
            f"not {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty: a chat needs at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ParameterTypeError(f"messages[{i}] must be a dict, not {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(
                f"messages[{i}] has role {role!r}: it must be one of {', '.join(ROLES)}"
            )
        if "content" not in m:
            raise ValueError(f"messages[{i}] ({role}) has no 'content'")
        content = m["content"]
        if not isinstance(content, str) and not (
            content is None and role == "assistant" and m.get("tool_calls")
        ):
            raise ParameterTypeError(
                f"messages[{i}] ({role}): content must be a str, not {type(content).__name__}"
            )
        out.append(dict(m))
    return out


class ChatTemplate:
    """A compiled chat template.

    >>> tmpl = ChatTemplate.from_metadata(reader.metadata)
    >>> tmpl.render([{"role": "user", "content": "Hi"}])
    '<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        if not isinstance(source, str):
            raise ParameterTypeError(f"a chat template is a str, not {type(source).__name__}")
        if not source.strip():
            raise ChatTemplateError("the chat template is empty")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"the chat template does not parse: {e.message} (line {e.lineno})"
            ) from e

    @classmethod
    def from_metadata(
        cls,
        metadata: Mapping[str, Any],
        *,
        template: str | None = None,
        name: str | None = None,
    ) -> ChatTemplate:
        """The template of a GGUF file's metadata, with its BOS/EOS token texts.

        template: use this source instead of the file's (files without one, or to override
        it). name: a named variant, `tokenizer.chat_template.<name>` (e.g. "tool_use").
        """
        if template is None:
            key = TEMPLATE_KEY if name is None else f"{TEMPLATE_KEY}.{name}"
            template = metadata.get(key)
            if template is None:
                raise ChatTemplateError(
                    f"the model file has no {key!r} in its metadata: pass the template "
                    "explicitly (template=...)"
                )
            if not isinstance(template, str):
                raise ChatTemplateError(f"{key!r} in the metadata is not a string")
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def token_text(which: str) -> str:
            i = metadata.get(f"tokenizer.ggml.{which}_token_id")
            return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else ""

        return cls(template, bos_token=token_text("bos"), eos_token=token_text("eos"))

    @classmethod
    def load(cls, model: Any = None, **kwargs: Any) -> ChatTemplate:
        """The template of a GGUF file: a path, a known model name, or None (the default)."""
        from pyinfer.gguf import GGUFReader
        from pyinfer.registry import resolve_model

        with GGUFReader(resolve_model(model)) as reader:
            return cls.from_metadata(reader.metadata, **kwargs)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """The prompt text for `messages`. add_generation_prompt: end with the header of
        an assistant turn, so the model writes the reply. Extra keyword arguments become
        template variables (e.g. enable_thinking=False).

        Raises ValueError for invalid messages, ChatTemplateError when the template
        rejects them, jinja2.exceptions.SecurityError when it tries to escape the sandbox.
        """
        msgs = validate_messages(messages)
        context: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **variables,
            "messages": msgs,
            "add_generation_prompt": bool(add_generation_prompt),
        }
        if tools is not None:
            context["tools"] = tools
        return self._template.render(**context)

    def encode(
        self,
        tokenizer: Tokenizer,
        messages: Sequence[Mapping[str, Any]],
        **kwargs: Any,
    ) -> list[int]:
        """The token ids of render(messages, **kwargs): special-token texts in the
        rendering become their ids, and no BOS is added (a template that wants one writes
        bos_token itself). These are llama.cpp's ids for a chat prompt."""
        return tokenizer.tokenize(self.render(messages, **kwargs), add_bos=False, special=True)

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars, bos={self.bos_token!r}, eos={self.eos_token!r})"
