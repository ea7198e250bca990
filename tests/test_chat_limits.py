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
    "center": ("{{ 'a' | center(10 ** 9) }}", "an argument of 1,000,000,000"),
    "indent": ("{{ 'a\nb' | indent(10 ** 9) }}", "an argument of"),
    "exponential macro recursion": ("{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}"
                                    "{{ f(60) }}", "rendering took more than 0.3 s"),
    "exponential caller recursion": ("{% macro g(n) %}{% if n > 0 %}{{ caller(n-1) }}{{ caller(n-1) }}{% endif %}"
                                     "{% endmacro %}{% macro f(n) %}{% call(m) g(n) %}{{ f(m) }}{% endcall %}"
                                     "{% endmacro %}{{ f(40) }}", "rendering took more than 0.3 s"),
    "recursive loop": ("{% for x in [1, 2] recursive %}{% if loop.depth < 60 %}{{ loop([1, 2]) }}{% endif %}"
                       "{% endfor %}", "rendering took more than 0.3 s"),
    "sorting a huge list": ("{% set a = (range(99999) | list) * 20 %}{{ a | sort | length }}", "repeating 99,999"),
    "filter over a huge list": ("{{ ((range(99999) | list) * 160) | select('odd') | list }}", "repeating"),
    "big integer": ("{% set a = 7 ** 3000000 %}", "digits"),
    "big integer product": ("{% set a = 7 ** 4000 %}{% set b = a * a * a %}", "integer product too large"),
    "ljust": ("{{ 'a'.ljust(300000000) }}", "an argument of 300,000,000"),
    "expandtabs": ("{{ ('\t' * 1000).expandtabs(300000) }}", "a value of"),
    "star width": ("{{ '%*d' % (300000000, 1) }}", "an argument of 300,000,000"),
    "nested format width": ("{{ '{:{}}'.format(1, 300000000) }}", "an argument of 300,000,000"),
    "replace growth": ("{% set s = 'a' * 20000 %}{{ s.replace('a', s) | length }}", "a replacement building"),
    "slice": ("{{ range(3) | slice(100000000) | list }}", "an argument of 100,000,000"),
    "batch": ("{{ range(3) | batch(100000000, 'x') | list }}", "an argument of 100,000,000"),
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
    assert ticks > 20  # about 1 s of 1 ms sleeps: none, had the GIL been held throughout


def test_ordinary_templates_are_unchanged() -> None:
    src = ("{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' }}{{ m['content'] | trim }}\n{% endfor %}"
           "{% if add_generation_prompt %}{{ '%s:' % 'assistant' }}{{ '{:>3}'.format('x') }}{% endif %}")
    assert ChatTemplate(src).render(MSGS) == "<|user|>hi\nassistant:  x"
    # The deadline is per rendering: one that ran out does not spoil the next.
    t = ChatTemplate(HOSTILE["nested loops"][0], limits=FAST)
    with pytest.raises(ChatTemplateError):
        t.render(MSGS)
    assert ChatTemplate("{% for i in range(5) %}{{ i }}{% endfor %}", limits=FAST).render(MSGS) == "01234"
    assert "lipsum" not in src
