"""What one forward pass of Granite 4 Vision injects at each level, and the residual stream around it.

transformers' ``Granite4VisionModel.forward`` hands the language model a dict
``deepstack_features = {llm_layer: features (num_image_tokens, hidden)}`` and a ``vision_mask``;
``Granite4VisionTextModel.forward`` adds ``deepstack_features[i]`` at the image positions right
before decoder layer ``i`` (the levels: :mod:`g4v.model.levels`). Nothing here copies that code.
:func:`instrument` attaches hooks, at capture points named as :mod:`g4v.model.sites` declares them:

* a forward pre-hook on the language model (``language_model``) reads (and, to ablate or scale a
  level, replaces) the ``deepstack_features`` argument: the exact tensors the model injects;
* a forward pre-hook on every decoder layer (``layers.{i}``) reads the residual stream entering it,
  which is the stream *after* that layer's injection;
* a forward hook on the decoder layer before each target layer reads the stream *before* the
  injection (for layer 0: the language model's input embeddings times Granite's
  ``embedding_multiplier``, which is what the text model starts its residual stream with).

Norms are reduced on the device as 0-d tensors and fetched in one transfer at the end; full tensors
are kept only with ``full=True``. Every hook is removed when the ``with`` block ends, whatever
happens inside it (:class:`g4v.model.hooks.Hooks`), so nothing leaks into the next request.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from g4v.errors import G4VError
from g4v.model.hooks import Hooks
from g4v.model.levels import Level, describe_levels
from g4v.model.sites import site, site_names

@dataclass
class LevelCapture:
    level: Level
    scale: float  # 1.0 unless the run ablated (0.0) or scaled this level
    injected_norm: torch.Tensor  # (num_image_tokens,) float32, CPU: L2 norm of each injected vector
    injected_norm_mean: float
    residual_norm_before_image: float  # mean L2 norm over image tokens, just before the injection
    residual_norm_after_image: float
    residual_norm_before_text: float  # mean over the other tokens (nothing is added there)
    residual_norm_after_text: float
    # full=True only, on the CPU:
    injected: torch.Tensor | None = None  # (num_image_tokens, hidden): what was added
    residual_before: torch.Tensor | None = None  # (seq, hidden)
    residual_after: torch.Tensor | None = None  # (seq, hidden)

    def to_dict(self) -> dict:
        return {
            **self.level.to_dict(),
            "scale": self.scale,
            "injected_norm_mean": self.injected_norm_mean,
            "injected_norm_max": float(self.injected_norm.max()) if self.injected_norm.numel() else 0.0,
            "residual_norm_before_mean": self.residual_norm_before_image,
            "residual_norm_after_mean": self.residual_norm_after_image,
            "residual_norm_before_text_mean": self.residual_norm_before_text,
            "residual_norm_after_text_mean": self.residual_norm_after_text,
        }


@dataclass
class Trajectory:
    """Mean residual-stream norm entering each decoder layer (after its injection, if any); the last
    point, at ``num_layers``, is the output of the last decoder layer (before the final norm)."""

    layers: list[int]  # 0 .. num_layers
    image_norm: list[float]  # nan when the prompt has no image tokens
    text_norm: list[float]
    injection_layers: dict[int, str]  # llm layer -> level name

    def to_dict(self) -> dict:
        return {
            "layers": self.layers,
            "image_norm": [_json_float(x) for x in self.image_norm],
            "text_norm": [_json_float(x) for x in self.text_norm],
            "injection_layers": {str(k): v for k, v in sorted(self.injection_layers.items())},
        }


@dataclass
class Capture:
    levels: list[LevelCapture]  # empty when the request had no image
    trajectory: Trajectory
    num_image_tokens: int
    num_text_tokens: int
    image_mask: torch.Tensor  # (seq,) bool, CPU
    residual_stream: torch.Tensor | None = None  # full=True: (num_layers + 1, seq, hidden), the trajectory's points

    def tensors(self) -> dict[str, torch.Tensor]:
        """Everything it holds, by name, contiguous on the CPU (for ``safetensors``)."""
        out = {"image_mask": self.image_mask.to(torch.uint8),
               "trajectory.image_norm": torch.tensor(self.trajectory.image_norm),
               "trajectory.text_norm": torch.tensor(self.trajectory.text_norm)}
        for cap in self.levels:
            name = cap.level.name
            out[f"{name}.injected_norm"] = cap.injected_norm
            for attr in ("injected", "residual_before", "residual_after"):
                if getattr(cap, attr) is not None:
                    out[f"{name}.{attr}"] = getattr(cap, attr)
        if self.residual_stream is not None:
            out["residual_stream"] = self.residual_stream
        return {name: tensor.detach().cpu().contiguous() for name, tensor in out.items()}


def _json_float(x: float):
    return None if x != x else x


class _Recorder:
    """The read-only hooks of one forward pass; norms stay 0-d device tensors until :meth:`finish`."""

    def __init__(self, num_layers: int, levels: list[Level], full: bool):
        self.levels = levels
        self.full = full
        self.num_layers = num_layers
        self.level_at_layer = {level.llm_layer: level for level in levels}
        self.seen_input = False
        self.has_image = False
        self.injected_norms: dict[int, torch.Tensor] = {}  # llm layer -> (num_image_tokens,)
        self.group_norms: dict[tuple[int, str], torch.Tensor] = {}  # (llm layer, before|after) -> (2,) image, text
        self.image_weights = self.text_weights = None  # (seq,) averaging weights over each token group
        self.image_mask = None  # (seq,) bool
        self.stream_norms: list[tuple[torch.Tensor, torch.Tensor]] = []  # per trajectory point
        self.streams: list[torch.Tensor] = []  # full=True: (seq, hidden) per trajectory point
        # full=True only: llm layer -> injected (num_image_tokens, hidden) / stream (seq, hidden)
        self.injected: dict[int, torch.Tensor] = {}
        self.streams_at: dict[tuple[int, str], torch.Tensor] = {}

    # hooks

    def on_language_model_input(self, module, args, kwargs):
        if self.seen_input:  # a second forward (generate's decoding steps) is not recorded
            return
        self.seen_input = True
        embeds = kwargs["inputs_embeds"]  # (1, seq, hidden)
        if embeds.shape[0] != 1:
            raise G4VError("the inspector takes one request at a time (batch size 1)")
        vision_mask = kwargs.get("vision_mask")  # (1, seq, 1) bool, or None without images
        if vision_mask is None:
            image_mask = torch.zeros(embeds.shape[1], dtype=torch.bool, device=embeds.device)
        else:
            image_mask = vision_mask[0, :, 0].to(embeds.device)
        self.image_mask = image_mask
        self.image_weights = _averaging_weights(image_mask)
        self.text_weights = _averaging_weights(~image_mask)
        features = kwargs.get("deepstack_features") or {}  # llm layer -> (num_image_tokens, hidden)
        self.has_image = bool(features)
        for layer in self.level_at_layer if self.has_image else []:
            self.injected_norms[layer] = token_norms(features[layer])
            if self.full:
                self.injected[layer] = features[layer].detach()
        if 0 in self.level_at_layer and self.has_image:
            # The text model's residual stream starts as inputs_embeds * embedding_multiplier.
            self._record_injection_side(0, "before", embeds[0] * module.embedding_multiplier)

    def on_layer_input(self, layer_idx: int, args, kwargs):
        if not self.seen_input or len(self.stream_norms) > layer_idx:
            return
        hidden = (args[0] if args else kwargs["hidden_states"])[0]  # (seq, hidden)
        means = self._record_stream(hidden)
        if layer_idx in self.level_at_layer and self.has_image:
            self._record_injection_side(layer_idx, "after", hidden, means)

    def on_layer_output(self, layer_idx: int, output):
        if not self.seen_input or len(self.stream_norms) != layer_idx + 1:
            return
        hidden = (output[0] if isinstance(output, tuple) else output)[0]  # (seq, hidden)
        if layer_idx + 1 in self.level_at_layer and self.has_image:
            self._record_injection_side(layer_idx + 1, "before", hidden)
        if layer_idx == self.num_layers - 1:
            self._record_stream(hidden)

    def _record_stream(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        means = self._group_means(hidden)
        self.stream_norms.append(means)
        if self.full:
            self.streams.append(hidden.detach())
        return means

    def _record_injection_side(self, layer: int, side: str, hidden: torch.Tensor, means=None) -> None:
        """Norms of the stream just ``before`` or ``after`` the injection at ``layer``."""
        self.group_norms[layer, side] = torch.stack(means if means is not None else self._group_means(hidden))
        if self.full:
            self.streams_at[layer, side] = hidden.detach()

    def _group_means(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(seq, hidden) -> mean L2 norm over the image tokens and over the text tokens (0-d each)."""
        norms = token_norms(hidden)  # (seq,)
        return (norms * self.image_weights).sum(), (norms * self.text_weights).sum()

    # results

    def finish(self, scales: dict[str, float]) -> Capture:
        if len(self.stream_norms) != self.num_layers + 1:
            raise RuntimeError("the instrumented forward pass did not run through every decoder layer")
        has_image = self.has_image
        level_rows = []  # per level: injected mean, before/after image, before/after text (0-d tensors)
        injected_norms = []
        for level in self.levels if has_image else []:
            norm = self.injected_norms[level.llm_layer]
            injected_norms.append(norm)
            before, after = self.group_norms[level.llm_layer, "before"], self.group_norms[level.llm_layer, "after"]
            level_rows.append(torch.stack([norm.mean(), before[0], after[0], before[1], after[1]]))
        # One transfer for every number.
        stream_values = torch.stack([torch.stack(pair) for pair in self.stream_norms]).cpu()  # (points, 2)
        level_values = torch.stack(level_rows).cpu() if level_rows else torch.zeros(0, 5)
        injected_norms = [n.cpu() for n in injected_norms]
        image_mask = self.image_mask.cpu()
        num_image = int(image_mask.sum())
        image_norm = stream_values[:, 0].tolist() if num_image else [float("nan")] * len(stream_values)

        levels = []
        for i, level in enumerate(self.levels if has_image else []):
            row = level_values[i].tolist()
            cap = LevelCapture(level, scales.get(level.name, 1.0), injected_norms[i], *row)
            if self.full:
                cap.injected = self.injected[level.llm_layer].cpu()
                cap.residual_before = self.streams_at[level.llm_layer, "before"].cpu()
                cap.residual_after = self.streams_at[level.llm_layer, "after"].cpu()
            levels.append(cap)
        trajectory = Trajectory(
            layers=list(range(self.num_layers + 1)),
            image_norm=image_norm,
            text_norm=stream_values[:, 1].tolist(),
            injection_layers={level.llm_layer: level.name for level in self.levels} if has_image else {},
        )
        stream = torch.stack(self.streams).cpu() if self.full else None
        return Capture(levels, trajectory, num_image, int(image_mask.numel()) - num_image, image_mask, stream)


def token_norms(hidden: torch.Tensor) -> torch.Tensor:
    """(tokens, hidden) -> (tokens,) float32 L2 norms, accumulated in float32 (float64 for a float64
    model: torch refuses to accumulate in a narrower dtype than the input's)."""
    accumulate = torch.promote_types(hidden.dtype, torch.float32)
    return torch.linalg.vector_norm(hidden, dim=-1, dtype=accumulate).to(torch.float32)


def _averaging_weights(mask: torch.Tensor) -> torch.Tensor:
    """(seq,) bool -> (seq,) float32 weights that average over the masked tokens, without a device
    sync (boolean indexing would wait for the device to count the tokens)."""
    weights = mask.to(torch.float32)
    return weights / weights.sum().clamp(min=1.0)


# ── hooks ───────────────────────────────────────────────────────────────────────────────────────


def _scaling_hook(layer_scales: dict[int, float]):
    """A language-model pre-hook that multiplies the features of the given LLM layers."""

    def hook(module, args, kwargs):
        features = kwargs.get("deepstack_features")
        if not features:
            return None  # no image in this forward (or a cached decoding step)
        scaled = {layer: tensor * layer_scales[layer] if layer in layer_scales else tensor
                  for layer, tensor in features.items()}
        return args, {**kwargs, "deepstack_features": scaled}

    return hook


@contextmanager
def instrument(model, levels: list[Level] | None = None, scales: dict[str, float] | None = None,
               record: bool = True, full: bool = False) -> Iterator["_Recorder | None"]:
    """Hooks for the duration of a ``with`` block: scale levels (``{name: factor}``, 0 ablates) and,
    when ``record``, record the next forward pass (read the result with ``recorder.finish``)."""
    levels = levels if levels is not None else describe_levels(model.config)
    language_model = site(model, "language_model")
    layers = [site(model, name) for name in site_names(model, "layers.{i}")]
    by_name = {level.name: level for level in levels}
    layer_scales = {by_name[name].llm_layer: float(f) for name, f in (scales or {}).items() if float(f) != 1.0}
    # Registration order is call order: scaling first, so the recorder sees what is injected.
    with Hooks() as hooks:
        if layer_scales:
            hooks.before(language_model, _scaling_hook(layer_scales), with_kwargs=True)
        recorder = None
        if record:
            recorder = _Recorder(len(layers), levels, full)
            hooks.before(language_model, recorder.on_language_model_input, with_kwargs=True)
            for idx, layer in enumerate(layers):
                hooks.before(layer, lambda m, a, k, idx=idx: recorder.on_layer_input(idx, a, k), with_kwargs=True)
                hooks.after(layer, lambda m, a, o, idx=idx: recorder.on_layer_output(idx, o))
        yield recorder


def capture_forward(model, inputs: dict, scales: dict[str, float] | None = None, full: bool = False,
                    levels: list[Level] | None = None, **forward_kwargs) -> tuple[Capture, torch.Tensor]:
    """One instrumented forward pass; returns the capture and the model's logits (batch, seq, vocab)."""
    levels = levels if levels is not None else describe_levels(model.config)
    with torch.inference_mode(), instrument(model, levels, scales, record=True, full=full) as recorder:
        logits = model(**inputs, **forward_kwargs).logits
        capture = recorder.finish(scales or {})
    return capture, logits


# ── two-picture patching: the injected features read from one run and written into another ────────


def recording_hook(store: dict):
    """A language-model pre-hook that keeps a detached copy of every injected feature tensor,
    ``store[llm_layer] = (num_image_tokens, hidden)``, from the first forward that injects any."""

    def hook(module, args, kwargs):
        features = kwargs.get("deepstack_features")
        if features and not store:
            store.update({layer: tensor.detach().clone() for layer, tensor in features.items()})

    return hook


def replacing_hook(donor: dict[int, torch.Tensor], rows: torch.Tensor | None = None):
    """A language-model pre-hook that writes the ``donor``'s features (``{llm_layer: (num_image_tokens,
    hidden)}``, another picture's) over this forward's at those layers: all image tokens, or only
    ``rows`` (token indices in packing order). The receiving prompt must have as many image tokens."""

    def hook(module, args, kwargs):
        features = kwargs.get("deepstack_features")
        if not features:
            return None  # no image in this forward (a cached decoding step)
        patched = dict(features)
        for layer, source in donor.items():
            own = features[layer]
            if own.shape != source.shape:
                raise RuntimeError(f"layer {layer}: features {tuple(own.shape)} cannot take {tuple(source.shape)}")
            source = source.to(own.device, own.dtype)
            if rows is None:
                patched[layer] = source
            else:
                index = rows.to(own.device)
                patched[layer] = own.index_copy(0, index, source.index_select(0, index))
        return args, {**kwargs, "deepstack_features": patched}

    return hook


def injected_features(model, inputs: dict, **forward_kwargs) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """One forward pass; returns what it injected (``{llm_layer: (num_image_tokens, hidden)}``, empty
    without an image) and its logits (batch, seq, vocab)."""
    store: dict[int, torch.Tensor] = {}
    with torch.inference_mode(), Hooks() as hooks:
        hooks.before(site(model, "language_model"), recording_hook(store), with_kwargs=True)
        logits = model(**inputs, **forward_kwargs).logits
    return store, logits


@contextmanager
def patched_features(model, donor: dict[int, torch.Tensor], rows: torch.Tensor | None = None) -> Iterator[None]:
    """For the ``with`` block, every forward that injects features injects the ``donor``'s at its
    layers instead (see :func:`replacing_hook`); the hook is removed when the block ends."""
    with Hooks() as hooks:
        hooks.before(site(model, "language_model"), replacing_hook(donor, rows), with_kwargs=True)
        yield
