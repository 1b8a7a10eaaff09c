"""Test-session set-up: the Triton interpreter without its repeated language patching, and no
recorded layer programs carried from one test into the next.

Under `TRITON_INTERPRET=1` Triton patches `triton.language` for a kernel launch and restores it
after; every call of a `@triton.jit` helper inside that launch patches it again (the attributes
it would patch are already patched, so nothing changes), which walks the language's members and
took a third of an interpreted kernel's time in the slowest tests. Here a helper's call skips
the patching when the language modules it sees were patched already in this launch (by the
launch, or by a helper's call: Triton never restores those); any other call patches as Triton
does. The kernels run the same operations either way.
"""

from __future__ import annotations

import inspect

import pytest

from fp4cli.quant.backend import interpreter_on


@pytest.fixture(autouse=True)
def _fresh_layer_programs():
    """Each test starts with no recorded layer programs (`fp4cli.linear.plans`): a layer's
    first calls in a test run its executor's Python, whatever ran before."""
    from fp4cli.linear.plans import PROGRAMS

    PROGRAMS.clear()
    yield


def _skip_repeated_patches() -> None:
    from triton.runtime import interpreter

    patch_lang = getattr(interpreter, "_patch_lang", None)
    language = getattr(interpreter, "tl", None)
    if patch_lang is None or language is None:
        return  # another Triton's interpreter: leave it as it is
    active: list[frozenset[int]] = []  # the language modules patched in the running launch
    seen: dict[int, frozenset[int]] = {}

    def languages(fn) -> frozenset[int]:
        key = id(fn.__globals__)
        if key not in seen:
            modules = (language, language.core)
            seen[key] = frozenset(
                id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in modules
            )
        return seen[key]

    def patch_once(fn):
        wanted = languages(fn)
        if active and wanted <= active[-1]:
            return _NO_CHANGES
        scope = patch_lang(fn)
        if active:  # a helper's patch is never restored: it holds to the launch's end
            active[-1] = active[-1] | wanted
        else:  # a launch: its patch holds until it restores
            active.append(wanted)
            restore = scope.restore

            def restore_and_end() -> None:
                active.pop()
                restore()

            scope.restore = restore_and_end
        return scope

    interpreter._patch_lang = patch_once


class _NoChanges:
    def restore(self) -> None:
        pass


_NO_CHANGES = _NoChanges()

if interpreter_on():
    _skip_repeated_patches()
