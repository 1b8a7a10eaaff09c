"""Outlier statistics (fp4cli.analysis.outliers) on tensors built to have known outliers, and
their place in `fp4 quantize-inspect`'s table, JSON and CSV."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fp4cli.analysis.outliers import kurtosis, outlier_stats
from fp4cli.cli.main import app

OUTLIER_CHANNEL, LOUD_ROW = 5, 3


def outlier_matrix() -> torch.Tensor:
    """(256, 64) of random signs (every |x| = 1), channel 5 times 40, row 3 times 8."""
    generator = torch.Generator().manual_seed(0)
    signs = torch.where(torch.rand(256, 64, generator=generator) < 0.5, -1.0, 1.0)
    signs[:, OUTLIER_CHANNEL] *= 40
    signs[LOUD_ROW] *= 8
    return signs


def test_a_channel_outlier_is_measured_exactly():
    stats = outlier_stats(outlier_matrix(), [16, 32])
    # every row: max 40 (8 x 40 in row 3), median 1 (8): the loud row scales both
    assert (stats.row_ratio_max, stats.row_ratio_p99) == (40.0, 40.0)
    # every column: the loud row's value (8x) over the 255 others
    assert (stats.col_ratio_max, stats.col_ratio_p99) == (8.0, 8.0)
    # one block in two (of 32) and one in four (of 16) hold the outlier channel
    assert stats.one_value_blocks == {16: 0.25, 32: 0.5}
    values = outlier_matrix().double().numpy().ravel()
    centered = values - values.mean()
    expected = np.mean(centered**4) / np.mean(centered**2) ** 2
    assert stats.kurtosis == pytest.approx(expected, rel=1e-12) and stats.kurtosis > 100


def test_a_gaussian_has_kurtosis_three_and_few_one_value_blocks():
    gaussian = torch.randn(512, 256, generator=torch.Generator().manual_seed(1))
    stats = outlier_stats(gaussian, [32])
    assert stats.kurtosis == pytest.approx(3.0, abs=0.1)
    assert stats.one_value_blocks[32] < 0.02
    assert 2 < stats.row_ratio_p99 <= stats.row_ratio_max < 10


def test_the_99th_percentile_is_the_nearest_rank():
    rows = torch.ones(100, 4)
    rows[:, 3] = torch.arange(1, 101)  # row i: max i + 1, median 1
    stats = outlier_stats(rows, [4])
    assert (stats.row_ratio_max, stats.row_ratio_p99) == (100.0, 99.0)
    assert stats.one_value_blocks[4] == pytest.approx(98 / 100)  # rows 3..100: max > 2 x 1


def test_nothing_to_measure_is_nan():
    assert all(math.isnan(v) for v in vars(outlier_stats(torch.zeros(4, 32), [32])).values()
               if isinstance(v, float))  # fmt: skip
    assert math.isnan(outlier_stats(torch.zeros(4, 32), [32]).one_value_blocks[32])
    with_nan = torch.ones(4, 32)
    with_nan[1, 2] = math.nan
    stats = outlier_stats(with_nan, [32])
    assert math.isnan(stats.kurtosis) and math.isnan(stats.one_value_blocks[32])
    assert math.isnan(kurtosis(torch.full((8, 8), 2.0)))  # constant: no spread


def test_quantize_inspect_reports_outliers_before_and_after_hadamard(tmp_path):
    path, table = tmp_path / "act.pt", tmp_path / "t.csv"
    torch.save({"act": outlier_matrix()}, path)
    args = ["quantize-inspect", "--file", str(path), "--spec", "mxfp4", "--spec", "nvfp4",
            "--hadamard", "16"]  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(app, [*args, "--csv", str(table)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "outliers" in result.stdout and "1-value /32" in result.stdout
    assert "50.0%" in result.stdout and "25.0%" in result.stdout
    rows = {row["spec"]: row for row in csv.DictReader(table.open())}
    assert float(rows["mxfp4"]["one_value_blocks"]) == 0.5
    assert float(rows["nvfp4"]["one_value_blocks"]) == 0.25
    assert float(rows["mxfp4"]["row_ratio_max"]) == 40.0
    # the transform spreads channel 5 over its 16-value group: no block is one value's
    assert float(rows["mxfp4+rht16"]["one_value_blocks"]) < 0.05
    assert float(rows["mxfp4+rht16"]["kurtosis"]) < float(rows["mxfp4"]["kurtosis"]) / 5

    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    outliers = data["tensors"][0]["outliers"]
    assert set(outliers) == {"none", "rht16"}
    assert outliers["none"]["one_value_blocks"] == {"16": 0.25, "32": 0.5}
    assert outliers["none"]["col_ratio_max"] == 8.0
