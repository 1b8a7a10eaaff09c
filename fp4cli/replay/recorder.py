"""Recording one call of a host function as the steps it runs on the device.

While a `Recorder` is active, every aten operation (through a TorchDispatchMode), every kernel
launch through `fp4cli.kernels.host.launch.launch` and every call of a `host_step` function is
written down as a `Step`, with each tensor argument named by its `Slot`: an input of the
recorded call, or the output of an earlier step. `fp4cli.replay.program` turns the steps into
one Python function that reruns them on new inputs of the same shapes, without the host code
that chose them.

What a recording cannot replay it refuses (`Recorder.refusal`), and the call then stays a
direct call: a tensor value read on the host, a tensor that no step made and no input holds, a
launch that reached Triton without passing through `launch` (counted on a GPU through Triton's
launch hook).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class Slot:
    """A tensor of the recorded call: input `index` (`is_input`) or step output `index`."""

    index: int
    is_input: bool = False


@dataclass(frozen=True)
class Const:
    """A non-tensor argument, passed to every replay as recorded."""

    value: Any


@dataclass(frozen=True)
class OpStep:
    """An aten operation `name`: `op(*args, **kwargs)`; `outputs` names what it returns (a
    Slot, a tuple of Slots, or None for a result nothing reads)."""

    name: str
    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: Any


@dataclass(frozen=True)
class LaunchStep:
    """A Triton kernel launch: `kernel` on `grid` with `args` (every parameter, constexprs
    included, in the kernel's order) and launch `options`; `compiled` the kernel that the
    recorded launch ran (None under the interpreter, whose replays launch as `launch` does);
    `written` the positions of the arguments it writes in place (where one is an input)."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    options: dict[str, Any]
    compiled: Any
    written: tuple[int, ...] = ()


@dataclass(frozen=True)
class CallStep:
    """A `host_step` function called with `args` and `kwargs`; `outputs` names its result, or
    is the Const a replay's call must return again (a flag such as "it ran"). `replay`: what a
    replay calls instead of `function` (its `bind`), and `graphable`: whether a CUDA graph may
    hold the step (see `host_step`)."""

    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: Any
    replay: Callable[..., Any] | None = None
    graphable: bool = False


Step = OpStep | LaunchStep | CallStep


@dataclass(frozen=True)
class HostStepOptions:
    """How a recording keeps a `host_step` function's call.

    - `bind(result, *args, **kwargs)`: called once, on the recorded call's arguments and
      result; it returns what the replays call instead of the function (with the replays'
      arguments), or None for the function itself. What it returns must give the function's
      result and do the function's work for any arguments of the recorded layouts, and
      may keep what the function decided from them (a library's plan).
    - `graphable`: the function only enqueues device work on the current stream, decided by
      its arguments' layouts alone, so a CUDA graph of a program may hold it.
    """

    bind: Callable[..., Callable[..., Any] | None] | None = None
    graphable: bool = False


@dataclass
class Recording:
    """What a recorded call ran: its steps, how many output slots they made, and the call's
    result with its tensors as Slots."""

    inputs: int
    steps: list[Step] = field(default_factory=list)
    slots: int = 0
    result: Any = None


# Operations whose result is a host value read from a tensor: a recording that holds one
# would replay the value of the recorded call.
_HOST_READS = {"_local_scalar_dense", "is_nonzero", "equal", "item", "allclose"}

_ACTIVE = threading.local()


def active_recorder() -> Recorder | None:
    """The recorder of this thread's recording, or None."""
    return getattr(_ACTIVE, "recorder", None)


class Recorder(TorchDispatchMode):
    """Records the steps of one call (see the module). Use `record(function, inputs)`."""

    def __init__(self, inputs: Sequence[torch.Tensor | None]) -> None:
        super().__init__()
        self.recording = Recording(len(inputs))
        self.refusal: str | None = None
        # by id, with a weak reference that tells a live tensor from a new one at a freed
        # tensor's address (a strong one would make torch return aliases of step outputs)
        self._names: dict[int, tuple[weakref.ref[torch.Tensor], Slot]] = {}
        self._paused = 0
        self._unexpected_launches = 0
        for index, tensor in enumerate(inputs):
            if tensor is not None:
                self._name(tensor, Slot(index, is_input=True))

    # -- the three channels -------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self._paused or self.refusal is not None:
            return result
        name = getattr(func, "__name__", str(func)).split(".")[0]
        if name in _HOST_READS:
            self.refuse(f"{func} reads a tensor's value on the host")
            return result
        step_args, step_kwargs = self._template(args), self._template(kwargs)
        outputs = self._outputs(result)
        if outputs is not _UNNAMED:
            step = OpStep(_step_name(func, args, kwargs), _raw_op(func), step_args, step_kwargs,
                          outputs)  # fmt: skip
            self.recording.steps.append(step)
        return result

    def record_launch(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        args: Sequence[Any],
        options: dict[str, Any],
        compiled: Any,
        written: tuple[int, ...] = (),
    ) -> None:
        """A launch that `launch` made (while `paused`); `written`: the positions of the
        arguments it writes in place."""
        if self.refusal is None:
            step = LaunchStep(kernel, tuple(grid), self._template(tuple(args)), options, compiled,
                              written)  # fmt: skip
            self.recording.steps.append(step)

    def record_call(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: HostStepOptions = HostStepOptions(),
    ) -> Any:
        """Call a `host_step` function, recording it as one step."""
        with self.paused():
            result = function(*args, **kwargs)
        if self.refusal is None:
            step_args, step_kwargs = self._template(args), self._template(kwargs)
            outputs = self._outputs(result)
            if outputs is _UNNAMED and isinstance(result, (bool, int, str)):
                outputs = Const(result)  # decided by the call's shapes: checked by each replay
            if outputs is _UNNAMED:
                self.refuse(f"{function.__qualname__} returned what a replay cannot name")
            else:
                with self.paused():  # the bind's own operations are not steps
                    replay = None if options.bind is None else options.bind(result, *args, **kwargs)
                step = CallStep(function, step_args, step_kwargs, outputs, replay,
                                options.graphable)  # fmt: skip
                self.recording.steps.append(step)
        return result

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Within: operations run unrecorded (a launch's or a host step's own)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def refuse(self, why: str) -> None:
        if self.refusal is None:
            self.refusal = why

    def launch_seen(self) -> None:
        """Triton's launch hook: a launch outside `paused` bypassed `launch`."""
        if not self._paused:
            self._unexpected_launches += 1
            self.refuse("a Triton launch outside fp4cli.kernels.host.launch")

    # -- naming -------------------------------------------------------------------------------

    def _name(self, tensor: torch.Tensor, slot: Slot) -> Slot:
        self._names[id(tensor)] = (weakref.ref(tensor), slot)
        return slot

    def _slot(self, tensor: torch.Tensor) -> Slot | None:
        named = self._names.get(id(tensor))
        return named[1] if named is not None and named[0]() is tensor else None

    def _new_slot(self, tensor: torch.Tensor) -> Slot:
        known = self._slot(tensor)
        if known is not None:
            return known  # an in-place operation or `out=` returns its argument
        slot = Slot(self.recording.slots)
        self.recording.slots += 1
        return self._name(tensor, slot)

    def _outputs(self, result: Any) -> Any:
        if isinstance(result, torch.Tensor):
            return self._new_slot(result)
        if isinstance(result, (tuple, list)):
            if all(isinstance(t, torch.Tensor) or t is None for t in result):
                return tuple(None if t is None else self._new_slot(t) for t in result)
            return _UNNAMED
        if result is None:
            return None
        return _UNNAMED

    def _template(self, value: Any) -> Any:
        """`value` with tensors as Slots and every other leaf as a Const."""
        if isinstance(value, torch.Tensor):
            slot = self._slot(value)
            if slot is None:
                self.refuse(f"a tensor {tuple(value.shape)} that no step made and no input holds")
                return Const(value)
            return slot
        if isinstance(value, (list, tuple)):
            items = [self._template(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        if isinstance(value, dict):
            return {k: self._template(v) for k, v in value.items()}
        return Const(value)

    def result_template(self, result: Any) -> Any:
        """The call's result with its tensors as Slots (a tensor no slot names refuses)."""
        return self._template(result)


_UNNAMED = object()


CAST = "aten._to_copy.default (a cast)"


def _step_name(func: Any, args: Any, kwargs: dict[str, Any]) -> str:
    """The operator's name; CAST for a copy to another dtype and nothing else (a replay calls
    Tensor.to, which copies exactly then)."""
    name = str(func)
    plain = set(kwargs) == {"dtype"} and len(args) == 1
    if name == "aten._to_copy.default" and plain and args[0].dtype != kwargs["dtype"]:
        return CAST
    return name


def _raw_op(func: Any) -> Any:
    """The operator's C++ callable (what OpOverload.__call__ calls), or the function itself."""
    return getattr(func, "_op", func)


@contextlib.contextmanager
def _launch_hook(recorder: Recorder) -> Iterator[None]:
    """Count Triton launches through its launch hook (GPUs; the interpreter calls no hook)."""
    try:
        from triton import knobs
    except ImportError:  # older Triton: no hook to count with
        yield
        return
    previous = knobs.runtime.launch_enter_hook

    def hook(metadata: Any) -> None:
        recorder.launch_seen()
        if previous is not None:
            previous(metadata)

    knobs.runtime.launch_enter_hook = hook
    try:
        yield
    finally:
        knobs.runtime.launch_enter_hook = previous


def record(
    function: Callable[..., Any], inputs: Sequence[torch.Tensor | None]
) -> tuple[Any, Recording | None, str | None]:
    """(function(*inputs), its recording or None, why not). The call runs as usual; its
    recording is refused where a replay could differ from it."""
    recorder = Recorder(inputs)
    _ACTIVE.recorder = recorder
    try:
        with _launch_hook(recorder), recorder:
            result = function(*inputs)
    finally:
        _ACTIVE.recorder = None
    template = recorder.result_template(result)
    if recorder.refusal is not None:
        return result, None, recorder.refusal
    recorder.recording.result = template
    return result, recorder.recording, None


def host_step(
    function: Callable[..., Any] | None = None,
    *,
    bind: Callable[..., Callable[..., Any] | None] | None = None,
    graphable: bool = False,
) -> Any:
    """A function that a recording keeps as one step, replayed by calling it again (or what
    `bind` made of it; see `HostStepOptions`): for device work that neither aten nor `launch`
    sees (a library called through ctypes, an autotuned launch). Used bare (`@host_step`) or
    with options (`@host_step(bind=..., graphable=True)`)."""
    options = HostStepOptions(bind, graphable)
    if function is None:
        return functools.partial(host_step, bind=bind, graphable=graphable)
    wrapped = function

    @functools.wraps(wrapped)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recorder = active_recorder()
        if recorder is None:
            return wrapped(*args, **kwargs)
        return recorder.record_call(wrapped, args, kwargs, options)

    return wrapper
