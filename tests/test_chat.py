"""Chat templates: llama.cpp's chat prompt ids for the default model, the variables and
helpers templates expect, message validation, and templates that try to escape the
sandbox (CVE-2024-34359) failing with SecurityError instead of running."""

from __future__ import annotations

from pathlib import Path

import pytest
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyinfer import ChatTemplate, ChatTemplateError, Tokenizer
from pyinfer.errors import ParameterTypeError
from pyinfer.gguf import GGUFReader

from _reference import load

CHAT_CASES = [c for c in load("gen_llamacpp.json")["cases"] if c["kind"] == "chat"]
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def metadata(default_model: Path) -> dict:
    with GGUFReader(default_model) as r:
        return dict(r.metadata)


@pytest.fixture(scope="module")
def tmpl(metadata: dict) -> ChatTemplate:
    return ChatTemplate.from_metadata(metadata)


@pytest.fixture(scope="module")
def tok(metadata: dict) -> Tokenizer:
    return Tokenizer(metadata)


# ---- the default model's template against llama.cpp


def test_reference_has_the_four_chat_prompts():
    assert len(CHAT_CASES) == 4


@pytest.mark.parametrize("case", CHAT_CASES, ids=lambda c: c["messages"][-1]["content"][:20])
def test_rendering_gives_llama_cpp_prompt_ids(case, tmpl: ChatTemplate, tok: Tokenizer):
    text = tmpl.render(case["messages"], add_generation_prompt=True)
    assert text == case["prompt"]
    # the rendering holds its special tokens as text: no BOS added, specials matched
    assert tok.tokenize(text, add_bos=False, special=True) == case["prompt_ids"]
    assert tmpl.encode(tok, case["messages"]) == case["prompt_ids"]


def test_default_system_prompt_and_generation_prompt(tmpl: ChatTemplate):
    with_prompt = tmpl.render(USER)
    without = tmpl.render(USER, add_generation_prompt=False)
    assert with_prompt == without + "<|im_start|>assistant\n"
    assert without.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    own = tmpl.render([{"role": "system", "content": "Be brief."}, *USER])
    assert own.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "SmolLM" not in own


def test_multi_turn_conversation(tmpl: ChatTemplate, tok: Tokenizer):
    msgs = [
        *USER,
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = tmpl.render(msgs)
    assert text.endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tmpl.encode(tok, msgs)
    im_start = tok.tokenize("<|im_start|>", add_bos=False, special=True)
    assert len(im_start) == 1 and ids.count(im_start[0]) == 5


def test_bos_and_eos_come_from_the_metadata(metadata: dict):
    t = ChatTemplate.from_metadata(metadata, template="{{ bos_token }}|{{ eos_token }}")
    assert t.render(USER) == "<|im_start|>|<|im_end|>"
    assert (t.bos_token, t.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_load_reads_the_default_model():
    assert ChatTemplate.load().source.startswith("{% for message in messages %}")


# ---- template environment


def test_rendering_runs_in_the_immutable_sandbox(tmpl: ChatTemplate):
    assert isinstance(tmpl._template.environment, ImmutableSandboxedEnvironment)


def test_raise_exception_rejects_messages_with_the_templates_message():
    t = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok"
    )
    assert t.render(USER) == "ok"
    with pytest.raises(ChatTemplateError, match="must start with a user message") as e:
        t.render([{"role": "assistant", "content": "x"}])
    assert isinstance(e.value, ValueError)


def test_transformers_conveniences():
    t = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m | tojson }}{% endfor %}\n"
        "  {% generation %}{{ 'G' }}{% endgeneration %}\n"
        "{{ strftime_now('%Y') | length }}{{ extra }}"
    )
    out = t.render([{"role": "user", "content": "café <b>"}, *USER], extra="!")
    # tojson keeps non-ASCII and HTML characters; trim_blocks/lstrip_blocks apply
    assert out == '{"role": "user", "content": "café <b>"}G4!'


def test_tools_are_passed_when_given():
    t = ChatTemplate("{% if tools %}{{ tools[0].name }}{% else %}none{% endif %}")
    assert t.render(USER) == "none"
    assert t.render(USER, tools=[{"name": "search"}]) == "search"


def test_missing_template_names_the_key_and_the_override_works(metadata: dict):
    bare = {k: v for k, v in metadata.items() if k != "tokenizer.chat_template"}
    with pytest.raises(ChatTemplateError, match=r"tokenizer\.chat_template.*template="):
        ChatTemplate.from_metadata(bare)
    t = ChatTemplate.from_metadata(bare, template="{{ messages[0].content }}")
    assert t.render(USER) == "Hi"
    with pytest.raises(ChatTemplateError, match=r"tokenizer\.chat_template\.tool_use"):
        ChatTemplate.from_metadata(metadata, name="tool_use")
    named = {**bare, "tokenizer.chat_template.tool_use": "T{{ messages | length }}"}
    assert ChatTemplate.from_metadata(named, name="tool_use").render(USER) == "T1"


def test_broken_templates_fail_clearly():
    with pytest.raises(ChatTemplateError, match="does not parse.*line 1"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="empty"):
        ChatTemplate("  ")
    with pytest.raises(ParameterTypeError):
        ChatTemplate(b"{{ x }}")  # type: ignore[arg-type]


# ---- message validation


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "empty"),
        ("hello", "list"),
        ({"role": "user", "content": "x"}, "list"),
        (["hello"], r"messages\[0\] must be a dict"),
        ([{"role": "robot", "content": "x"}], "role 'robot'.*system, user, assistant, tool"),
        ([{"content": "x"}], "role None"),
        ([{"role": "user"}], "no 'content'"),
        ([{"role": "user", "content": 3}], "content must be a str"),
        ([*USER, {"role": "user", "content": None}], r"messages\[1\] \(user\)"),
        ([{"role": "assistant", "content": None}], "content must be a str"),
    ],
)
def test_invalid_messages_raise_value_error(tmpl: ChatTemplate, messages, match):
    with pytest.raises(ValueError, match=match):
        tmpl.render(messages)


def test_tool_messages_and_tool_calls_are_accepted():
    t = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")
    msgs = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]},
        {"role": "tool", "content": "42", "tool_call_id": "1"},
    ]
    assert t.render(msgs) == "user:Hi;assistant:None;tool:42;"


def test_messages_are_not_changed(tmpl: ChatTemplate):
    msgs = [{"role": "user", "content": "Hi", "name": "x"}]
    tmpl.render(msgs)
    assert msgs == [{"role": "user", "content": "Hi", "name": "x"}]


# ---- sandbox escapes (CVE-2024-34359 was the first of these, in a GGUF's template)

ESCAPES = [
    # the published exploit: os through a global's __init__.__globals__
    "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ joiner.__init__.__globals__.os.system('touch {marker}') }}",
    "{{ raise_exception.__globals__['__builtins__']['open']('{marker}', 'w') }}",
    # climbing from a str to object and its subclasses
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    # str.format and the attr filter reach attributes by other routes
    "{{ '{0.__class__.__mro__}'.format(messages) }}",
    "{{ (messages | attr('__class__')).__mro__ }}",
    "{% set f = '{0.__class__.__mro__}'.format %}{{ f(messages) }}",
    # mutating what the caller passed
    "{{ messages.append({'role': 'user', 'content': 'x'}) }}",
    "{% set _ = messages[0].update({'content': 'pwned'}) %}",
    "{{ messages.pop() }}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_sandbox_escapes_raise_security_error_and_do_nothing(source: str, tmp_path: Path):
    marker = tmp_path / "pwned"
    msgs = [{"role": "user", "content": "Hi"}]
    t = ChatTemplate(source.replace("{marker}", str(marker)))
    with pytest.raises(SecurityError):
        t.render(msgs)
    assert not marker.exists()
    assert msgs == [{"role": "user", "content": "Hi"}]


def test_unsafe_attributes_render_as_nothing_rather_than_leak():
    # a lone unsafe attribute is undefined (empty), as in transformers; using it raises
    assert ChatTemplate("[{{ ''.__class__ }}]").render(USER) == "[]"
