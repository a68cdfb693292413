"""The port inspector's per-level tolerance (``g4v.port.compare.compare_levels``), on real features.

``compare_levels`` is pure, so it runs here without vLLM: the "vLLM side" is built from the bundled
checkpoint's own features, as transformers computes them. Two kinds of difference must be told
apart (issue 17, item 9):

* float rounding only, at the magnitude of the real model's features (about 20): the same features
  computed in float64 and float32, or float32 features with relative noise of a few 1e-6. The old
  absolute tolerance (1e-5) called these "DIFFERS";
* real faults: one level scaled by 1.001, two spatial levels swapped, a level dropped. These must
  still be caught and explained.

The bundled features peak at well under 1, so both sides are multiplied by ``SCALE``, a power of
two: that multiplication is exact in floating point, so float64-vs-float32 rounding keeps its
relative size at the larger magnitude.
"""

import copy

import pytest
import torch

from g4v.errors import G4VError
from g4v.port.compare import compare_levels, default_tolerance
from g4v.port.run import reference_run
from tests.conftest import make_image

PROMPT = "What colour is the shape?"
SCALE = 32.0


@pytest.fixture(scope="module")
def run(hf_engine):
    """transformers' float32 reference run (the port inspector's own reference side)."""
    return reference_run(hf_engine, make_image(380, 120, seed=1), PROMPT, max_new_tokens=0)


@pytest.fixture(scope="module")
def float64_features(hf_engine, run) -> dict[str, torch.Tensor]:
    """The same features computed by a float64 copy of the model: read straight off the features
    the model hands its language model (an independent capture, not ``g4v.model.capture``'s)."""
    model = copy.deepcopy(hf_engine.model).to(torch.float64)
    seen = {}
    language_model = model.model.language_model
    handle = language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.update(kwargs["deepstack_features"]), with_kwargs=True)
    inputs = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in run["inputs"].items()}
    try:
        with torch.inference_mode():
            model(**inputs)
    finally:
        handle.remove()
    return {level.name: seen[level.llm_layer].detach().clone() for level in run["levels"]}


def by_layer(levels, features: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Features by level name -> by LLM layer, the way vLLM's side arrives in ``compare_levels``."""
    return {level.llm_layer: features[level.name] for level in levels}


def rows_of(levels, reference, candidate, tolerance):
    return {row.name: row for row in compare_levels(levels, reference, by_layer(levels, candidate), tolerance)}


def token_rms(x: torch.Tensor) -> torch.Tensor:
    return x.double().pow(2).mean(dim=-1, keepdim=True).sqrt()


# ── the defaults ─────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_defaults_start_from_torch_testing(dtype):
    """torch.testing.assert_close's defaults for the dtype: same atol, rtol at least as wide."""
    from torch.testing._comparison import default_tolerances

    torch_rtol, torch_atol = default_tolerances(dtype)
    tolerance = default_tolerance(dtype)
    assert tolerance.atol == torch_atol
    assert tolerance.rtol >= torch_rtol
    assert str(dtype).removeprefix("torch.") in tolerance.source
    assert tolerance.rtol < 1e-3 or dtype != torch.float32, "a 0.1 % fault must stay visible in float32"


def test_flags_override_one_side_each():
    both = default_tolerance(torch.float32, atol=0.0, rtol=0.0)
    assert (both.atol, both.rtol) == (0.0, 0.0) and "given" in both.source
    only_rtol = default_tolerance(torch.float32, rtol=3e-4)
    assert (only_rtol.atol, only_rtol.rtol) == (default_tolerance(torch.float32).atol, 3e-4)


@pytest.mark.parametrize("bad", [{"atol": -1e-5}, {"rtol": float("nan")}, {"rtol": float("inf")}, {"atol": "x"}])
def test_bad_tolerance_is_one_line(bad):
    with pytest.raises(G4VError) as info:
        default_tolerance(torch.float32, **bad)
    message = str(info.value)
    assert "\n" not in message and next(iter(bad)) in message


# ── rounding only: agrees ─────────────────────────────────────────────────────────────────────────


def test_float64_vs_float32_at_magnitude_20_agrees(run, float64_features):
    reference = {name: f * SCALE for name, f in float64_features.items()}
    candidate = {name: f.double() * SCALE for name, f in run["features"].items()}
    peak = max(float(f.abs().max()) for f in reference.values())
    assert 10 < peak < 40, "the features compared must have the real model's magnitude"
    rows = rows_of(run["levels"], reference, candidate, default_tolerance(torch.float32))
    for row in rows.values():
        assert row.ok, row.problem
        assert 0 < row.max_rel_diff < 1e-5  # float32 rounding, really there and really small
    # Not a trivial pass: exact comparison sees the rounding, and so did the old absolute 1e-5.
    exact = rows_of(run["levels"], reference, candidate, default_tolerance(torch.float32, atol=0, rtol=0))
    assert not any(row.ok for row in exact.values())
    assert max(row.max_abs_diff for row in rows.values()) > 1e-5


@pytest.mark.parametrize("kind", ["elementwise", "token scale"])
def test_relative_noise_of_4e_6_at_magnitude_20_agrees(run, kind):
    """The issue's picture: relative difference 3.8e-6 on features of magnitude about 20. Noise
    either proportional to each element, or of each token's RMS size (what rounding in a matrix
    product looks like: elements near zero get their neighbours' rounding)."""
    generator = torch.Generator().manual_seed(0)
    reference = {name: f * SCALE for name, f in run["features"].items()}
    candidate = {}
    for name, ref in reference.items():
        noise = torch.randn(ref.shape, generator=generator, dtype=torch.float64)
        size = ref.double().abs() if kind == "elementwise" else token_rms(ref)
        candidate[name] = (ref.double() + 4e-6 * size * noise).float()
    rows = rows_of(run["levels"], reference, candidate, default_tolerance(torch.float32))
    for name, row in rows.items():
        assert row.ok, row.problem
        assert 1e-6 < row.max_rel_diff < 1e-5
        assert row.max_abs_diff > 1e-5  # what the old absolute 1e-5 rule called "DIFFERS"


def test_tolerance_used_is_the_worst_share_of_the_allowance(run, float64_features):
    """``share_of_tolerance_used`` is max |diff| / (atol + rtol * max(|ref|, token RMS)), recomputed here."""
    tolerance = default_tolerance(torch.float32)
    rows = rows_of(run["levels"], float64_features, {n: f.double() for n, f in run["features"].items()}, tolerance)
    for name, ref in float64_features.items():
        ref = ref.double()
        allowed = tolerance.atol + tolerance.rtol * torch.maximum(ref.abs(), token_rms(ref))
        expected = float(((run["features"][name].double() - ref).abs() / allowed).max())
        assert rows[name].share_of_tolerance_used == pytest.approx(expected, rel=1e-6)
        assert 0 < rows[name].share_of_tolerance_used < 1


# ── planted faults: caught and explained ──────────────────────────────────────────────────────────


@pytest.mark.parametrize("magnitude", [1.0, SCALE])
def test_level_scaled_by_1_001_is_caught(run, float64_features, magnitude):
    reference = {name: f * magnitude for name, f in float64_features.items()}
    candidate = {name: f.double() * magnitude for name, f in run["features"].items()}
    candidate["spatial_BL"] = candidate["spatial_BL"] * 1.001
    rows = rows_of(run["levels"], reference, candidate, default_tolerance(torch.float32))
    bad = rows["spatial_BL"]
    assert not bad.ok and bad.share_of_tolerance_used > 1
    assert "scaled" in bad.problem and "1.001" in bad.problem
    assert [name for name, row in rows.items() if not row.ok] == ["spatial_BL"]


def test_two_spatial_levels_swapped_are_caught(run, float64_features):
    reference = {name: f * SCALE for name, f in float64_features.items()}
    candidate = {name: f.double() * SCALE for name, f in run["features"].items()}
    candidate["spatial_TR"], candidate["spatial_BL"] = candidate["spatial_BL"], candidate["spatial_TR"]
    rows = rows_of(run["levels"], reference, candidate, default_tolerance(torch.float32))
    assert sorted(name for name, row in rows.items() if not row.ok) == ["spatial_BL", "spatial_TR"]
    assert "swapped" in rows["spatial_TR"].problem and "spatial_BL" in rows["spatial_TR"].problem
    assert "swapped" in rows["spatial_BL"].problem and "spatial_TR" in rows["spatial_BL"].problem


def test_dropped_level_is_caught(run, float64_features):
    reference = {name: f * SCALE for name, f in float64_features.items()}
    candidate = {name: f.double() * SCALE for name, f in run["features"].items()}
    candidate["deepstack2"] = torch.zeros_like(candidate["deepstack2"])
    rows = rows_of(run["levels"], reference, candidate, default_tolerance(torch.float32))
    assert [name for name, row in rows.items() if not row.ok] == ["deepstack2"]
    assert "dropped" in rows["deepstack2"].problem
