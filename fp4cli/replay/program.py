"""A recorded call as one Python function: `HostProgram(recording)(inputs)` reruns its steps
on new inputs of the recorded shapes, dtypes and strides and returns the call's result, its
tensors new.

The function is generated source, one line a step: an aten operation calls the operator's C++
callable, a kernel launch on a GPU calls the launcher of the compiled kernel the recording ran
(what Triton's `JITFunction.run` calls once it has bound the arguments and found the kernel),
under the interpreter it launches as `fp4cli.kernels.host.launch.launch` does, and a host step calls
its function. Non-tensor arguments are the recorded values.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fp4cli.replay.recorder import CAST, CallStep, Const, LaunchStep, OpStep, Recording, Slot


class ReplayMismatch(RuntimeError):
    """A host step returned other than in the recorded call."""


class HostProgram:
    """The replay of a `Recording` (see the module)."""

    def __init__(self, recording: Recording, device: torch.device | None) -> None:
        self.recording, self.device = recording, device
        self.steps = len(recording.steps)
        self._source, namespace = _generate(recording, device)
        exec(compile(self._source, "<fp4cli replay>", "exec"), namespace)
        self._replay: Callable[..., Any] = namespace["replay"]

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        return self._replay(*inputs)

    @property
    def source(self) -> str:
        """The generated function's source (what a replay runs)."""
        return self._source


class _Writer:
    """Names for constants and lines of the generated function."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {}
        self.lines: list[str] = []

    def constant(self, value: Any) -> str:
        if value is None or isinstance(value, bool):
            return repr(value)
        if type(value) is int:
            return repr(value)
        name = f"c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def expression(self, template: Any) -> str:
        """Source for a template: Slots by name, Consts by value, lists and tuples spelled."""
        if isinstance(template, Slot):
            return _slot_name(template)
        if isinstance(template, Const):
            return self.constant(template.value)
        if isinstance(template, list):
            return "[" + ", ".join(self.expression(t) for t in template) + "]"
        if isinstance(template, tuple):
            items = [self.expression(t) for t in template]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(template, dict):
            pairs = ", ".join(f"{k!r}: {self.expression(v)}" for k, v in template.items())
            return "{" + pairs + "}"
        return self.constant(template)

    def call(self, function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        parts = [self.expression(a) for a in args]
        parts += [f"{k}={self.expression(v)}" for k, v in kwargs.items()]
        return f"{self.constant(function)}({', '.join(parts)})"

    def assign(self, outputs: Any, value: str, comment: str) -> None:
        value = f"{value}  # {comment}"
        if outputs is None:
            self.lines.append(value)
        elif isinstance(outputs, Slot):
            self.lines.append(f"{_slot_name(outputs)} = {value}")
        else:  # a tuple of slots (None where nothing is named)
            self.lines.append(f"r = {value}")
            for i, slot in enumerate(outputs):
                if slot is not None:
                    self.lines.append(f"{_slot_name(slot)} = r[{i}]")


def _slot_name(slot: Slot) -> str:
    return f"i{slot.index}" if slot.is_input else f"t{slot.index}"


def _generate(recording: Recording, device: torch.device | None) -> tuple[str, dict[str, Any]]:
    writer = _Writer()
    compiled = any(isinstance(s, LaunchStep) and s.compiled is not None for s in recording.steps)
    if compiled:
        assert device is not None and device.type == "cuda"
        stream = writer.constant(torch._C._cuda_getCurrentRawStream)
        writer.lines.append(f"stream = {stream}({device.index})")
    for step in recording.steps:
        if isinstance(step, OpStep):
            call = _binding(writer, step) or writer.call(step.op, step.args, step.kwargs)
            writer.assign(step.outputs, call, step.name)
        elif isinstance(step, CallStep) and isinstance(step.outputs, Const):
            call = writer.call(step.replay or step.function, step.args, step.kwargs)
            expected = writer.constant(step.outputs.value)
            mismatch = writer.constant(ReplayMismatch)
            name = step.function.__qualname__
            writer.lines.append(f"if {call} != {expected}:  # {name}")
            writer.lines.append(f"    raise {mismatch}({name!r})")
        elif isinstance(step, CallStep):
            call = writer.call(step.replay or step.function, step.args, step.kwargs)
            writer.assign(step.outputs, call, step.function.__qualname__)
        else:
            writer.lines.append(_launch_line(writer, step))
    writer.lines.append(f"return {writer.expression(recording.result)}")
    params = ", ".join(f"i{i}" for i in range(recording.inputs))
    body = "\n".join("    " + line for line in writer.lines)
    return f"def replay({params}):\n{body}\n", writer.namespace


def _launch_line(writer: _Writer, step: LaunchStep) -> str:
    args = ", ".join(writer.expression(a) for a in step.args)
    if step.compiled is None:  # the interpreter: as `launch` launches
        launcher = writer.constant(step.kernel[step.grid])
        options = "".join(f", {k}={writer.constant(v)}" for k, v in step.options.items())
        return f"{launcher}({args}{options})  # {_kernel_name(step.kernel)}"
    kernel = step.compiled
    grid = (*step.grid, 1, 1)[:3]
    launcher, function = kernel.run, writer.constant(kernel.function)
    metadata = writer.constant(kernel.packed_metadata)
    head = f"{grid[0]}, {grid[1]}, {grid[2]}, stream, {function}"
    layout = _direct_layout(launcher)
    name = _kernel_name(step.kernel)
    if layout == "3.6":  # the C launch of 3.6's CudaLauncher.__call__, scratch-free
        flags = f"{launcher.launch_cooperative_grid!r}, {launcher.launch_pdl!r}"
        launch = writer.constant(launcher.launch)
        return (
            f"{launch}({head}, {flags}, None, None, {metadata}, None, None, None, {args})  # {name}"
        )
    run = writer.constant(launcher)
    return f"{run}({head}, {metadata}, None, None, None, {args})  # {name}"


# The C launch that a Triton version's CudaLauncher.__call__ makes, whitespace removed: where a
# launcher's source makes exactly this call and the kernel needs no scratch memory, a replay
# makes it directly (what __call__ adds is the scratch allocation). Else it calls the launcher.
# Only layouts measured on a GPU are listed (Triton 3.6).
_LAUNCH_CALLS = {
    "3.6": "self.launch(gridX,gridY,gridZ,stream,function,self.launch_cooperative_grid,"
    "self.launch_pdl,global_scratch,profile_scratch,*args)",
}


def _direct_layout(launcher: Any) -> str | None:
    """Which of `_LAUNCH_CALLS` this launcher's __call__ makes, where a replay may make it
    itself (no scratch memory, no sanitizer), else None."""
    scratch = getattr(launcher, "global_scratch_size", 1) or getattr(
        launcher, "profile_scratch_size", 1
    )
    if scratch or getattr(launcher, "gsan_enabled", False):
        return None
    return _call_layout(type(launcher))  # type: ignore[arg-type]


@functools.cache
def _call_layout(launcher_type: type) -> str | None:
    try:
        source = inspect.getsource(launcher_type.__call__)
    except (OSError, TypeError):
        return None
    text = "".join(source.split())
    found = [name for name, call in _LAUNCH_CALLS.items() if call in text]
    return found[0] if len(found) == 1 and text.count("self.launch(") == 1 else None


def _kernel_name(kernel: Any) -> str:
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", str(kernel))


def _binding(writer: _Writer, step: OpStep) -> str | None:
    """The operation through torch's Python binding, for the common ones whose binding calls
    exactly it (faster than the operator's own callable: its schema parser takes longer);
    None for the others."""
    spell = _BINDINGS.get(step.name)
    if spell is None:
        return None
    args = [writer.expression(a) for a in step.args]
    kwargs = {k: writer.expression(v) for k, v in step.kwargs.items()}
    return spell(writer, args, kwargs)


def _allocation(function: Callable[..., torch.Tensor]) -> Callable[..., str | None]:
    """function(*sizes, dtype=, device=): `torch.empty` or `torch.zeros` of the default layout,
    the sizes given one by one (on the development machine's CPU, 1.3-1.9 us a call against
    2.6-3.1 us as a list)."""

    def spell(writer: _Writer, args: list[str], kwargs: dict[str, str]) -> str | None:
        plain = ("layout", "pin_memory", "memory_format")
        if len(args) != 1 or any(kwargs.get(k, "None") not in ("None", "False") for k in plain):
            return None  # a layout or memory format of its own: through the operator
        dtype, device = kwargs.get("dtype", "None"), kwargs.get("device", "None")
        sizes = args[0]
        if sizes.startswith("[") and sizes != "[]":  # parsed faster as arguments than a list
            sizes = sizes[1:-1]
        return f"{writer.constant(function)}({sizes}, dtype={dtype}, device={device})"

    return spell


def _alias(writer: _Writer, args: list[str], kwargs: dict[str, str]) -> str | None:
    return args[0] if len(args) == 1 and not kwargs else None


def _method(name: str, arity: int, least: int | None = None) -> Callable[..., str | None]:
    """tensor.name(*rest) for `least` (default: arity) to `arity` arguments, the tensor first:
    the method's defaults are the operator's."""

    def spell(writer: _Writer, args: list[str], kwargs: dict[str, str]) -> str | None:
        if kwargs or not (least or arity) <= len(args) <= arity:
            return None
        return f"{args[0]}.{name}({', '.join(args[1:])})"

    return spell


def _function(function: Callable[..., Any]) -> Callable[..., str]:
    """function(*args, **kwargs): a binding that takes the operator's arguments as they come."""

    def spell(writer: _Writer, args: list[str], kwargs: dict[str, str]) -> str:
        parts = [*args, *(f"{k}={v}" for k, v in kwargs.items())]
        return f"{writer.constant(function)}({', '.join(parts)})"

    return spell


def _cast(writer: _Writer, args: list[str], kwargs: dict[str, str]) -> str | None:
    return f"{args[0]}.to({kwargs['dtype']})"


_BINDINGS: dict[str, Callable[..., str | None]] = {
    CAST: _cast,
    "aten.empty.memory_format": _allocation(torch.empty),
    "aten.zeros.default": _allocation(torch.zeros),
    "aten.t.default": _method("t", 1),
    "aten.detach.default": _alias,  # a replay runs without autograd: the tensor itself
    "aten.view.default": _method("view", 2),
    "aten.view.dtype": _method("view", 2),
    "aten.select.int": _method("select", 3),
    "aten.unbind.int": _method("unbind", 2, least=1),
    "aten.split.Tensor": _method("split", 3, least=2),
    "aten.split_with_sizes.default": _method("split_with_sizes", 3, least=2),
    "aten.mm.default": _function(torch.mm),
    "aten.addmm.default": _function(torch.addmm),
    "aten.sum.IntList_out": _function(torch.sum),
}
