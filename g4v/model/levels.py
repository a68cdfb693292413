"""The 8 places ("levels") where Granite 4 Vision adds visual features to its language model, and
the checked ``{level: factor}`` requests that zero or scale them.

Granite 4 Vision zeroes the embeddings of the ``<image>`` placeholder tokens and adds its visual
features into the language model's residual stream at 8 levels:

* 4 **deepstack** levels: ``config.deepstack_layer_map`` pairs ``(vision_layer, llm_layer)``; each
  vision layer is area-downsampled and projected by its own window Q-Former;
* 4 **spatial** levels: the ``spatial_vision_layer`` sampled at one corner (TL, TR, BL, BR) of every
  2x2 block, injected at ``spatial_target_layers``.

Everything here is read from the config alone (no weights, no torch), so the CLI and the app can
check a user's level names and factors before any model runs.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass

from g4v.errors import WHOLE_TEXT, G4VError, NumberError, read_decimal

SPATIAL_OFFSETS = ("TL", "TR", "BL", "BR")  # order of transformers' spatial_projectors (offset 0..3)

#: The largest factor (in absolute value) a level may be scaled by. Injected features are of the
#: residual stream's own size, so a factor this large already swamps every other signal; beyond it a
#: bf16 or fp16 model only overflows to inf / NaN, which says nothing about the level.
MAX_SCALE = 1e4


@dataclass(frozen=True)
class Level:
    """One of the 8 places where visual features enter the language model."""

    index: int  # position in transformers' deepstack_features list: deepstack first, then spatial
    name: str  # deepstack0..deepstack3, spatial_TL..spatial_BR
    kind: str  # "deepstack" or "spatial"
    vision_layer: int  # as written in the config: an index into the vision tower's hidden states
    vision_hidden_state: int  # the same, resolved: 0 = patch embeddings, k = output of encoder layer k
    llm_layer: int  # the decoder layer the features are added in front of
    offset: str | None = None  # spatial levels: which corner of each 2x2 block (TL, TR, BL, BR)

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "kind": self.kind,
            "vision_layer": self.vision_layer,
            "vision_hidden_state": self.vision_hidden_state,
            "llm_layer": self.llm_layer,
            "offset": self.offset,
        }


def describe_levels(config) -> list[Level]:
    """The 8 levels of a ``Granite4VisionConfig``, in the order the model produces their features."""
    vision_states = config.vision_config.num_hidden_layers + 1  # embeddings + one per encoder layer
    text_layers = config.text_config.num_hidden_layers
    levels = []
    for index, (vision_layer, llm_layer) in enumerate(config.deepstack_layer_map or []):
        levels.append(Level(index, f"deepstack{index}", "deepstack", int(vision_layer),
                            _resolve(int(vision_layer), vision_states), int(llm_layer)))
    spatial_layer = int(config.spatial_vision_layer)
    for offset, llm_layer in zip(SPATIAL_OFFSETS, config.spatial_target_layers or []):
        levels.append(Level(len(levels), f"spatial_{offset}", "spatial", spatial_layer,
                            _resolve(spatial_layer, vision_states), int(llm_layer), offset))
    targets = [level.llm_layer for level in levels]
    if len(set(targets)) != len(targets) or not all(0 <= layer < text_layers for layer in targets):
        # The model keys its injections by LLM layer, so a shared layer would silently drop a level.
        raise G4VError(f"this model's injection layers {targets} are not distinct layers of its {text_layers}-layer LM")
    return levels


def _resolve(layer: int, count: int) -> int:
    return layer if layer >= 0 else count + layer


def find_level(levels: list[Level], spec) -> Level:
    """A level by name (case-insensitive) or by index (an int or a string of digits)."""
    text = str(spec).strip()
    if WHOLE_TEXT.fullmatch(text):
        number = int(text)
        if 0 <= number < len(levels):
            return levels[number]
    for level in levels:
        if level.name.lower() == text.lower():
            return level
    names = ", ".join(level.name for level in levels)
    raise G4VError(f"unknown level {text!r}: use an index 0-{len(levels) - 1} or one of {names}")


def level_scales(levels: list[Level], ablate: Iterable = (), scale: dict | None = None) -> dict[str, float]:
    """``{level name: factor}`` from levels to zero and ``{level: factor}`` to scale; checks every name
    and factor. A factor of exactly 1 changes nothing, so it is left out: the result holds only the
    levels that a second run would really change (see :func:`unit_scale_levels` for the others)."""
    return {name: f for name, f in requested_scales(levels, ablate, scale).items() if f != 1.0}


def unit_scale_levels(levels: list[Level], ablate: Iterable = (), scale: dict | None = None) -> list[str]:
    """The levels asked to be scaled by exactly 1 (so left unchanged), for reports to mention."""
    return sorted(name for name, f in requested_scales(levels, ablate, scale).items() if f == 1.0)


def requested_scales(levels: list[Level], ablate: Iterable = (), scale: dict | None = None) -> dict[str, float]:
    """Every requested ``{level name: factor}``, factors of 1 included; ablating wins over scaling."""
    factors: dict[str, float] = {}
    for spec, factor in (scale or {}).items():
        factors[find_level(levels, spec).name] = _checked_factor(spec, factor)
    for spec in ablate:
        factors[find_level(levels, spec).name] = 0.0
    return factors


def _checked_factor(spec, factor) -> float:
    try:
        factor = float(factor)
    except (TypeError, ValueError):
        raise G4VError(f"scale for level {spec!r} must be a number, got {factor!r}") from None
    if not math.isfinite(factor):
        raise G4VError(f"scale for level {spec!r} must be finite, got {factor}")
    if abs(factor) > MAX_SCALE:
        raise G4VError(f"scale for level {spec!r} is {factor:g}, outside -{MAX_SCALE:g} to {MAX_SCALE:g}: a "
                       "larger factor only overflows the model's numbers instead of showing the level's effect")
    return factor


def parse_scale_specs(specs: Iterable[str]) -> dict[str, float]:
    """``["spatial_TL=0.5", "3=2"]`` -> ``{"spatial_TL": 0.5, "3": 2.0}`` (levels checked later)."""
    parsed = {}
    for spec in specs:
        name, sep, value = str(spec).partition("=")
        if not sep or not name.strip():
            raise G4VError(f"a scale is written LEVEL=FACTOR (e.g. deepstack0=0.5), got {spec!r}")
        if name.strip() in parsed:
            raise G4VError(f"level {name.strip()} is scaled twice: give one factor per level")
        try:  # read as every typed number is (docs/limits.md): ASCII digits, a short exponent, finite
            parsed[name.strip()] = read_decimal(value.strip())
        except NumberError as err:
            raise G4VError(f"scale {spec!r}: {err}") from None
    return parsed
