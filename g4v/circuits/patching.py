"""Two-picture patching per level: run picture A with one level's injected features taken from
picture B (same prompt), and see how far the answer moves from A's towards B's.

Why per level: ablating a level (Deepstack) says whether the model *needs* it; patching says
whether that level *carries the difference* between two pictures. With pictures that differ in one
property (a colour, a place), the level whose features alone flip A's answer to B's is where that
property enters the language model.

How: the model hands its language model ``deepstack_features = {llm_layer: (num_image_tokens,
hidden)}`` (:mod:`g4v.model.capture`). One recording pass per picture keeps what it injects and its
next-token distribution; each patched pass runs the receiver's prompt with a language-model
pre-hook that writes the donor's tensors over the receiver's at the chosen levels
(:func:`g4v.model.capture.patched_features`): at every image token, or at a region of them.
``complement`` asks the other question: every level but one from the donor, so whether that one
level, kept, is enough to hold the receiver's answer (a level that carries a property redundantly
with others moves little alone, and its complement moves nearly all the way). Nothing else changes: the text is the same, and the image placeholders' embeddings are zero in both
runs (the features arrive only through the injections), so patching all 8 levels from B gives B's
own next-token distribution; that is the bound each single level is measured against.

The measure: the log-odds of the donor's first answer token against the receiver's,
``log p(donor token) - log p(receiver token)``, in the patched run; ``moved`` is the share of the
way from the receiver's own log-odds (0) to the donor's (1). When both pictures get the same first
answer token there is no way to move along, and ``moved`` is None.
"""

import re
from dataclasses import dataclass, field

import torch

from g4v.circuits.common import CircuitSettings, check_new_tokens, check_on_picture, image_positions
from g4v.conversation import Message
from g4v.engines.capabilities import Instrumentable, require
from g4v.errors import G4VError
from g4v.images import open_image
from g4v.model.capture import injected_features, patched_features
from g4v.model.levels import Level, describe_levels, find_level
from g4v.model.scoring import greedy_continuation, next_token_logprobs
from g4v.tiling import TilingPlan, across, plan_tiling

#: direction -> (receiver, donor): "a_from_b" runs A with B's features.
DIRECTIONS = {"a_from_b": ("A", "B"), "b_from_a": ("B", "A")}
DIRECTION_CHOICES = (*DIRECTIONS, "both")
#: A region or level list longer than this is refused before it is read.
MAX_SPEC_CHARS = 200
_NUMBER = r"[0-9]+"


@dataclass(frozen=True)
class PatchedRun:
    """The receiver's prompt run with the donor's features at ``levels`` (one, all but one, or all)."""

    label: str  # the level's name, "all but NAME" (complement) or "all levels" (the bound)
    levels: list[str]  # the levels that took the donor's features
    logodds: float  # log p(donor's first answer token) - log p(receiver's), in this run
    moved: float | None  # (logodds - receiver's own) / (donor's own - receiver's own); None: same first token
    top_token_id: int  # this run's own greedy first token
    top_token: str
    continuation: str
    continuation_ids: list[int]
    logprobs: torch.Tensor = field(repr=False)  # (vocab,) float32, CPU: the first answer token's distribution

    def to_dict(self) -> dict:
        return {"label": self.label, "levels": self.levels, "logodds": self.logodds, "moved": self.moved,
                "top_token": self.top_token, "continuation": self.continuation}


@dataclass(frozen=True)
class PatchDirection:
    """One direction: the ``receiver`` picture's prompt with the ``donor``'s features."""

    name: str  # a_from_b or b_from_a
    receiver: str  # "A" or "B"
    donor: str
    receiver_token_id: int  # the receiver's own greedy first answer token
    receiver_token: str
    donor_token_id: int
    donor_token: str
    logodds_receiver: float  # log p(donor token) - log p(receiver token), receiver's own run (<= 0)
    logodds_donor: float  # the same, donor's own run (>= 0)
    receiver_continuation: str
    donor_continuation: str
    levels: list[PatchedRun]  # one per chosen level: patched alone (complement: every level but it)
    all_levels: PatchedRun  # every level patched at once: the bound
    donor_logprobs: torch.Tensor = field(repr=False)  # (vocab,) the donor's own first-token distribution

    @property
    def same_first_token(self) -> bool:
        return self.receiver_token_id == self.donor_token_id

    @property
    def runs(self) -> list[PatchedRun]:
        """Every patched run of this direction: each level's, then the bound."""
        return [*self.levels, self.all_levels]

    def to_dict(self) -> dict:
        return {
            "name": self.name, "receiver": self.receiver, "donor": self.donor,
            "receiver_token": self.receiver_token, "donor_token": self.donor_token,
            "same_first_token": self.same_first_token,
            "logodds_receiver": self.logodds_receiver, "logodds_donor": self.logodds_donor,
            "receiver_continuation": self.receiver_continuation, "donor_continuation": self.donor_continuation,
            "levels": [run.to_dict() for run in self.levels],
            "all_levels": self.all_levels.to_dict(),
        }


@dataclass(frozen=True)
class PatchingResult:
    """Both directions of one patching request. The tab, the command and the figure read it by
    attribute; :meth:`to_dict` is ``patching.json``."""

    prompt: str
    grid: tuple[int, int]  # (rows, cols) of tiles, the same for both pictures
    num_image_tokens: int
    region: str  # as asked
    complement: bool  # each run patched every level but one
    patched_tokens: list[int]  # image-token indices (packing order) that took the donor's features
    injection_layers: dict[int, str]  # llm layer -> level name
    directions: list[PatchDirection]

    @property
    def num_patched_tokens(self) -> int:
        return len(self.patched_tokens)

    def to_dict(self) -> dict:
        return {
            "prompt": self.prompt,
            "grid": list(self.grid),
            "num_image_tokens": self.num_image_tokens,
            "region": self.region,
            "complement": self.complement,
            "num_patched_tokens": self.num_patched_tokens,
            "patched_tokens": self.patched_tokens,
            "injection_layers": {str(k): v for k, v in sorted(self.injection_layers.items())},
            "directions": [direction.to_dict() for direction in self.directions],
        }


def check_patch_settings(config, settings: CircuitSettings) -> tuple[list[Level], list[str]]:
    """The checked levels and directions of ``settings`` (from the config alone: no weights)."""
    if settings.direction not in DIRECTION_CHOICES:
        raise G4VError(f"unknown direction {settings.direction!r}: use one of {', '.join(DIRECTION_CHOICES)}")
    check_new_tokens(settings.max_new_tokens)
    _check_length("the region", settings.region)
    directions = list(DIRECTIONS) if settings.direction == "both" else [settings.direction]
    return chosen_levels(describe_levels(config), settings.levels), directions


def chosen_levels(levels: list[Level], spec: str) -> list[Level]:
    """``"all"`` or comma-separated level names or indices -> those levels, in the model's order."""
    text = _check_length("the levels", spec).strip()
    if text.lower() == "all":
        return list(levels)
    picked: list[Level] = []
    for part in text.split(","):
        if not part.strip():
            raise G4VError(f"the levels {spec!r} have an empty entry: write names or indices separated by commas")
        level = find_level(levels, part)
        if level in picked:
            raise G4VError(f"level {level.name} is named twice in {spec!r}")
        picked.append(level)
    return sorted(picked, key=lambda level: level.index)


def region_tokens(spec: str, plan: TilingPlan) -> list[int] | None:
    """The image-token indices a region names on ``plan`` (picture A's), or None for all of them."""
    text = _check_length("the region", spec).strip().lower()
    count = plan.num_image_tokens
    if text == "all":
        return None
    kind, _, rest = text.partition(":")
    if kind == "tokens" and (match := re.fullmatch(rf"({_NUMBER})(?:-({_NUMBER}))?", rest.strip())):
        start, end = int(match[1]), int(match[2] or match[1])
        if start > end:
            raise G4VError(f"the token range {rest.strip()} is empty: its start is after its end")
        if end >= count:
            raise G4VError(f"image token {end} is out of range: these pictures have {count} image tokens (0-{count - 1})")
        return list(range(start, end + 1))
    if kind == "box" and re.fullmatch(rf"{_NUMBER}(?:,{_NUMBER}){{3}}", rest.replace(" ", "")):
        x0, y0, x1, y1 = (int(v) for v in rest.replace(" ", "").split(","))
        height, width = plan.image_size
        if not (x0 < x1 and y0 < y1):
            raise G4VError(f"the box {rest.strip()} is empty: write X0,Y0,X1,Y1 with X0 < X1 and Y0 < Y1")
        check_on_picture(f"the box {rest.strip()}", (x0, y0, x1, y1), width, height, "picture A")
        inside = [token.index for token in plan.tokens
                  if token.box[2] > token.box[0] and token.box[3] > token.box[1]
                  and x0 <= (token.box[0] + token.box[2]) / 2 < x1 and y0 <= (token.box[1] + token.box[3]) / 2 < y1]
        if not inside:
            raise G4VError(f"the box {rest.strip()} holds no image token's centre: make it larger")
        return inside
    raise G4VError(f"a region is written all, tokens:A-B or box:X0,Y0,X1,Y1 (pixels), got {spec!r}")


def _check_length(what: str, spec) -> str:
    text = str(spec)
    if len(text) > MAX_SPEC_CHARS:
        raise G4VError(f"{what} is {len(text)} characters long: at most {MAX_SPEC_CHARS}")
    return text


def same_layout(plan_a: TilingPlan, plan_b: TilingPlan) -> None:
    """Patching swaps image tokens one for one: token i must be the same place in both pictures."""
    layout = lambda plan: (plan.grid, plan.num_image_tokens, [(t.kind, t.row, t.col) for t in plan.tokens])  # noqa: E731
    if layout(plan_a) != layout(plan_b):
        words = lambda plan: f"tiles {across(plan.grid[1], plan.grid[0])} with {plan.num_image_tokens} image tokens"  # noqa: E731
        raise G4VError(f"pictures A and B do not share a token layout (A {words(plan_a)}, B {words(plan_b)}): "
                       "patching swaps image tokens one for one, so both need the same tiling grid and token count "
                       "(a picture of A's size always has it: an edited copy of A, say)")


def patch_levels(engine, image_a, image_b, prompt: str, settings: CircuitSettings | None = None,
                 progress=None) -> PatchingResult:
    """Picture A's prompt with each chosen level's features from picture B (and the reverse, as
    ``settings.direction`` asks), at ``settings.region``; every level at once as the bound.
    ``progress(fraction, text)`` is called after each run when given. Bad input raises
    :class:`G4VError`."""
    settings = settings or CircuitSettings()
    tell = progress or (lambda fraction, text: None)
    engine = require(engine, Instrumentable, "the circuits views")
    config, tokenizer = engine.model.config, engine.tokenizer
    levels, directions = check_patch_settings(config, settings)
    if image_a is None or image_b is None:
        raise G4VError("patching needs two images, A and B")
    pictures = {"A": open_image(image_a), "B": open_image(image_b)}
    plans = {name: plan_tiling((p.height, p.width), config) for name, p in pictures.items()}
    same_layout(plans["A"], plans["B"])
    rows = region_tokens(settings.region, plans["A"])
    tokens = settings.max_new_tokens
    inputs = {name: engine.prepare_inputs([Message("user", prompt, [p])], tokens) for name, p in pictures.items()}
    for name in pictures:
        image_positions(inputs[name], config, plans[name].num_image_tokens)
    total = 2 + len(directions) * (len(levels) + 1)
    done = 0

    def step(text: str) -> None:
        nonlocal done
        done += 1
        tell(done / total, text)

    with engine.adapter_scope(None) as model:
        features, own = {}, {}
        for name in pictures:
            features[name], logits = injected_features(model, inputs[name], use_cache=False, logits_to_keep=1)
            logprobs = next_token_logprobs(logits)
            ids = greedy_continuation(model, inputs[name], tokenizer, tokens) if tokens else []
            own[name] = (logprobs, ids)
            step(f"picture {name} as it is")
        index = None if rows is None else torch.tensor(rows, dtype=torch.long)
        results = []
        for direction in directions:
            receiver, donor = DIRECTIONS[direction]
            run = _Direction(engine, model, inputs[receiver], own[receiver][0], own[donor][0], tokens)
            patched = []
            every = describe_levels(config)
            for level in levels:
                if settings.complement:
                    patched.append(run.patched([other for other in every if other != level], features[donor], index,
                                               f"all but {level.name}"))
                    step(f"{receiver} with all of {donor}'s levels but {level.name}")
                else:
                    patched.append(run.patched([level], features[donor], index, level.name))
                    step(f"{receiver} with {donor}'s {level.name}")
            bound = run.patched(every, features[donor], index, "all levels")
            step(f"{receiver} with all of {donor}'s levels")
            decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
            results.append(PatchDirection(
                name=direction, receiver=receiver, donor=donor,
                receiver_token_id=run.receiver_id, receiver_token=tokenizer.decode([run.receiver_id]),
                donor_token_id=run.donor_id, donor_token=tokenizer.decode([run.donor_id]),
                logodds_receiver=run.clean_receiver, logodds_donor=run.clean_donor,
                receiver_continuation=decode(own[receiver][1]), donor_continuation=decode(own[donor][1]),
                levels=patched, all_levels=bound, donor_logprobs=own[donor][0]))
    return PatchingResult(
        prompt=prompt, grid=tuple(plans["A"].grid), num_image_tokens=plans["A"].num_image_tokens,
        region=settings.region, complement=bool(settings.complement),
        patched_tokens=list(range(plans["A"].num_image_tokens)) if rows is None else rows,
        injection_layers={level.llm_layer: level.name for level in describe_levels(config)},
        directions=results)


class _Direction:
    """The patched runs of one direction: the receiver's prompt, the log-odds of the donor's first
    answer token against the receiver's."""

    def __init__(self, engine, model, inputs: dict, receiver_logprobs: torch.Tensor,
                 donor_logprobs: torch.Tensor, tokens: int):
        self.engine, self.model, self.inputs, self.tokens = engine, model, inputs, tokens
        self.receiver_id = int(receiver_logprobs.argmax())
        self.donor_id = int(donor_logprobs.argmax())
        self.clean_receiver = self.logodds(receiver_logprobs)
        self.clean_donor = self.logodds(donor_logprobs)

    def logodds(self, logprobs: torch.Tensor) -> float:
        return float(logprobs[self.donor_id] - logprobs[self.receiver_id])

    def patched(self, levels: list[Level], donor: dict[int, torch.Tensor], rows: torch.Tensor | None,
                label: str) -> PatchedRun:
        tokenizer = self.engine.tokenizer
        with patched_features(self.model, {level.llm_layer: donor[level.llm_layer] for level in levels}, rows):
            with torch.inference_mode():
                logprobs = next_token_logprobs(self.model(**self.inputs, use_cache=False, logits_to_keep=1).logits)
            ids = greedy_continuation(self.model, self.inputs, tokenizer, self.tokens) if self.tokens else []
        logodds = self.logodds(logprobs)
        span = self.clean_donor - self.clean_receiver
        top = int(logprobs.argmax())
        return PatchedRun(
            label=label, levels=[level.name for level in levels], logodds=logodds,
            moved=None if self.donor_id == self.receiver_id else (logodds - self.clean_receiver) / span,
            top_token_id=top, top_token=tokenizer.decode([top]),
            continuation=tokenizer.decode(ids, skip_special_tokens=True), continuation_ids=ids, logprobs=logprobs)
