"""OsciReset (fp4cli.techniques.osci_reset, TetraJet-v2's `distance_ratio` detection): the
window's phases, the ratio of the quantized value's movement to the weight's, the reset to
Q(W), and the options' one-line errors."""

import pytest
import torch

from fp4cli import LinearConfig, QuantLinear, QuantSpec
from fp4cli.recipe_schema import OsciResetConfig, RecipeError
from fp4cli.recipes import apply_overrides, load_recipe
from fp4cli.techniques.osci_reset import OsciReset, OsciResetError


def _layer() -> QuantLinear:
    """One MXFP4 block of 32 whose amax 6 gives it scale 1: its elements round onto E2M1's
    grid itself (2.49 -> 2, 2.51 -> 3, 1.0..1.2 -> 1)."""
    layer = QuantLinear(32, 1, config=LinearConfig(forward_w=QuantSpec.preset("mxfp4")))
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight[0, 0] = 6.0
    return layer


def _set(layer: QuantLinear, oscillating: float, drifting: float) -> None:
    with torch.no_grad():
        layer.weight[0, 1], layer.weight[0, 2] = oscillating, drifting


def test_an_oscillating_weight_is_set_to_its_quantized_value():
    layer = _layer()
    osci = OsciReset(layer, OsciResetConfig(start_step=0, period=4, track_steps=2, threshold=8))
    _set(layer, 2.49, 1.0)
    assert osci.after_step(0) is None and set(osci.tracked) == {""}  # the window begins
    _set(layer, 2.51, 1.1)
    assert osci.after_step(1) is None
    _set(layer, 2.49, 1.2)
    assert osci.after_step(2) is None
    state = osci.tracked[""]
    assert state["quantized_moves"][0, 1] == 2.0  # 2 -> 3 -> 2
    assert torch.isclose(state["weight_moves"][0, 1], torch.tensor(0.04))
    assert state["quantized_moves"][0, 2] == 0.0  # the drifting weight stays at 1
    _set(layer, 2.51, 1.2)  # the reset sets the weight to Q(W) as it is now: 3
    assert osci.after_step(3) == 1 / 32  # ratio 2 / 0.04 = 50 >= 8; the others 0
    assert layer.weight[0, 1] == 3.0 and torch.isclose(layer.weight[0, 2], torch.tensor(1.2))
    assert layer.weight[0, 0] == 6.0 and osci.tracked == {}
    assert osci.after_step(4) is None and set(osci.tracked) == {""}  # the next window


def test_nothing_happens_before_the_first_window():
    layer = _layer()
    osci = OsciReset(layer, OsciResetConfig(start_step=6, period=4, track_steps=1, threshold=8))
    for step in range(8):  # 6 and 7 lie in a window that began before start_step
        _set(layer, 2.49 + 0.02 * (step % 2), 1.0)
        assert osci.after_step(step) is None and osci.tracked == {}
    assert osci.after_step(8) is None and set(osci.tracked) == {""}


def test_the_state_round_trips_for_a_checkpoint():
    layer = _layer()
    config = OsciResetConfig(start_step=0, period=4, track_steps=2, threshold=8)
    osci = OsciReset(layer, config)
    osci.after_step(0)
    _set(layer, 2.51, 1.1)
    osci.after_step(1)
    again = OsciReset(layer, config)
    again.load_state_dict(osci.state_dict())
    for key, value in osci.tracked[""].items():
        assert torch.equal(again.tracked[""][key], value)
    with pytest.raises(OsciResetError, match="tracked layers are not this model's"):
        again.load_state_dict({"tracked": {"other": {}}})


def test_a_forward_hadamard_transform_is_refused():
    config = LinearConfig(forward_w=QuantSpec.preset("mxfp4"), forward_hadamard=16)
    layer = QuantLinear(32, 4, config=config)
    with pytest.raises(OsciResetError, match="Hadamard"):
        OsciReset(layer, OsciResetConfig())


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizer.osci_reset.track_steps=199", "track_steps: must be below period - 1"),
        ("optimizer.osci_reset.period=2", "period: must be an integer of at least 3"),
        ("optimizer.osci_reset.threshold=0", "threshold: must be a positive number"),
        ("optimizer.osci_reset.start_step=-1", "start_step: must be an integer of at least 0"),
    ],
)
def test_bad_options_are_one_line_errors(override, message):
    with pytest.raises(RecipeError, match=message) as error:
        apply_overrides(load_recipe("tetrajet-v2-osci"), [override])
    assert "\n" not in str(error.value)


def test_the_recipe_resolves_with_its_schedule():
    recipe = load_recipe("tetrajet-v2-osci")
    assert recipe.osci_reset == OsciResetConfig(15000, 200, 50, 8.0)
    assert recipe.linear == load_recipe("tetrajet-v2").linear
    assert type(recipe).from_dict(recipe.to_dict()) == recipe
    assert "osci_reset" not in load_recipe("tetrajet-v2").to_dict()["optimizer"]
