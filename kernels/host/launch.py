"""Launching a kernel: every launcher in `fp4cli.kernels` calls `launch`, never `kernel[grid]`.

`launch` passes the compile-time flags (the kernel's tl.constexpr parameters) by name, checks
them against the kernel's parameters, and records the launch for `fp4cli.replay`. Within
`shapes_only` nothing is launched: torch.compile's fake implementations run the launchers for
their outputs' shapes.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fp4cli.quant.backend import interpreter_on
from fp4cli.replay.recorder import active_recorder

_SHAPES_ONLY = threading.local()


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Within: `launch` launches nothing. The launchers still allocate their outputs, so a
    custom op's fake implementation (torch.compile's shapes and dtypes) runs the real launcher
    code on fake tensors, with one definition of every output's layout."""
    previous = getattr(_SHAPES_ONLY, "on", False)
    _SHAPES_ONLY.on = True
    try:
        yield
    finally:
        _SHAPES_ONLY.on = previous


def launches_skipped() -> bool:
    """Whether a `shapes_only` block is running: launchers that call a kernel themselves
    return after allocating their outputs."""
    return getattr(_SHAPES_ONLY, "on", False)


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    args: Sequence[object],
    constexprs: Mapping[str, object],
    num_warps: int,
    fp_fusion: bool = True,
    written: Sequence[int] = (),
    **launch_options: Any,
) -> None:
    """kernel[grid](*args, **constexprs, num_warps=num_warps): `args` are the kernel's
    run-time arguments (pointers, sizes, seeds) in its parameter order, `constexprs` its
    compile-time flags by name, every one of them (a missing or unknown name is an error).
    `fp_fusion=False` compiles it without fused multiply-adds (each product rounded alone);
    `written`: the positions in `args` of the caller's tensors the kernel updates in place
    (a recording's CUDA graph copies them back; outputs the launcher allocated need no
    naming); `launch_options` are Triton's others (num_stages, maxnreg). Within a recording
    (`fp4cli.replay`) the launch is recorded with the kernel it ran.

    Triton itself is handed every argument by position, in the kernel's parameter order:
    it binds keyword arguments on every launch, which for the pair kernel's constexprs took as
    long as the rest of its dispatch (H100 host: 104-112 us a launch with keywords, 54 by
    position). A stand-in for a kernel (a test's) carries the kernel's `fn`."""
    if launches_skipped():
        return
    rest = _parameter_names(kernel)[len(args) :]
    if len(rest) != len(constexprs):
        raise TypeError(f"{kernel}: constexprs {sorted(constexprs)} are not its {list(rest)}")
    if any(not 0 <= i < len(args) for i in written):
        raise TypeError(
            f"{kernel}: written positions {list(written)} are not of its {len(args)} arguments"
        )
    options: dict[str, Any] = {"num_warps": num_warps, **launch_options}
    if not fp_fusion:
        options["enable_fp_fusion"] = False
    every = (*args, *[constexprs[name] for name in rest])
    recorder = active_recorder()
    if recorder is None:
        kernel[grid](*every, **options)
        return
    with recorder.paused():
        compiled = kernel[grid](*every, **options)
    compiled = None if interpreter_on() else compiled
    recorder.record_launch(kernel, grid, every, options, compiled, tuple(written))


@functools.cache
def _parameter_names(kernel: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(kernel.fn).parameters)
