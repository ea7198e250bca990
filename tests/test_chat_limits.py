"""Hostile chat templates: loops that do not end, huge arithmetic and huge strings are stopped
with ChatTemplateError within the render's limits, other threads keep running meanwhile, and
a failing template names what failed."""

from __future__ import annotations

import threading
import time

import pytest

from pyinfer import ChatTemplate, ChatTemplateError
from pyinfer.chat import RenderLimits

MSGS = [{"role": "user", "content": "hi"}]
FAST = RenderLimits(seconds=0.3)

HOSTILE = {
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "rendering took more than 0.3 s"),
    "loop over a long string": ("{% for a in 'x' * 100000 %}{% for b in 'y' * 100000 %}{% endfor %}{% endfor %}",
                                "rendering took more than 0.3 s"),
    "power": ("{% set n = 8 %}{{ (n + 8) ** (9 ** 9) }}", "16 ** 387420489 would have about"),
    "constant power": ("{{ (8 + 8) ** (9 ** 9) }}", "would have about"),
    "string repeat": ("{{ 'a' * 10 ** 9 }}", "repeating 1 items 1,000,000,000 times"),
    "list repeat": ("{{ ([1, 2] * 10 ** 9) | length }}", "repeating 2 items"),
    "doubling": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                 "{% endfor %}{{ ns.s | length }}", "a value of"),
    "doubling with +": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                        "{% endfor %}", "a value of"),
    "output": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "characters of output"),
    "center": ("{{ 'a' | center(10 ** 9) }}", "a width of 1,000,000,000"),
    "indent": ("{{ 'a\nb' | indent(10 ** 9) }}", "a width of"),
    "percent format": ("{{ '%999999999d' % 1 }}", "format width"),
    "str.format": ("{{ '{:999999999}'.format(1) }}", "format width"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "undefined": ("{{ foo.bar }}", "UndefinedError: 'foo' is undefined"),
    "division": ("{{ 1 / 0 }}", "ZeroDivisionError"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_stopped(name: str) -> None:
    source, message = HOSTILE[name]
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        ChatTemplate(source, limits=FAST).render(MSGS)
    assert time.monotonic() - t0 < 5


def test_reserved_names_are_refused() -> None:
    with pytest.raises(ChatTemplateError, match="reserved"):
        ChatTemplate("{% set _pyinfer_loop = 1 %}{% for i in range(3) %}{% endfor %}")


def test_other_threads_run_while_a_template_loops() -> None:
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        with pytest.raises(ChatTemplateError):
            ChatTemplate(HOSTILE["nested loops"][0], limits=RenderLimits(seconds=1.0)).render(MSGS)
        with pytest.raises(ChatTemplateError):
            ChatTemplate(HOSTILE["power"][0]).render(MSGS)
    finally:
        stop.set()
        t.join()
    assert ticks > 100  # about 1 s of 1 ms sleeps, had the GIL not been held throughout


def test_ordinary_templates_are_unchanged() -> None:
    src = ("{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' }}{{ m['content'] | trim }}\n{% endfor %}"
           "{% if add_generation_prompt %}{{ '%s:' % 'assistant' }}{{ '{:>3}'.format('x') }}{% endif %}")
    assert ChatTemplate(src).render(MSGS) == "<|user|>hi\nassistant:  x"
    # The deadline is checked every 256 loop steps, and per rendering.
    t = ChatTemplate("{% for i in range(5) %}{{ i }}{% endfor %}", limits=RenderLimits(seconds=0.001))
    assert t.render(MSGS) == "01234"
