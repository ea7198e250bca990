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

Rendering is bounded as well (`RenderLimits`): a template that loops or recurses for ever,
computes a number of millions of digits (which would hold the GIL for minutes), or builds
gigabytes of text is stopped with ChatTemplateError. Every loop step, call (macros, caller(),
methods) and filter checks a deadline; `**`, `*`, `+` and `%` refuse results past a size
limit before computing them; integer arguments of millions (widths, counts) are refused;
every value a call, filter or `~` join makes is size-checked, and the output is capped. With
values held under a million items, no single operation holds the GIL for long.

A rendered prompt already holds its special tokens as text, so it is tokenized with
add_bos=False, special=True (what llama-cpp-python does): see `ChatTemplate.encode`.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyinfer.errors import ChatTemplateError, ParameterTypeError
from pyinfer.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")
# Other names of a role: OpenAI's newer models take their instructions as "developer"
# messages, which every template here knows as "system".
ROLE_ALIASES = {"developer": "system"}
TEMPLATE_KEY = "tokenizer.chat_template"

# Gemma's turns, for the files that carry no template of their own (llama.cpp also falls back
# to a built-in format for them): `<start_of_turn>user` / `<start_of_turn>model` turns, each
# closed by `<end_of_turn>` and a newline. Gemma has no system turn: a system message opens
# the first user turn, followed by a blank line.
GEMMA_TURNS = """{{ bos_token }}
{%- set ns = namespace(system='') %}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- if not loop.first %}{{ raise_exception('a system message must come first') }}{% endif %}
{%- set ns.system = m.content | trim + '\n\n' %}
{%- elif m.role == 'user' or m.role == 'assistant' %}
{{- '<start_of_turn>' + ('model' if m.role == 'assistant' else 'user') + '\n' }}
{{- ns.system + (m.content or '') | trim }}
{{- '<end_of_turn>\n' }}
{%- set ns.system = '' %}
{%- else %}
{{- raise_exception('Gemma turns are user or assistant (model), not ' + m.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"""

# Templates for files without tokenizer.chat_template, by general.architecture.
BUILTIN_TEMPLATES = {"gemma3": GEMMA_TURNS}


@dataclass(frozen=True)
class ChatFormat:
    """A named prompt format (llama-cpp-python's `chat_format=` names): its template, and the
    text that ends a reply in it (a stop string; the model's own end-of-turn tokens stop
    generation anyway)."""

    template: str
    stop: str


def _turns(system: str, user: str, assistant: str, generation: str) -> str:
    """A template of one header per message: system/user/assistant are Jinja expressions of
    `m` (the message) and `c` (its content), generation the header that opens the reply."""
    return (
        "{%- for m in messages -%}{%- set c = m.content or '' -%}"
        "{%- if m.role == 'system' -%}{{ " + system + " }}"
        "{%- elif m.role == 'user' -%}{{ " + user + " }}"
        "{%- elif m.role == 'assistant' -%}{{ " + assistant + " }}"
        "{%- else -%}{{ raise_exception('this chat format has no ' + m.role + ' turns') }}{%- endif -%}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{ " + generation + " }}{%- endif -%}"
    )


# Llama 2 and Mistral's [INST] turns: a system message goes inside the first user turn (Llama 2
# in a <<SYS>> block, Mistral ahead of the text), each reply is closed by the EOS token, and
# (Llama 2) the next turn opens with the BOS token again.
_LLAMA2 = (
    "{{- bos_token -}}{%- set ns = namespace(system='', replied=false) -%}"
    "{%- for m in messages -%}{%- set c = m.content or '' -%}"
    "{%- if m.role == 'system' -%}{%- set ns.system = '<<SYS>>\\n' + c + '\\n<</SYS>>\\n\\n' -%}"
    "{%- elif m.role == 'user' -%}{{ (bos_token if ns.replied else '') + '[INST] ' + ns.system + c + ' [/INST]' }}"
    "{%- set ns.system = '' -%}{%- set ns.replied = false -%}"
    "{%- elif m.role == 'assistant' -%}{{ ' ' + c + ' ' + eos_token }}{%- set ns.replied = true -%}"
    "{%- else -%}{{ raise_exception('this chat format has no ' + m.role + ' turns') }}{%- endif -%}"
    "{%- endfor -%}"
)
_MISTRAL = (
    "{{- bos_token -}}{%- set ns = namespace(system='') -%}"
    "{%- for m in messages -%}{%- set c = m.content or '' -%}"
    "{%- if m.role == 'system' -%}{%- set ns.system = c + '\\n\\n' -%}"
    "{%- elif m.role == 'user' -%}{{ '[INST] ' + ns.system + c + ' [/INST]' }}{%- set ns.system = '' -%}"
    "{%- elif m.role == 'assistant' -%}{{ c + eos_token }}"
    "{%- else -%}{{ raise_exception('this chat format has no ' + m.role + ' turns') }}{%- endif -%}"
    "{%- endfor -%}"
)

# The formats by llama-cpp-python's names. The text of each turn is the format's published
# layout; a format that opens with the BOS token writes bos_token itself (the prompt is
# tokenized without adding one, as for a file's own template; pyinfer.Llama blanks it for a
# file that adds no BOS).
CHAT_FORMATS: dict[str, ChatFormat] = {
    "chatml": ChatFormat(_turns("'<|im_start|>system\\n' + c + '<|im_end|>\\n'",
                                "'<|im_start|>user\\n' + c + '<|im_end|>\\n'",
                                "'<|im_start|>assistant\\n' + c + '<|im_end|>\\n'",
                                "'<|im_start|>assistant\\n'"), "<|im_end|>"),
    "llama-2": ChatFormat(_LLAMA2, "</s>"),
    "llama-3": ChatFormat("{{- bos_token -}}" + _turns(
        "'<|start_header_id|>system<|end_header_id|>\\n\\n' + c + '<|eot_id|>'",
        "'<|start_header_id|>user<|end_header_id|>\\n\\n' + c + '<|eot_id|>'",
        "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' + c + '<|eot_id|>'",
        "'<|start_header_id|>assistant<|end_header_id|>\\n\\n'"), "<|eot_id|>"),
    "mistral-instruct": ChatFormat(_MISTRAL, "</s>"),
    "gemma": ChatFormat(GEMMA_TURNS, "<end_of_turn>"),
    "phi-3": ChatFormat(_turns("'<|system|>\\n' + c + '<|end|>\\n'", "'<|user|>\\n' + c + '<|end|>\\n'",
                               "'<|assistant|>\\n' + c + '<|end|>\\n'", "'<|assistant|>\\n'"), "<|end|>"),
    "alpaca": ChatFormat(_turns("c + '\\n\\n'", "'### Instruction:\\n' + c + '\\n\\n'",
                                "'### Response:\\n' + c + '\\n\\n'", "'### Response:\\n'"), "### Instruction:"),
    "vicuna": ChatFormat(_turns("c + ' '", "'USER: ' + c + ' '", "'ASSISTANT: ' + c + '</s>'", "'ASSISTANT:'"),
                         "USER:"),
    "zephyr": ChatFormat(_turns("'<|system|>\\n' + c + '</s>\\n'", "'<|user|>\\n' + c + '</s>\\n'",
                                "'<|assistant|>\\n' + c + '</s>\\n'", "'<|assistant|>\\n'"), "</s>"),
}


def builtin_template(metadata: Mapping[str, Any]) -> str | None:
    """The built-in template for a file that has none of its own, or None."""
    if TEMPLATE_KEY in metadata:
        return None
    arch = metadata.get("general.architecture")
    return BUILTIN_TEMPLATES.get(arch) if isinstance(arch, str) else None


def has_chat_template(metadata: Mapping[str, Any]) -> bool:
    """Whether chat prompts can be rendered for this file: its own template or a built-in one."""
    return TEMPLATE_KEY in metadata or builtin_template(metadata) is not None


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


@dataclass(frozen=True)
class RenderLimits:
    """What one rendering may spend: wall time (checked at every loop step and every call),
    characters of output, the size of any one value (string or list) and of any integer (in
    decimal digits). No template needs values of millions of items or numbers of thousands of
    digits; refusing them keeps every single operation short, so none holds the GIL long."""

    seconds: float = 2.0
    output_chars: int = 16 << 20
    value_size: int = 1 << 20
    int_digits: int = 10_000


class _Budget(threading.local):
    """The limits and deadline of the rendering running on this thread."""

    limits: RenderLimits | None = None
    deadline: float = 0.0


_budget = _Budget()


def _limits() -> RenderLimits:
    return _budget.limits or RenderLimits()


def _over(what: str) -> NoReturn:
    raise ChatTemplateError(f"the chat template exceeded its limits: {what}")


def _tick() -> None:
    if time.monotonic() > _budget.deadline:
        _over(f"rendering took more than {_limits().seconds:g} s (a loop or recursion that does not end?)")


def _check_size(value: Any) -> Any:
    """value, unless a string or sequence longer than the value-size limit."""
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > _limits().value_size:
        _over(f"a value of {len(value):,} items (limit {_limits().value_size:,})")
    return value


def _check_args(args: Iterable[Any]) -> None:
    """Refuse integer arguments past the value-size limit: widths, counts and repeats of
    millions (ljust, center, batch, slice, '%*d', '{:{}}'...) build values that large."""
    limit = _limits().value_size
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > limit:
            _over(f"an argument of {a:,} (limit {limit:,})")


def _loop_guard(iterable: Iterable[Any]) -> Iterator[Any]:
    """Every loop iterates through this: the deadline is checked at each step."""
    for item in iterable:
        _tick()
        yield item


_WIDTH = re.compile(r"[0-9]{7,}")


def _check_widths(fmt: str) -> None:
    """Refuse a format string (`%` or str.format) with a field width or precision of millions."""
    if _WIDTH.search(fmt):
        _over("a format width of millions of characters")


def _int_digits(x: int) -> float:
    return (abs(x).bit_length() + 1) * math.log10(2)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with loops, calls, arithmetic and string building bounded."""

    intercepted_binops = frozenset({"**", "*", "+", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        lim = _limits()
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left) > 1 and right * _int_digits(left) > lim.int_digits:
                _over(f"{left} ** {right} would have about {right * _int_digits(left):,.0f} digits")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > lim.value_size:
                    _over(f"repeating {len(seq):,} items {n:,} times")
            both_int = isinstance(left, int) and isinstance(right, int)
            if both_int and _int_digits(left) + _int_digits(right) > lim.int_digits:
                _over("an integer product too large")
        elif operator == "%" and isinstance(left, str):
            _check_widths(left)
            _check_args(right if isinstance(right, tuple) else right.values() if isinstance(right, dict) else [right])
        elif (operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple))
              and len(left) + len(right) > lim.value_size):
            _over(f"a value of {len(left) + len(right):,} items (limit {lim.value_size:,})")
        return _check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        # Macros, caller(), loop() of recursive loops and methods all come through here.
        _tick()
        _check_args(args)
        _check_args(kwargs.values())
        if isinstance(getattr(__obj, "__self__", None), str) and getattr(__obj, "__name__", "") == "replace":
            s, old, new = __obj.__self__, args[0] if args else "", args[1] if len(args) > 1 else ""
            if isinstance(old, str) and isinstance(new, str) and old and len(new) > len(old):
                grows = s.count(old) * (len(new) - len(old))
                if len(s) + grows > _limits().value_size:
                    _over(f"a replacement building {len(s) + grows:,} characters")
        return _check_size(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        _check_widths(value.__self__)  # the format string whose method is being called
        return wrapped

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for n in tree.find_all(nodes.Name):
            if n.name.startswith("_pyinfer"):
                raise jinja2.TemplateSyntaxError(f"the name {n.name!r} is reserved", n.lineno)
        # Every for loop iterates through _loop_guard; every `~` join is size-checked.
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.Name("_pyinfer_loop", "load"), [loop.iter], [], None, None)
        for parent in list(tree.find_all(nodes.Node)):
            for field in parent.fields:
                child = getattr(parent, field, None)
                if isinstance(child, nodes.Concat):
                    setattr(parent, field, nodes.Call(nodes.Name("_pyinfer_size", "load"), [child], [], None, None))
                elif isinstance(child, list):
                    for i, c in enumerate(child):
                        if isinstance(c, nodes.Concat):
                            child[i] = nodes.Call(nodes.Name("_pyinfer_size", "load"), [c], [], None, None)
        return tree


def _bounded_filter(f: Any) -> Any:
    """A filter whose integer arguments and result are held to the limits, with the deadline
    checked before it runs (filters do not come through Environment.call)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _tick()
        _check_args(args)
        _check_args(kwargs.values())
        for a in args:
            _check_size(a)
        return _check_size(f(*args, **kwargs))

    wrapped.__name__ = getattr(f, "__name__", "filter")
    # Keep how jinja passes the environment, context or eval context to the filter.
    for attr in ("jinja_pass_arg",):
        if hasattr(f, attr):
            setattr(wrapped, attr, getattr(f, attr))
    return wrapped


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    for name, f in list(env.filters.items()):
        env.filters[name] = _bounded_filter(f)
    env.tests = {name: _bounded_filter(t) for name, t in env.tests.items()}
    del env.globals["lipsum"]  # placeholder text, of any length asked: no template needs it
    env.globals["range"] = _bounded_filter(env.globals["range"])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["_pyinfer_loop"] = _loop_guard
    env.globals["_pyinfer_size"] = _check_size
    return env


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Plain-dict copies of chat messages after checking them: a non-empty list of mappings,
    each with a role in ROLES (or ROLE_ALIASES, renamed) and string content (an assistant
    message that carries `tool_calls` may have content None). Other keys (name, tool_call_id,
    ...) pass through.
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
        if isinstance(role, str) and role in ROLE_ALIASES:
            m = {**m, "role": ROLE_ALIASES[role]}
            role = m["role"]
        if role not in ROLES:
            raise ValueError(
                f"messages[{i}] has role {role!r}: it must be one of {', '.join((*ROLES, *ROLE_ALIASES))}"
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

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 limits: RenderLimits | None = None) -> None:
        if not isinstance(source, str):
            raise ParameterTypeError(f"a chat template is a str, not {type(source).__name__}")
        if not source.strip():
            raise ChatTemplateError("the chat template is empty")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.limits = limits or RenderLimits()
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
        A file with no template of its own gets its architecture's built-in one, if any
        (BUILTIN_TEMPLATES).
        """
        if template is None:
            key = TEMPLATE_KEY if name is None else f"{TEMPLATE_KEY}.{name}"
            template = metadata.get(key)
            if template is None and name is None:
                template = builtin_template(metadata)
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
        rejects them, fails, or exceeds its limits (`self.limits`), and
        jinja2.exceptions.SecurityError when it tries to escape the sandbox.
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
        outer = (_budget.limits, _budget.deadline)
        _budget.limits, _budget.deadline = self.limits, time.monotonic() + self.limits.seconds
        try:
            parts, n = [], 0
            for part in self._template.generate(**context):
                n += len(part)
                if n > self.limits.output_chars:
                    _over(f"more than {self.limits.output_chars:,} characters of output")
                parts.append(part)
            return "".join(parts)
        except (ChatTemplateError, SecurityError):
            raise
        except RecursionError:
            raise ChatTemplateError("the chat template failed: it recursed too deeply") from None
        except (jinja2.TemplateError, ArithmeticError, TypeError, ValueError, LookupError, AttributeError) as e:
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e
        finally:
            _budget.limits, _budget.deadline = outer

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
