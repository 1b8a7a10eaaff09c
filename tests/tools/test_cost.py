"""The cost model against hand-computed values, measured rates from a store, the `fp4 cost` CLI.

Shapes are M tokens x K in_features x N out_features. The h100 profile: bf16 GEMM 746e12 FLOP/s,
fp8 (and the assumed fp4) 1282e12, bandwidth 3e12 B/s, 33.5e12 elementwise ops/s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.cost import (
    CostError,
    LayerShape,
    MeasuredRates,
    estimate_layer,
    estimate_model,
    measured_rates,
    parse_shape,
    profile_for,
    spec_key,
)
from fp4cli.linear.config import LinearConfig
from fp4cli.quant.spec import QuantSpec
from fp4cli.recipe_loader import apply_overrides, load_recipe
from fp4cli.store import RunStore
from fp4cli.techniques import HadamardConfig

H100 = profile_for("h100")
B200 = profile_for("b200")
SQUARE = LayerShape(4096, 4096, 4096)
N4096 = 4096 * 4096  # elements of a 4096 x 4096 operand
GEMM_FLOP = 2 * 4096**3  # 137,438,953,472
MX = QuantSpec.preset("mxfp4")
H100_NAME = "NVIDIA H100 80GB HBM3"
runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def item(cost, technique: str, target: str):
    (found,) = [i for i in cost.items if i.technique == technique and i.target == target]
    return found


def test_bf16_layer_time_by_hand() -> None:
    # Each GEMM: 2 * 4096^3 FLOP / 746e12 = 184.2 us; it reads and writes 3 x 4096^2 BF16
    # elements (100.7 MB / 3e12 = 33.6 us), so it is compute-bound.
    cost = estimate_layer(load_recipe("bf16").linear, SQUARE, H100)
    assert cost.bf16_seconds == pytest.approx(3 * GEMM_FLOP / 746e12, rel=1e-12)
    assert [i.technique for i in cost.items] == ["gemm"] * 3
    assert item(cost, "gemm", "forward").bytes == 2 * 3 * N4096


@pytest.mark.parametrize("config", [LinearConfig(), load_recipe("bf16").linear])
def test_all_bf16_ratio_is_exactly_one(config: LinearConfig) -> None:
    shapes = [SQUARE, LayerShape(8192, 4096, 11008), LayerShape(3, 5, 7)]
    for profile in (H100, B200, profile_for("a100")):
        assert estimate_model(config, shapes, profile).ratio == 1.0


def test_unquantized_layer_costs_bf16_in_both() -> None:
    cost = estimate_layer(load_recipe("tetrajet").linear, LayerShape(64, 32, 16, False), H100)
    assert cost.ratio == 1.0 and len(cost.items) == 3


def test_mxfp4_quantize_pass_by_hand() -> None:
    # 4096x4096 BF16 read (33,554,432 B) + E2M1 codes two per byte (8,388,608 B)
    # + one E8M0 scale byte per 32 elements (524,288 B) = 42,467,328 B; 10 ops an element.
    cost = estimate_layer(load_recipe("mxfp4").linear, SQUARE, H100)
    quantize = item(cost, "quantize", "forward_w")
    assert quantize.bytes == 33_554_432 + 8_388_608 + 524_288 == 42_467_328
    assert quantize.flops == 10 * N4096
    # memory-bound: 42.5 MB / 3e12 = 14.2 us > 167.8 Mops / 33.5e12 = 5.0 us
    assert quantize.seconds == pytest.approx(42_467_328 / 3e12, rel=1e-12)
    assert quantize.source == "model"


def test_quantize_bytes_match_the_benchmark_count() -> None:
    import torch

    from fp4cli.bench.configs import CONFIGS
    from fp4cli.bench.traffic import quant_traffic

    for name, operand in (("mxfp4", "forward_x"), ("nvfp4", "forward_x")):
        config = CONFIGS[name]
        linear = LinearConfig(forward_x=config.spec)
        cost = estimate_layer(linear, LayerShape(8192, 4096, 4096), H100)
        expected = quant_traffic((8192, 4096), torch.bfloat16, -1, config).kernel_bytes("quantize")
        assert item(cost, "quantize", operand).bytes == expected


def test_nvfp4_tensor_amax_pass_by_hand() -> None:
    # codes 8,388,608 B + one UE4M3 byte per 16 (1,048,576 B) + the FP32 tensor scale (4 B);
    # the amax pass reads the BF16 operand once more and does 2 ops an element.
    cost = estimate_layer(LinearConfig(forward_x=QuantSpec.preset("nvfp4")), SQUARE, H100)
    assert item(cost, "quantize", "forward_x").bytes == 33_554_432 + 8_388_608 + 1_048_580
    amax = item(cost, "tensor amax", "forward_x")
    assert (amax.bytes, amax.flops) == (33_554_432, 2 * N4096)


def test_four_over_six_ops_by_hand() -> None:
    # the second candidate's quantization (10 ops) and both candidates' errors (48 FP32-op
    # equivalents of float64 and int64 work) per element, fused: (10 + 58) ops x 16,777,216 /
    # 33.5e12 = 34.06 us against the pass's 42,991,620 bytes / 3e12 = 14.33 us, so the pass
    # becomes bound by its arithmetic and four-over-six adds the 19.72 us between them.
    config = LinearConfig(forward_x=QuantSpec.preset("nvfp4-4over6"))
    four = item(estimate_layer(config, SQUARE, H100), "four-over-six", "forward_x")
    assert (four.flops, four.bytes) == (58 * N4096, 0)
    assert four.seconds == pytest.approx(68 * N4096 / 33.5e12 - 42_991_620 / 3e12)


def test_ms_eden_ops_by_hand() -> None:
    # two products summed per element (u * u, u * q): 4 x 16,777,216 ops, fused into the
    # quantize pass, which stays memory-bound (10 + 4 ops an element), so it adds 0 s.
    config = LinearConfig(grad_input_dy=QuantSpec.preset("nvfp4-eden"))
    eden = item(estimate_layer(config, SQUARE, H100), "ms-eden correction", "grad_input_dy")
    assert (eden.flops, eden.bytes, eden.seconds) == (4 * N4096, 0, 0.0)


def test_hadamard_32_ops_by_hand() -> None:
    # log2(32) = 5 add/sub per element, no bytes of its own (fused into the quantizer); the
    # fused pass stays memory-bound (10 + 5 ops an element: 7.5 us < 14.2 us), so it adds 0 s.
    config = LinearConfig(forward_x=MX, forward_w=MX, forward_hadamard=HadamardConfig(32))
    hadamard = item(estimate_layer(config, SQUARE, H100), "hadamard", "forward_w")
    assert (hadamard.flops, hadamard.bytes, hadamard.seconds) == (5 * N4096, 0, 0.0)


def test_hadamard_on_a_bf16_operand_is_its_own_pass() -> None:
    config = LinearConfig(grad_input_hadamard=HadamardConfig(64))
    hadamard = item(estimate_layer(config, SQUARE, H100), "hadamard", "grad_input_w")
    assert (hadamard.flops, hadamard.bytes) == (6 * N4096, 4 * N4096)  # read + write BF16


def test_stochastic_rounding_ops_by_hand() -> None:
    # Philox: 4,194,304 calls (one per 4 elements) x 100 ops + 2 ops an element = 452,984,832.
    # The pass becomes issue-bound: (167,772,160 + 452,984,832) ops / 33.5e12 = 18.53 us, so SR
    # adds 18.53 - 14.16 = 4.37 us.
    config = LinearConfig(forward_w=MX.replace(rounding="sr"))
    sr = item(estimate_layer(config, SQUARE, H100), "stochastic rounding", "forward_w")
    assert sr.flops == 4_194_304 * 100 + 2 * N4096 == 452_984_832
    assert sr.seconds == pytest.approx(620_756_992 / 33.5e12 - 42_467_328 / 3e12, rel=1e-9)


def test_forward_only_recipe_changes_only_forward_items() -> None:
    bf16 = estimate_layer(LinearConfig(), SQUARE, H100)
    forward = estimate_layer(LinearConfig(forward_x=MX, forward_w=MX), SQUARE, H100)
    backward = [i for i in forward.items if i.target not in ("forward", "forward_x", "forward_w")]
    assert backward == list(bf16.items[1:])
    gemm = item(forward, "gemm", "forward")
    assert gemm.seconds == pytest.approx(GEMM_FLOP / 1282e12, rel=1e-12)  # fp4 = fp8, assumed
    assert gemm.source == "model (fp4 assumed)"
    assert forward.ratio < 1.0


def test_gemm_rate_follows_the_operand_formats() -> None:
    mixed = estimate_layer(LinearConfig(forward_x=MX), SQUARE, B200)  # FP4 x BF16 -> bf16
    assert item(mixed, "gemm", "forward").seconds == pytest.approx(GEMM_FLOP / 2250e12)
    mx = estimate_layer(load_recipe("mxfp4").linear, SQUARE, B200)  # FP4 tensor cores
    assert item(mx, "gemm", "grad_weight").seconds == pytest.approx(GEMM_FLOP / 9000e12)
    wang = estimate_layer(load_recipe("wang-fp4").linear, SQUARE, B200)  # FP8 gradients
    assert item(wang, "gemm", "grad_input").seconds == pytest.approx(GEMM_FLOP / 4500e12)


def test_double_quant_dequantizes_the_forward_operands() -> None:
    # Q4 reads Q2(W), Q6 reads Q1(X): read codes + scales (8,912,896 B), write BF16 (33.5 MB).
    cost = estimate_layer(load_recipe("tetrajet").linear, SQUARE, H100)
    doubles = [i for i in cost.items if i.technique == "double quant"]
    assert [i.target for i in doubles] == ["grad_input_w", "grad_weight_x"]
    assert all(i.bytes == 8_912_896 + 33_554_432 and i.flops == 3 * N4096 for i in doubles)
    plain = load_recipe("mxfp4").linear
    assert not [i for i in estimate_layer(plain, SQUARE, H100).items if "double" in i.technique]


def test_dge_and_outliers_by_hand() -> None:
    shape = LayerShape(8192, 4096, 2048)  # M, K, N
    recipe = apply_overrides(load_recipe("wang-fp4"), ["linear.outliers.compensate=true"])
    cost = estimate_layer(recipe.linear, shape, H100)
    dge = item(cost, "dge", "dW")  # read W, read dW, write dW: 6 bytes and 22 ops per weight
    assert (dge.bytes, dge.flops) == (6 * 2048 * 4096, 22 * 2048 * 4096)
    # quantile 0.99: density 2 (1 - 0.99) = 0.02 of X beyond the two tails, scattered into
    # the dequantized X (each value read and written in BF16).
    residual = item(cost, "outliers", "forward_x (residual)")
    assert residual.flops == pytest.approx(0.02 * 8192 * 4096)
    sparse = 0.02 * 8192 * 4096 * 6
    assert residual.bytes == pytest.approx(sparse + 0.02 * 8192 * 4096 * 4)
    quantiles = item(cost, "outliers", "forward_x (quantiles)")
    assert quantiles.bytes == pytest.approx(2 * 8192 * 4096 + sparse)


def test_qema_and_qramp_by_hand() -> None:
    recipe = load_recipe("tetrajet-qramp")
    qema = LinearConfig(forward_w=MX, qema=load_recipe("tetrajet-qema").linear.qema)
    cost = estimate_layer(qema, SQUARE, H100)
    assert item(cost, "qema", "weight (EMA)").bytes == (2 + 4 + 4) * N4096  # W, EMA read/write
    assert item(cost, "qema", "forward_w").bytes == 4 * N4096  # the EMA read as the guide
    ramped = estimate_layer(recipe.linear, SQUARE, H100, qramp=recipe.qramp)
    others = sum(i.seconds for i in ramped.items if i.technique != "qramp")
    # 31 calibration steps (30 differences) every 500 steps
    assert item(ramped, "qramp", "calibration").seconds == pytest.approx(31 / 500 * others)
    assert item(ramped, "qramp", "weight (accum)").bytes == 20 * N4096


def test_model_sums_its_layers() -> None:
    config = load_recipe("tetrajet").linear
    shapes = [SQUARE, LayerShape(4096, 4096, 50304, quantized=False)]
    model = estimate_model(config, shapes, H100)
    layers = [estimate_layer(config, shape, H100) for shape in shapes]
    assert model.seconds == pytest.approx(sum(layer.seconds for layer in layers))
    assert model.ratio == pytest.approx(model.seconds / sum(la.bf16_seconds for la in layers))
    assert layers[0].ratio < model.ratio < 1.0
    with pytest.raises(CostError):
        estimate_model(config, [], H100)


def test_profiles() -> None:
    assert profile_for(H100_NAME) is H100 and profile_for(" H100 ") is H100
    assert profile_for("NVIDIA A100-SXM4-80GB").name == "a100"
    assert profile_for("NVIDIA B200").name == "b200" and profile_for("h200").name == "h200"
    assert B200.fp4_flops == 2 * B200.fp8_flops
    assert H100.fp4_flops == H100.fp8_flops and H100.kind("fp4") == "assumed"
    assert profile_for("h100-triton").fp4_flops == 236e12
    assert profile_for("h100-fp4cli").fp4_flops == 877e12
    known = "a100, b200, h100, h100-fp4cli, h100-triton, h200"
    with pytest.raises(CostError, match=rf"known profiles: {known}$"):
        profile_for("tpu-v5")


def test_parse_shape() -> None:
    assert parse_shape("8192x4096x11008") == LayerShape(8192, 4096, 11008)
    assert parse_shape("8x4x2:bf16") == LayerShape(8, 4, 2, quantized=False)
    for bad in ("8192x4096", "0x4x4", "axbxc", "8x4x2:fp8"):
        with pytest.raises(CostError, match="bad shape"):
            parse_shape(bad)


def test_the_largest_shape_shows_every_column_whole() -> None:
    side = 2**30
    args = ["cost", "-r", "mxfp4", "--device", "h100", "--no-measured"]
    result = runner.invoke(app, [*args, "--shape", f"{side}x{side}x{side}"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout  # no number or column cut short
    for column in ("technique", "GEMM/operand", "GFLOP", "MB", "µs", "source"):
        assert column in result.stdout
    assert f"{2 * side**3 / 1e9:,.0f}" in result.stdout  # the forward GEMM's GFLOP


def bench_config(spec: str, shape: list[int], backend: str = "triton") -> dict[str, object]:
    return {"shape": shape, "dtype": "bf16", "axis": -1, "config": "x", "spec": spec,
            "kernel": "quantize", "backend": backend, "iters": 20, "bytes": 1}  # fmt: skip


def bench_store(path: Path) -> Path:
    """A store with quantize measurements: mxfp4 at two sizes on the H100, and rows that must
    be ignored (another GPU, the reference backend, another metric)."""
    mxfp4 = spec_key(MX, None)
    with RunStore(path) as store:
        versions = {"torch": "2.11"}
        for device, config, name, value in (
            (H100_NAME, bench_config(mxfp4, [4096, 4096]), "gbps", 1000.0),
            (H100_NAME, bench_config(mxfp4, [16384, 8192]), "gbps", 2000.0),
            ("NVIDIA B200", bench_config(mxfp4, [4096, 4096]), "gbps", 5000.0),
            (H100_NAME, bench_config(mxfp4, [4096, 4096], "torch"), "gbps", 10.0),
            (H100_NAME, bench_config(mxfp4, [4096, 4096]), "copy_ratio", 0.5),
            (H100_NAME, bench_config(spec_key(QuantSpec.preset("nvfp4"), None), [64, 64]),
             "gbps", 500.0),
        ):  # fmt: skip
            store.log_benchmark("quantize", device, versions, config, name, value, "GB/s")
    return path


def test_spec_keys_match_the_benchmark_names() -> None:
    from fp4cli.bench.configs import CONFIGS

    for config in CONFIGS.values():
        assert spec_key(config.spec, config.hadamard) == config.describe()


def test_measured_rates_are_used(tmp_path: Path) -> None:
    with RunStore(bench_store(tmp_path / "s.db")) as store:
        rates = measured_rates(store, "h100")
        assert len(rates) == 3 and len(measured_rates(store, H100_NAME)) == 3
        assert len(measured_rates(store, "a100")) == 0
    nearest = rates.lookup(spec_key(MX, None), 4096 * 2048)  # nearer 4096^2 than 16384 x 8192
    assert nearest is not None and nearest.gbps == 1000.0
    cost = estimate_layer(load_recipe("mxfp4").linear, LayerShape(16384, 8192, 4096), H100, rates)
    x = item(cost, "quantize", "forward_x")  # 16384 x 8192: the 2000 GB/s measurement
    assert x.seconds == pytest.approx(x.bytes / 2000e9)
    assert x.source.startswith("measured: fp4 bench quantize 20")
    nvfp4 = estimate_layer(LinearConfig(forward_x=QuantSpec.preset("nvfp4")), SQUARE, H100, rates)
    amax = item(nvfp4, "tensor amax", "forward_x")  # inside the measured call
    assert (amax.seconds, amax.source) == (0.0, "in measured quantize")
    unmeasured = estimate_layer(load_recipe("tetrajet").linear, SQUARE, H100, rates)
    assert all(not i.source.startswith("measured") for i in unmeasured.items)
    assert estimate_layer(load_recipe("mxfp4").linear, SQUARE, H100, MeasuredRates()).ratio == (
        estimate_layer(load_recipe("mxfp4").linear, SQUARE, H100).ratio
    )


def test_cli_table_and_side_by_side(tmp_path: Path) -> None:
    store = bench_store(tmp_path / "s.db")
    args = ["cost", "-r", "mxfp4", "-r", "tetrajet", "--shape", "4096x4096x4096"]
    result = runner.invoke(app, [*args, "--device", "h100", "--store", str(store)], env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "mxfp4 on h100" in out and "side by side on h100" in out and "ratio vs BF16" in out
    assert "stochastic rounding" in out and "measured: fp4 bench quantize" in out


def test_cli_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP4_STORE", str(tmp_path / "missing.db"))  # no store: nothing measured
    args = ["cost", "-r", "tseng-rht-sr", "--shape", "256x128x64", "--shape", "256x128x512:bf16"]
    result = runner.invoke(app, [*args, "--device", "b200", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["device"]["name"] == "b200" and "no run store" in document["measured"]
    (recipe,) = document["recipes"]
    expected = estimate_model(
        load_recipe("tseng-rht-sr").linear,
        [parse_shape("256x128x64"), parse_shape("256x128x512:bf16")],
        B200,
    )
    assert recipe["ratio"] == pytest.approx(expected.ratio) and len(recipe["layers"]) == 2
    assert not (tmp_path / "missing.db").exists()


def nvfp4_gemm_store(path: Path) -> Path:
    """NVFP4 GEMM rows as `fp4 bench gemm` stores them: fused and decoded at 8192^3, fused at
    1024^3 on the H100, and a B200 row the h100 profile must not use."""
    with RunStore(path) as store:
        for device, impl, size, value in (
            (H100_NAME, "nvfp4", 8192, 343.0),
            (H100_NAME, "nvfp4-decoded", 8192, 645.0),
            (H100_NAME, "nvfp4", 1024, 100.0),
            ("NVIDIA B200", "nvfp4", 8192, 5000.0),
        ):
            config = {"m": size, "n": size, "k": size, "impl": impl, "format": "nvfp4"}
            store.log_benchmark("gemm", device, {}, config, "tflops", value, "TFLOP/s")
    return path


def caption_of(args: list[str]) -> str:
    """The table's text after its last row, on one line."""
    result = runner.invoke(app, ["cost", "-r", "nvfp4", *args], env=WIDE)
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split("ratio vs BF16")[-1].split())


def test_cli_caption_names_every_gemm_rate_and_its_source(tmp_path: Path) -> None:
    assumed = caption_of(["--shape", "8192x8192x8192", "--device", "h100", "--no-measured"])
    rates = ("bf16 GEMM 746 TFLOP/s (measured)", "fp8 GEMM 1,282 TFLOP/s (measured)",
             "fp4 GEMM 1,282 TFLOP/s (assumed)", "nvfp4 GEMM 746 TFLOP/s (assumed)")  # fmt: skip
    assert all(rate in assumed for rate in rates), assumed
    b200 = caption_of(["--shape", "8192x8192x8192", "--device", "b200", "--no-measured"])
    assert "nvfp4 GEMM 9,000 TFLOP/s (datasheet)" in b200
    store = str(nvfp4_gemm_store(tmp_path / "s.db"))
    shapes = ["8192x8192x8192", "1024x1024x1024", "8000x8000x8000", "2048x2048x2048:bf16"]
    args = [arg for shape in shapes for arg in ("--shape", shape)]
    measured = caption_of([*args, "--device", "h100", "--store", store])
    decoded = (
        "nvfp4 GEMM 746 TFLOP/s (assumed; 8192x8192x8192, 8000x8000x8000 at 645 TFLOP/s, "
        "measured: fp4 bench gemm nvfp4-decoded 20"
    )
    assert decoded in measured, measured
    assert "; 1024x1024x1024 at 100 TFLOP/s, measured: fp4 bench gemm nvfp4 20" in measured
    assert "2048x2048x2048" not in measured and "5,000" not in measured
    assert "fp4 GEMM 1,282 TFLOP/s (assumed)," in measured  # only NVFP4 rows were measured


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--shape", "8192x4096"], "bad shape '8192x4096'"),
        (["--shape", f"{2**30 + 1}x8x8"], "each dimension must be at most 2^30 = 1,073,741,824"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["-r", "no-such-recipe"], "no-such-recipe"),
        (["--store", "missing/s.db"], "no run store at missing/s.db"),
    ],
)
def test_cli_errors_are_one_line_exit_2(args: list[str], fragment: str) -> None:
    base = ["cost", "-r", "mxfp4", "--device", "h100", "--no-measured"]
    if "--store" in args:
        base.remove("--no-measured")
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr


def test_stochastic_rounding_costs_a_philox_call_per_group_its_bits_allow():
    """A Philox call serves 4 values at 24 bits, 8 at 16 and 16 at 8 (100 ops a call)."""
    from fp4cli.cost.operands import philox_ops

    assert philox_ops(1600) == 400 * 100 + 1600 * 2
    assert philox_ops(1600, 16) == 200 * 100 + 1600 * 2
    assert philox_ops(1600, 8) == 100 * 100 + 1600 * 2
