"""Attention knockout: the answer position may not read the image tokens at chosen layers; what
that does to the answer (the first answer token's log-probability, the greedy continuation).

"Answer positions" are the last prompt token (whose output is the first answer token) and every
token generated after it: at the chosen layers, their attention entries on the image tokens get the
dtype's most negative value, as the model's own causal mask does for future tokens. Every other
query (the prompt's own tokens, image tokens included) reads as before, so the image information
still flows through the prompt's text tokens; that is the knockout of "Cross-modal Information Flow
in Multimodal Large Language Models" (Zhang et al., 2024).

A forward pre-hook on each chosen attention module edits the additive mask the model passes it;
both runs, with and without the knockout, are on eager attention (the only implementation that
takes an arbitrary additive mask the same way on every device), so they differ only by the mask.
"""

from dataclasses import dataclass

import torch

from g4v.circuits.common import CircuitSettings, check_new_tokens, image_positions, parse_layers, window_layers
from g4v.model.attention import Progress, eager_attention
from g4v.conversation import Message
from g4v.engines.capabilities import Instrumentable, require
from g4v.errors import G4VError
from g4v.images import open_image
from g4v.model.hooks import Hooks
from g4v.model.levels import describe_levels
from g4v.model.scoring import greedy_continuation, next_token_logprobs
from g4v.model.sites import site
from g4v.tiling import plan_tiling


#: The first answer token "barely changes" under the knockout when it is still the top token and its
#: log-probability moved by less than this many nats: then the report says why that can be.
SMALL_CHANGE = 0.1
#: Why: the one sentence the app's report, the command's table and docs/circuits.md give (written
#: here once; a test holds the docs to it).
WHY_LITTLE_CHANGES = ("Only the answer positions are blocked: the prompt's own text tokens still read the image at "
                      "those layers and carry it forward (the knockout of Zhang et al. 2024), and any layer outside "
                      "the chosen ones still reads it.")


@dataclass(frozen=True)
class KnockoutResult:
    """One knockout: the first answer token and the greedy answer, before and after. The tab and
    the command read it by attribute; :meth:`to_dict` is ``knockout.json``."""

    layers: list[int]  # the decoder layers where the answer positions could not read the image
    injection_layers: dict[int, str]  # llm layer -> the level injected in front of it
    answer_position: int  # the last prompt token
    answer_token_id: int  # the first answer token of the unchanged run (its greedy choice)
    answer_token: str
    logprob_before: float  # that token's log-probability (nats), unchanged run
    logprob_after: float  # the same token's log-probability with the knockout
    top_token_after: str  # the knocked-out run's own greedy first token
    continuation_before: str
    continuation_after: str
    continuation_ids_before: list[int]
    continuation_ids_after: list[int]

    @property
    def logprob_change(self) -> float:
        """``logprob_after - logprob_before``, nats."""
        return self.logprob_after - self.logprob_before

    @property
    def barely_changed(self) -> bool:
        """Whether the knockout left the first answer token the top one with its log-probability
        within ``SMALL_CHANGE``: the case a reader takes for "the image is not used there", which the
        knockout alone cannot say."""
        return self.top_token_after == self.answer_token and abs(self.logprob_change) < SMALL_CHANGE

    def to_dict(self) -> dict:
        return {
            "layers": self.layers,
            "injection_layers": {str(k): v for k, v in sorted(self.injection_layers.items())},
            "answer_position": self.answer_position,
            "answer_token_id": self.answer_token_id,
            "answer_token": self.answer_token,
            "logprob_before": self.logprob_before,
            "logprob_after": self.logprob_after,
            "logprob_change": self.logprob_change,
            "top_token_after": self.top_token_after,
            "continuation_before": self.continuation_before,
            "continuation_after": self.continuation_after,
        }


def knockout_layers(config, settings: CircuitSettings) -> list[int]:
    """The checked layers of a knockout: a window around every injection layer, or a range."""
    num_layers = config.text_config.num_hidden_layers
    if settings.window is not None and settings.layers != CircuitSettings.layers:
        raise G4VError("give a layer range or a window, not both")
    if settings.window is not None:
        return window_layers(describe_levels(config), settings.window, num_layers)
    return parse_layers(settings.layers, num_layers)


def attention_knockout(engine, image, prompt: str, settings: CircuitSettings | None = None,
                       progress: Progress = None) -> KnockoutResult:
    """Block the answer positions' attention to the image tokens at the chosen layers (``settings``:
    ``window`` or ``layers``, ``max_new_tokens``); ``progress`` is told when each of the two runs
    starts. Bad input raises :class:`G4VError`."""
    progress = progress or (lambda fraction, text: None)
    settings = settings or CircuitSettings()
    engine = require(engine, Instrumentable, "the circuits views")
    config, tokenizer = engine.model.config, engine.tokenizer
    layers = knockout_layers(config, settings)
    tokens = check_new_tokens(settings.max_new_tokens)
    if image is None:
        raise G4VError("the circuits views need an image")
    picture = open_image(image)
    inputs = engine.prepare_inputs([Message("user", prompt, [picture])], tokens)
    positions = image_positions(inputs, config, plan_tiling((picture.height, picture.width), config).num_image_tokens)
    seq_len = inputs["input_ids"].shape[1]
    image_mask = torch.zeros(seq_len, dtype=torch.bool, device=inputs["input_ids"].device)
    image_mask[positions.to(image_mask.device)] = True
    answer = seq_len - 1

    with engine.adapter_scope(None) as model, eager_attention(model):
        progress(0.0, "the unchanged run")
        before, ids_before = _answer(model, inputs, tokenizer, tokens)
        progress(0.5, "the knocked-out run")
        with knocked_out(model, layers, image_mask, answer):
            after, ids_after = _answer(model, inputs, tokenizer, tokens)
    token_id = int(before.argmax())
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    return KnockoutResult(
        layers=layers,
        injection_layers={level.llm_layer: level.name for level in describe_levels(config)},
        answer_position=answer,
        answer_token_id=token_id,
        answer_token=tokenizer.decode([token_id]),
        logprob_before=float(before[token_id]),
        logprob_after=float(after[token_id]),
        top_token_after=tokenizer.decode([int(after.argmax())]),
        continuation_before=decode(ids_before),
        continuation_after=decode(ids_after),
        continuation_ids_before=ids_before,
        continuation_ids_after=ids_after,
    )


def _answer(model, inputs: dict, tokenizer, tokens: int) -> tuple[torch.Tensor, list[int]]:
    """(vocab,) log-probabilities of the first answer token, and the greedy continuation."""
    with torch.inference_mode():
        logits = model(**inputs, use_cache=False, logits_to_keep=1).logits
    ids = greedy_continuation(model, inputs, tokenizer, tokens) if tokens else []
    return next_token_logprobs(logits), ids


def knocked_out(model, layers: list[int], image_mask: torch.Tensor, answer: int) -> Hooks:
    """Hooks (a ``with`` block) that, at ``layers``, mask the entries from every query at or after
    sequence position ``answer`` to the positions where ``image_mask`` (prompt length) is True."""

    def block(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is None or mask.dim() != 4:
            raise RuntimeError("attention knockout needs the 4-D additive mask of eager attention")
        queries, keys = mask.shape[-2:]
        rows = torch.arange(keys - queries, keys, device=mask.device) >= answer  # absolute positions
        columns = torch.zeros(keys, dtype=torch.bool, device=mask.device)
        columns[: image_mask.numel()] = image_mask.to(mask.device)
        blocked = rows[:, None] & columns[None, :]
        fill = False if mask.dtype == torch.bool else torch.finfo(mask.dtype).min
        return args, {**kwargs, "attention_mask": mask.masked_fill(blocked, fill)}

    hooks = Hooks()
    for layer in layers:
        hooks.before(site(model, f"layers.{layer}.self_attn"), block, with_kwargs=True)
    return hooks
