"""The 8 levels measured while a model trains, on the training step's own forward and backward.

:class:`DeepstackMonitor` is the plain form, for a custom loop (the demo's trainer uses it);
:mod:`g4v.training.callback` wraps it for ``transformers.Trainer``. On a measured step
(:meth:`MonitorSettings.due`) it records, per level (the shared layer's 8 levels, their capture
points those of :mod:`g4v.model.capture`):

* from the step's forward pass: the injected features' mean norm, the residual stream's mean norm
  just before the injection, their ratio, and the share of image tokens where the injected vector
  outweighs the stream's (see :class:`g4v.training.records.LevelRecord`);
* after the backward: the norm of the level's projector's gradient, as the optimizer applies it
  (after any clipping);
* after the update: how far the projector's weights (and each module group of a LoRA being
  trained) moved since the last record, from a copy kept of them (``update_norms``).

No second forward runs, unless a fixed ``probe`` batch is given: then the forward numbers are that
batch's, measured after the step's update (in eval mode, without gradients), so they compare across
steps and equal an inference pass on the step's checkpoint. The hooks are added for a measured
step's forward only, through :class:`g4v.model.hooks.Hooks`, and they go as soon as that forward has
run (or when the step fails, with :meth:`DeepstackMonitor.step`, or at :meth:`close`). Every
number stays on the device until the record is complete, then comes back in one transfer. Nothing
here draws random numbers or writes into the model: the training's numbers are the same with the
monitor on.
"""

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from g4v.model.capture import token_norms
from g4v.model.hooks import Hooks
from g4v.model.levels import describe_levels
from g4v.model.sites import base_model_of, projector_site, site
from g4v.training.records import LevelRecord, Record, check_levels
from g4v.training.settings import MonitorSettings

log = logging.getLogger("g4v.training")


def lora_groups(model) -> dict[str, list[torch.nn.Parameter]]:
    """A LoRA's trainable weights by module group (the module name PEFT targets: ``q_proj``,
    ``down_proj``, ...); empty for a model without one."""
    groups: dict[str, list] = {}
    for name, param in model.named_parameters():
        parts = name.split(".")
        for marker in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
            if marker in parts and param.requires_grad:
                groups.setdefault(parts[parts.index(marker) - 1], []).append(param)
    return groups


class _Pass:
    """Hooks that read one forward pass: the injected features and the stream before each
    injection, reduced to per-level sums (0-d device tensors) as the pass runs."""

    def __init__(self, model, levels):
        self.model = model
        self.level_at_layer = {level.llm_layer: level for level in levels}
        self.sums: dict[str, torch.Tensor] = {}  # level -> (4,) injected sum, residual sum, dominant, tokens
        self.injected: dict[int, torch.Tensor] = {}  # llm layer -> (tokens,) norms
        self.rows = self.text_weights = None
        self.active = self.done = False
        self.hooks = Hooks()

    def attach(self) -> None:
        language_model = site(self.model, "language_model")
        self.hooks.before(language_model, self.on_input, with_kwargs=True)
        self.hooks.after(language_model, self.on_output)
        for layer in self.level_at_layer:
            if layer > 0:  # the stream before layer L's injection is layer L-1's output
                self.hooks.after(site(self.model, f"layers.{layer - 1}"),
                                 lambda m, a, out, layer=layer: self.on_stream(layer, out))

    def on_input(self, module, args, kwargs):
        features = kwargs.get("deepstack_features")
        if self.done or self.active or not features:  # not this pass (a text-only one, a cached decoding step)
            return
        self.active = True
        embeds = kwargs["inputs_embeds"]  # (batch, seq, hidden), image placeholders zeroed
        image = kwargs["vision_mask"][..., 0].to(embeds.device)  # (batch, seq)
        self.rows = image.reshape(-1).nonzero().squeeze(1)  # image tokens in packing order (one sync)
        text = ~image
        padding = kwargs.get("attention_mask")
        if isinstance(padding, torch.Tensor) and padding.shape == image.shape:
            text = text & padding.to(torch.bool)
        self.text_weights = text.reshape(-1).to(torch.float32) / text.sum().clamp(min=1)
        for layer in self.level_at_layer:
            self.injected[layer] = token_norms(features[layer].detach())
        if 0 in self.level_at_layer:
            self.on_stream(0, embeds * module.embedding_multiplier)  # the text model's stream starts so

    def on_stream(self, layer: int, output) -> None:
        if not self.active:  # e.g. a checkpointed layer run again in the backward
            return
        hidden = (output[0] if isinstance(output, tuple) else output).detach()
        flat = hidden.reshape(-1, hidden.shape[-1])
        injected = self.injected[layer]
        if layer == 0:
            # The stream at the image tokens is the zeroed placeholders: compare with the text tokens'.
            residual = torch.zeros_like(injected)
            reference = (token_norms(flat) * self.text_weights).sum() * injected.numel()
        else:
            residual = token_norms(flat.index_select(0, self.rows))
            reference = residual.sum()
        dominant = (injected > residual).sum().to(torch.float32)
        sums = torch.stack([injected.sum(), reference, dominant, torch.tensor(float(injected.numel()),
                                                                               device=injected.device)])
        self.sums[self.level_at_layer[layer].name] = sums

    def on_output(self, module, args, output):
        if self.active:
            self.active, self.done = False, True
            self.hooks.remove()  # this pass is read: nothing stays on the model


class DeepstackMonitor:
    """Measures the 8 levels of ``model`` (a Granite 4 Vision model, or PEFT's wrapper of one) on
    the steps ``settings`` says; each record goes to ``on_record`` and into :attr:`history`.

    In a custom loop::

        with DeepstackMonitor(model, on_record=print) as monitor:
            for step in range(1, steps + 1):
                with monitor.step(step):
                    loss = model(**batch).loss
                    loss.backward()
                    clip_grad_norm_(model.parameters(), 1.0)
                    monitor.gradients_ready()  # before the optimizer steps
                    optimizer.step()
                    optimizer.zero_grad()
    """

    def __init__(self, model, settings: MonitorSettings | None = None, probe: dict | list[dict] | None = None,
                 on_record: Callable[[Record], None] | None = None):
        self.model = model
        self.settings = settings or MonitorSettings()
        self.probe = probe
        self.on_record = on_record
        self.levels = describe_levels(base_model_of(model).config)
        self.projectors = {level.name: list(site(model, projector_site(level)).parameters()) for level in self.levels}
        self.lora = lora_groups(model)
        self.history: list[Record] = []
        self._step: int | None = None
        self._pass: _Pass | None = None
        self._grads: dict[str, torch.Tensor] = {}
        self._copies = self._copy_weights() if self.settings.update_norms else None

    # ── a measured step ──

    def begin(self, step: int, measure: bool | None = None) -> bool:
        """Start optimizer step ``step`` (1 = the first); on a measured one (``settings.due``, or
        ``measure``), hook its forward."""
        self._drop_pass()
        self._step = step if (self.settings.due(step) if measure is None else measure) else None
        self._grads = {}
        if self._step is not None and self.probe is None:
            self._pass = _Pass(self.model, self.levels)
            self._pass.attach()
        return self._step is not None

    def gradients_ready(self) -> None:
        """Read the projectors' gradients (after any clipping, before the optimizer steps)."""
        if self._step is None:
            return
        for name, params in self.projectors.items():
            self._grads[name] = _norm([p.grad for p in params if p.grad is not None])

    def end(self) -> Record | None:
        """Finish the step after the optimizer's update; on a measured step, the record."""
        step, self._step = self._step, None
        if step is None:
            return None
        forward = self._measure_probe() if self.probe is not None else self._pass.sums if self._pass else {}
        self._drop_pass()
        updates = self._update_norms()
        names = [level.name for level in self.levels]
        # one transfer: per level (injected sum, reference sum, dominant, tokens, grad, update), then LoRA groups
        device = self.projectors[names[0]][0].device
        nan = torch.full((4,), float("nan"), device=device)
        rows = [torch.cat([forward.get(n, nan).to(device), self._grads.get(n, nan[0]).reshape(1).to(device),
                           updates.get(n, nan[0]).reshape(1).to(device)]) for n in names]
        groups = [group for group in self.lora if group in updates]
        lora_norms = [updates[group].reshape(1).to(device) for group in groups]
        values = torch.cat([torch.stack(rows).flatten(), *lora_norms]).cpu().tolist()
        lora = dict(zip(groups, values[6 * len(names):]))
        values = [values[6 * i:6 * i + 6] for i in range(len(names))]
        levels = [_level_record(name, row) for name, row in zip(names, values)]
        previous = {level.name: level for level in self.history[-1].levels} if self.history else {}
        record = Record(step, levels, lora, check_levels(step, levels, previous, self.settings))
        for alert in record.alerts:
            log.warning("deepstack %s", alert.line())
        self.history.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record

    def abandon(self) -> None:
        """A step that failed: its hooks go, nothing is recorded."""
        self._drop_pass()
        self._step = None

    @contextmanager
    def step(self, step: int) -> Iterator[bool]:
        """``begin`` ... ``end`` around one optimizer step of a custom loop (forward, backward,
        :meth:`gradients_ready`, update); the hooks go whatever happens inside."""
        measured = self.begin(step)
        try:
            yield measured
        except BaseException:
            self.abandon()
            raise
        self.end()

    def close(self) -> None:
        """Remove every hook and drop the weight copies (safe to call twice)."""
        self.abandon()
        self._copies = None

    def __enter__(self) -> "DeepstackMonitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ── helpers ──

    def _drop_pass(self) -> None:
        if self._pass is not None:
            self._pass.hooks.remove()
            self._pass = None

    def _measure_probe(self) -> dict[str, torch.Tensor]:
        """The probe batches' forward sums, in eval mode (no dropout, so no random numbers drawn)."""
        total: dict[str, torch.Tensor] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            for batch in [self.probe] if isinstance(self.probe, dict) else self.probe:
                self._pass = _Pass(self.model, self.levels)
                with torch.no_grad():
                    self._pass.attach()
                    self.model(**batch)
                for name, sums in self._pass.sums.items():
                    total[name] = total[name] + sums if name in total else sums
                self._drop_pass()
        finally:
            self._drop_pass()
            self.model.train(was_training)
        return total

    def _watched(self) -> dict[str, list[torch.nn.Parameter]]:
        return {**self.projectors, **self.lora}

    def _copy_weights(self) -> dict[str, list[torch.Tensor]]:
        with torch.no_grad():
            return {name: [p.detach().clone() for p in params] for name, params in self._watched().items()}

    def _update_norms(self) -> dict[str, torch.Tensor]:
        """Each projector's and LoRA group's update norm since the last record; the copies move on."""
        if self._copies is None:
            return {}
        norms = {}
        with torch.no_grad():
            for name, params in self._watched().items():
                copies = self._copies[name]
                norms[name] = _norm([p.detach().float() - c.float() for p, c in zip(params, copies)])
                for p, c in zip(params, copies):
                    c.copy_(p.detach())
        return norms


def _norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of several tensors together, in float32 (0-d, on their device); NaN for none."""
    if not tensors:
        return torch.tensor(float("nan"))
    squares = [torch.linalg.vector_norm(t.detach(), dtype=torch.float32) ** 2 for t in tensors]
    return torch.stack([s.to(squares[0].device) for s in squares]).sum().sqrt()


def _level_record(name: str, row: list[float]) -> LevelRecord:
    injected_sum, reference_sum, dominant, tokens, grad, update = row
    known = lambda x: None if x != x else x  # NaN: not measured
    if tokens != tokens or tokens == 0:
        return LevelRecord(name, grad_norm=known(grad), update_norm=known(update))
    injected, residual = injected_sum / tokens, reference_sum / tokens
    return LevelRecord(name, injected_norm=injected, residual_norm=residual,
                       ratio=injected / residual if residual > 0 else float("inf"),
                       dominant_share=dominant / tokens, grad_norm=known(grad), update_norm=known(update))
