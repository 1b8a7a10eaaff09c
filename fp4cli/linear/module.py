"""QuantLinear (an nn.Linear under a LinearConfig) and quantize_model, the one way in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from fp4cli.linear.config import LinearConfig
from fp4cli.linear.fast import fast_gap
from fp4cli.linear.fast_function import FastQuantLinearFunction
from fp4cli.linear.fast_vector import VectorQuantLinearFunction, vector_gap
from fp4cli.linear.function import QuantLinearFunction
from fp4cli.linear.gathered import GatheredWeight, WeightOperands
from fp4cli.linear.operands import GEMMS
from fp4cli.linear.ops import compiled_linear, op_key
from fp4cli.linear.out_control import LayerSchedule, split_weight
from fp4cli.linear.recompute import LayerRecompute
from fp4cli.linear.routes import gemm_gap
from fp4cli.linear.seeds import CallCounter, count_call, draw_call_seed
from fp4cli.linear.skip import expand_skip, matches_skip
from fp4cli.quant import fake_quantize
from fp4cli.quant.backend import check_backend, interpreter_on, triton_available
from fp4cli.quant.random_bits import draw_seed
from fp4cli.techniques.qema import AverageGuide, QEMAConfig, layer_init_average, update_ema

_SEED_MASK = (1 << 62) - 1


class QuantLinear(nn.Linear):
    """nn.Linear whose three GEMMs run under a LinearConfig.

    Buffers: `rng_seed` (this layer's seed), `calls` (training forward passes so far: each one
    draws fresh stochastic-rounding bits and Hadamard signs), with Q-EMA `weight_ema` and
    `ema_updates`, and with OutControl `out_control_steps` (optimizer steps counted),
    `channel_norms` (the summed input norms) and `channel_order` (the chosen order). All are
    saved in the state dict, so a resumed run continues the same streams.
    `backend` ("auto", "torch" or "triton") picks the quantizer implementation; all give the
    same bits.
    """

    config: LinearConfig
    rng_seed: torch.Tensor
    calls: torch.Tensor
    weight_ema: torch.Tensor
    ema_updates: torch.Tensor
    out_control_steps: torch.Tensor
    channel_norms: torch.Tensor
    channel_order: torch.Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        config: LinearConfig | None = None,
        seed: int | None = None,
        device: Any = None,
        dtype: Any = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._setup(config or LinearConfig(), seed, backend)

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        config: LinearConfig,
        seed: int | None = None,
        backend: str = "auto",
    ) -> QuantLinear:
        """A QuantLinear sharing `linear`'s parameters (optimizers built before keep working)."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.weight = linear.weight
        module.bias = linear.bias
        module.train(linear.training)
        module._setup(config, seed, backend)
        return module

    def _setup(self, config: LinearConfig, seed: int | None, backend: str) -> None:
        check_backend(backend)
        self.config = config
        self.backend = backend
        self._plan = _choose_executor(config, backend)
        self._op_key = op_key(config) if self._plan[0] != "reference" else ""
        self._high_precision = config.is_high_precision  # walks the fields: once, not per call
        config.routes  # noqa: B018  (worked out here, outside any compiled code)
        self._interpreter = interpreter_on()
        self.stats: dict[tuple[str, str], torch.Tensor] | None = None  # set to {} to record
        self.rank = 0  # this process's rank in a distributed run: X and dY round per rank
        self._recompute = LayerRecompute()  # under `fp4 train --recompute`
        self.gathered: GatheredWeight | None = None  # FSDP2's packed gather (`gathered.py`)
        device = self.weight.device
        seed = draw_seed() if seed is None else seed
        self.register_buffer("rng_seed", torch.tensor(seed & _SEED_MASK, device=device))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64, device=device))
        if config.qema is not None:
            self.register_buffer("weight_ema", self._starting_average(config.qema, seed))
            self.register_buffer("ema_updates", torch.zeros((), dtype=torch.int64, device=device))
        self._out_control: LayerSchedule | None = None
        if config.out_control is not None:
            self._out_control = LayerSchedule(self, config.out_control)

    def _starting_average(self, qema: QEMAConfig, seed: int) -> torch.Tensor:
        """Q-EMA's average before its first update (float32, W's shape and device): W itself,
        or (start "layer_init") nn.Linear's default initialization drawn from the layer's
        seed, as TetraJet's code starts it."""
        if qema.start == "weight":
            return self.weight.detach().to(torch.float32).clone()
        average = layer_init_average(self.out_features, self.in_features, seed & _SEED_MASK)
        return average.to(self.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._high_precision:
            return F.linear(x, self.weight, self.bias)
        if self.gathered is not None:
            return self._gathered_forward(x)
        if self._out_control is not None:
            self._out_control.before_call(self, x)
        if self.stats is None and not torch.compiler.is_compiling():
            executor = self.executor(x)[0]
            if executor != "reference":
                return self._kernel_forward(x, executor)
        return self._general_forward(x)

    def _gathered_forward(self, x: torch.Tensor) -> torch.Tensor:
        """A call on W's operands as FSDP2's packed all-gather left them (`gathered.py`): the
        fast executor's or the reference's."""
        assert self.gathered is not None
        if torch.compiler.is_compiling() or self.stats is not None:
            raise RuntimeError(
                "a weight gathered packed runs eagerly and records no statistics: "
                "use --set parallel.fp4_gather=false"
            )
        given = self.gathered.operands_for(self.weight)
        if self.executor(x)[0] == "fast":
            return self._kernel_forward(x, "fast", given)
        return self._general_forward(x, given)

    def out_control_channels(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """OutControl's (FP8 channels, FP4 channels) once chosen, else None (also when no
        channel stays in FP8: fewer input channels than its `multiple`)."""
        return None if self._out_control is None else self._out_control.channels(self)

    def advance_out_control(self) -> None:
        """One step of OutControl's schedule (call after each optimizer step): after step
        `record_start + record_steps` the channels are chosen. A no-op without OutControl."""
        if self._out_control is not None:
            self._out_control.advance(self)

    def _next_call_seed(self) -> torch.Tensor:
        """This call's seed (`seeds.py`), counting a training call."""
        return draw_call_seed(self.rng_seed, self.calls, self.training)

    def _kernel_forward(
        self, x: torch.Tensor, executor: str, given: WeightOperands | None = None
    ) -> torch.Tensor:
        """An eager call of the fast or vector-wise executor: x, W and the bias are cast to
        autocast's dtype by the executor itself, whose steps run with autocast off (switched
        directly: the context manager's host time counts in every call). The fast executor
        draws the call's seed in its program; the vector-wise one draws none."""
        device_type = x.device.type
        autocast = torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type) if autocast else None
        rows = x.reshape(-1, self.in_features)
        if autocast:
            torch.set_autocast_enabled(device_type, False)
        try:
            if executor == "fast":
                counter = CallCounter(self.rng_seed, self.calls, self.training)
                y = FastQuantLinearFunction.apply(
                    rows, self.weight, self.bias, self.config, self._op_key, counter,
                    self._average_guide(), self.rank, dtype, self._recompute.next_use(), given,
                )  # fmt: skip
            else:
                count_call(self.calls, self.training)
                y = VectorQuantLinearFunction.apply(
                    rows, self.weight, self.bias, self.config, self._op_key, dtype,
                    self._recompute.next_use(),
                )  # fmt: skip
        finally:
            if autocast:
                torch.set_autocast_enabled(device_type, True)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _general_forward(
        self, x: torch.Tensor, given: WeightOperands | None = None
    ) -> torch.Tensor:
        """The reference executor's call (statistics steps too, and W's operands `given`), or
        the custom ops' under torch.compile."""
        weight: torch.Tensor = self.weight
        bias: torch.Tensor | None = self.bias
        device_type = x.device.type
        executor = self.executor(x)[0] if self.stats is None and given is None else "reference"
        compiled = executor != "reference" and torch.compiler.is_compiling()
        dtype = None
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            x = x.to(dtype)  # compiled: fused into the op that made x (a LayerNorm's)
            if not compiled:  # compiled: the ops' executor casts W and the bias as it reads
                weight = weight.to(dtype)
                bias = bias.to(dtype) if bias is not None else None
        call_seed = self._next_call_seed()
        with torch.autocast(device_type, enabled=False):
            rows = x.reshape(-1, self.in_features)
            if compiled:
                y = compiled_linear(
                    rows, weight, bias, executor, self._op_key, call_seed,
                    self._weight_guide(), self.rank, dtype,
                )  # fmt: skip
            else:
                y = QuantLinearFunction.apply(
                    rows,
                    weight,
                    bias,
                    self.config,
                    call_seed,
                    self._weight_guide(),
                    self.stats,
                    self._reference_backend(),
                    self.rank,
                    self.out_control_channels(),
                    given,
                )
        return y.reshape(*x.shape[:-1], self.out_features)

    def _reference_backend(self) -> str:
        """The quantizers' backend when this layer runs the reference executor. A layer on the
        vector-wise executor has operands the E2M1 kernels do not take: its statistics steps
        quantize them with "auto" (the same bits) rather than fail under "triton"."""
        return "auto" if self._plan[0] == "vector" else self.backend

    def executor(self, x: torch.Tensor | None = None) -> tuple[str, str]:
        """("fast", "") when this layer's training pass runs the fused executor (`fast.py`) on
        an input like `x` (default: on the weight's device), ("vector", "") when it runs the
        vector-wise one (`fast_vector.py`), else ("reference", why). All compute the same
        operands; steps that record statistics always take the reference."""
        device = x.device if x is not None else self.weight.device
        name, why = self._plan
        if name == "reference":
            return name, why
        if device.type != "cuda" and not (self.backend == "triton" and self._interpreter):
            return "reference", f"a {device.type} tensor"
        return name, ""

    def _weight_guide(self) -> torch.Tensor | None:
        """Q-EMA's guide for the forward weight's rounding (`AverageGuide.values`)."""
        guide = self._average_guide()
        return None if guide is None else guide.values(self.weight)

    def _average_guide(self) -> AverageGuide | None:
        """Q-EMA's guide unformed: the fast executor's pair kernel forms it as it reads W."""
        qema = self.config.qema
        if qema is None:
            return None
        return AverageGuide(self.weight_ema, self.ema_updates, qema.warmup)

    @torch.no_grad()
    def update_ema(self) -> None:
        """One Q-EMA step (call after each optimizer step); a no-op without Q-EMA."""
        if self.config.qema is None:
            return
        qema = self.config.qema
        copies = qema.first_update_copies
        if self._ema_in_one_pass():
            from fp4cli.kernels.elementwise.qema import update_ema_kernel

            update_ema_kernel(self.weight_ema, self.weight, qema.beta, self.ema_updates, copies)
        else:
            update_ema(self.weight_ema, self.weight, qema.beta, self.ema_updates, copies)
        self.ema_updates.add_(1)

    def _ema_in_one_pass(self) -> bool:
        """Whether the Q-EMA update runs as one kernel (`kernels/elementwise/qema.py`, the
        reference's bits): where this layer's quantizers run as kernels."""
        if self.executor()[0] == "reference":
            return False
        from fp4cli.kernels.elementwise.qema import ema_update_supported

        return ema_update_supported(self.weight_ema, self.weight)

    @torch.no_grad()
    def quantized_weight(self) -> torch.Tensor:
        """The forward pass's quantized weight (Q-EMA guided when on; SR with a fixed seed;
        OutControl's FP8 channels by its format once chosen)."""
        spec = self.config.forward_w
        weight, guide = self.weight.detach(), self._weight_guide()
        channels = self.out_control_channels()
        if channels is None:
            if spec is None:
                return weight
            return fake_quantize(weight, spec, seed=0, guide=guide, backend=self.backend)
        assert self.config.out_control is not None
        specs = (self.config.out_control.format, spec)
        return split_weight(weight, channels, specs, guide, self.backend)

    def extra_repr(self) -> str:
        backend = f", backend={self.backend}" if self.backend != "auto" else ""
        return f"{super().extra_repr()}, {self.config.summary()}{backend}"


def _choose_executor(config: LinearConfig, backend: str) -> tuple[str, str]:
    """("fast" | "vector" | "reference", why the reference) for a layer's config and backend."""
    if backend == "torch":
        return "reference", "backend torch"
    if not triton_available():
        return "reference", "triton is not installed"
    fast = fast_gap(config)
    if fast is None:
        return "fast", ""
    vector = vector_gap(config)
    if vector is None:
        return "vector", ""
    return "reference", f"{fast}; vector-wise: {vector}"


def quantize_model(
    model: nn.Module,
    recipe: Any,
    seed: int | None = None,
    skip: Iterable[str] | None = None,
    backend: str = "auto",
) -> nn.Module:
    """Swap the nn.Linear modules of `model` for QuantLinear in place and return the model.

    recipe: a Recipe, a recipe name or YAML path, or a LinearConfig. Layers whose name matches
    one of the recipe's skip patterns (or `skip`, which replaces them) stay nn.Linear: a pattern
    matches a module's full dotted name or its last component (fnmatch), and `last:N` the layers
    of the model's last N blocks (`fp4cli.linear.skip`). seed: the base of every
    layer's random streams (None: drawn from torch's random state). backend: the quantizer
    implementation of every layer ("auto", "torch" or "triton"; the same bits).
    """
    config, recipe_skip = _resolve(recipe)
    patterns = tuple(recipe_skip if skip is None else skip)
    if config.is_high_precision:
        return model
    base_seed = draw_seed() if seed is None else seed
    children = _linear_children(model)
    patterns = expand_skip(patterns, [full_name for _, _, full_name, _ in children])
    for index, (parent, child_name, full_name, linear) in enumerate(children):
        if matches_skip(full_name, patterns):
            continue
        layer_seed = _mix_seed(base_seed, index)
        layer = QuantLinear.from_linear(linear, config, seed=layer_seed, backend=backend)
        setattr(parent, child_name, layer)
    return model


def quantized_layers(model: nn.Module) -> dict[str, QuantLinear]:
    """The QuantLinear modules of `model` by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantLinear)}


def executor_summary(model: nn.Module) -> str:
    """Which executor the model's quantized layers run, and why any takes the reference: e.g.
    "quantized layers: 48 on the fast executor", "... 48 on the vector-wise executor" or
    "... 12 on the reference (a cpu tensor)"."""
    groups: dict[tuple[str, str], int] = {}
    for layer in quantized_layers(model).values():
        if layer.config.is_high_precision:
            continue
        key = layer.executor()
        groups[key] = groups.get(key, 0) + 1
    if not groups:
        return "quantized layers: none"
    parts = [
        f"{count} on the {_EXECUTOR_NAMES[name]}" + (f" ({why})" if why else "")
        for (name, why), count in sorted(groups.items())
    ]
    return "; ".join(["quantized layers: " + ", ".join(parts), *_gemm_routes(model)])


def _gemm_routes(model: nn.Module) -> list[str]:
    """Where a recipe's `gemm: exact | fast` sends each GEMM (`routes.gemm_route`), once per
    distinct config and executor: e.g. "gemm fast: forward, grad_input, grad_weight on
    mxfp4_matmul"."""
    routes: dict[str, None] = {}
    for layer in quantized_layers(model).values():
        config = layer.config
        if config.gemm == "dequantized" or config.is_high_precision:
            continue
        name = layer.executor()[0]
        by_route: dict[str, list[str]] = {}
        for gemm in GEMMS:
            route = config.routes[gemm]
            if route == "mxfp4" and name != "fast":
                where = "on values (mxfp4_matmul: the fast executor's)"
            elif route == "fp8" and name != "vector":
                where = "on values (FP8 tensor cores: the vector-wise executor's)"
            elif route is not None:
                where = _ROUTE_NAMES[route]
            else:
                where = f"on values ({gemm_gap(config, gemm)})"
            by_route.setdefault(where, []).append(gemm)
        parts = [", ".join(gemms) + f" {where}" for where, gemms in by_route.items()]
        routes[f"gemm {config.gemm}: " + "; ".join(parts)] = None
    return list(routes)


_ROUTE_NAMES = {
    "mxfp4": "on mxfp4_matmul",
    "block": "as block-scaled products",
    "fp8": "on FP8 tensor cores (torch._scaled_mm; elsewhere on values)",
}
_EXECUTOR_NAMES = {
    "fast": "fast executor",
    "vector": "vector-wise executor",
    "reference": "reference",
}


def update_qema(model: nn.Module) -> None:
    """Advance the Q-EMA of every QuantLinear in `model` (after an optimizer step)."""
    for layer in quantized_layers(model).values():
        layer.update_ema()


def advance_out_control(model: nn.Module) -> None:
    """Advance OutControl's schedule in every QuantLinear of `model` (after an optimizer
    step)."""
    for layer in quantized_layers(model).values():
        layer.advance_out_control()


def attach_qema(model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """Update Q-EMA and advance OutControl's schedule after every `optimizer.step()` (both
    no-ops for layers without them); returns the hook's removable handle."""

    def after_step(*_: Any) -> None:
        update_qema(model)
        advance_out_control(model)

    return optimizer.register_step_post_hook(after_step)


def _resolve(recipe: Any) -> tuple[LinearConfig, tuple[str, ...]]:
    if isinstance(recipe, LinearConfig):
        return recipe, ()
    if isinstance(recipe, str):
        from fp4cli.recipes import load_recipe

        recipe = load_recipe(recipe)
    linear = getattr(recipe, "linear", None)
    if not isinstance(linear, LinearConfig):
        raise TypeError(f"expected a Recipe, a recipe name or a LinearConfig, got {type(recipe)}")
    return linear, tuple(getattr(recipe, "skip", ()))


def _linear_children(model: nn.Module):
    """(parent, attribute name, full name, module) for every plain nn.Linear, in order."""
    found = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            # MultiheadAttention reads out_proj's weight directly, never calls it: leave it.
            if type(child) is nn.Linear:
                full_name = f"{parent_name}.{child_name}" if parent_name else child_name
                found.append((parent, child_name, full_name, child))
    return found


def _mix_seed(base: int, index: int) -> int:
    """A well-spread 62-bit seed per layer (SplitMix64 of base + index)."""
    z = (base + (index + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & _SEED_MASK
