"""What the fuzz harnesses share: coverage instrumentation of pyinfer's Python code, and running
libFuzzer through atheris on one function with the process's arguments (corpus directories,
-runs, -max_total_time, ...)."""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterable

import atheris


def instrument(modules: Iterable[types.ModuleType]) -> int:
    """Instrument every function and method defined in these modules; the count.

    atheris.instrument_imports() hooks the import system, but an editable install's loader
    bypasses its hook (the code comes back uninstrumented), so the functions are patched
    where they are instead."""
    seen: set[int] = set()

    def patch(f: object) -> None:
        f = inspect.unwrap(f) if callable(f) else f
        if isinstance(f, types.FunctionType) and id(f) not in seen:
            seen.add(id(f))
            atheris.instrument_func(f)

    for mod in modules:
        for obj in list(vars(mod).values()):
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj):
                for member in vars(obj).values():
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    elif isinstance(member, property):
                        for acc in (member.fget, member.fset):
                            patch(acc)
                        continue
                    patch(member)
            else:
                patch(obj)
    return len(seen)


def fuzz(test_one_input: Callable[[bytes], None], modules: Iterable[types.ModuleType]) -> None:
    n = instrument(modules)
    print(f"INFO: instrumented {n} functions", file=sys.stderr)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
