"""Train the bundled tiny Granite 4 Vision from scratch on synthetic shapes, and its demo LoRA adapter.

``python -m g4v.demo train [--steps N] [--out DIR] [--seed S]`` starts from the same seeded random
initialisation as ``python -m g4v.demo build`` (same config, processor and tokenizer) and trains every
weight on pictures from :mod:`g4v.demo.shapes`, on the CPU, deterministically for a given seed, step
count and thread count. The result is saved in the hub layout (bf16) with a ``g4v_build.json`` that
records the command, seed, data settings, steps, wall time and the weights' SHA-256.

``python -m g4v.demo train-adapter`` trains an LM-only LoRA adapter (PEFT format) on the trained
checkpoint that answers colour questions in French and leaves every other answer as it was.

What makes the tiny model learn in 30 CPU minutes (each point was needed; docs/demo-model.md has
what failed without it):

* **exactly the inference format**: each example is rendered by the chat template and expanded by the
  processor (one ``<image>`` placeholder per visual feature), so training sees what the engines see;
* **several answers per picture**: the first question (its type drawn uniformly) is the inference
  format; the conversation then asks every other question about the same picture (up to
  ``max_turns``), so one costly vision pass trains on up to 7 answers. Questions whose answer an
  earlier turn gives away are left out (:func:`conversation_plan`);
* **labels only on answers** (answer tokens plus the closing ``<|end_of_text|>``);
* **a vision tower that tells shapes apart first** (:func:`warm_up_vision`): 2200 cheap steps on base
  views alone, training the tower to name each shape, then the joint training with the tower at
  its own, lower learning rate (``vision_lr``). At the shared learning rate the tiny ViT learns
  colour and place but never tells a star from a circle, and every question that names a shape
  needs that;
* **a dense signal on all 8 levels** (:class:`FeatureProbe`): throw-away linear probes on each
  projector's output must tell, for every base-view feature, the colour, shape and place of what lies
  under it. The vision tower and the 8 Q-Formers get gradients from 64 cells per picture instead of
  from a few answer tokens;
* **a pointer for binding** (:class:`AttentionPointer`): one attention head of a late language-model
  layer is asked to look, from each answer-predicting position, at the image tokens of the shape the
  question names. It teaches the lookup ("the star" -> the star's cells -> its colour) that the
  model otherwise does not find in this budget; and a linear **readout** of what that head gathers
  must name the pointed-at shape's colour, shape and place, so that what is found is also what is
  read (with the lookup alone, black and blue were mixed up at the third word piece);
* **a second pointer for the reverse lookup** ("What shape is red?" finds the shape by its colour):
  head 1 of the same layer, trained on those questions only, with its own readout; and, because
  that head was what counted, a **count pointer** (layer 8, head 1) whose attention spreads evenly
  over every shape for "How many shapes?";
* **more three-shape pictures** after the curriculum (``three_shape_share``): binding and counting
  only go wrong with several shapes, and such a picture asks up to 7 questions per vision pass;
* **sharper attention at the start** (``qk_scale``): Granite's ``attention_multiplier`` of 1/64
  keeps a fresh small model's attention almost uniform; the q/k weights are scaled once, at init;
* small canvases (mostly 1 tile + the base view), one canvas kind per batch (little padding), AdamW
  with warm-up and cosine decay, no dropout while training, and a short curriculum that starts with
  more one-shape pictures.

Probes and pointer are training aids only: the saved checkpoint is a plain Granite 4 Vision.
"""

import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from g4v.demo import shapes as S
from g4v.paths import ASSETS_DIR, TRAINED_MODEL_DIR

ADAPTER_NAME = "tiny-trained-french"
ADAPTER_DIR = ASSETS_DIR / "adapters" / ADAPTER_NAME
#: LoRA targets: every projection of the language model's decoder layers, nothing in the vision side.
LORA_TARGET_REGEX = r"model\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"


@dataclass
class TrainSettings:
    steps: int = 1050
    batch_size: int = 8
    lr: float = 5e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 2
    #: Curriculum: the share of forced one-shape pictures falls linearly from this to 0 ...
    single_shape_start: float = 0.5
    #: ... over this fraction of the steps.
    curriculum_fraction: float = 0.3
    #: After the curriculum, the share of pictures forced to hold three shapes (the rest draw one to
    #: three evenly, so about half hold three); 0 = none. Binding ("What shape is red?") and counting
    #: fail only with several shapes, and a three-shape picture asks up to 7 questions per vision pass.
    three_shape_share: float = 0.3
    max_turns: int = 8
    #: In later turns, how often a shape's identity is asked as "What shape is red?" rather than
    #: "What colour is the star?" (naming a shape is the slowest answer to learn; the readout keeps
    #: colour at 100% even when it is asked rarely).
    shape_share: float = 0.9
    #: Weight of the auxiliary dense loss (see :class:`FeatureProbe`); 0 turns it off.
    aux_weight: float = 1.0
    #: Predict each cell's place too (left/right/top/bottom of the object under it).
    aux_place: bool = True
    #: Start from this trained checkpoint instead of the seeded random initialisation.
    init: str | None = None
    #: Multiply the language model's q_proj and k_proj weights by this before training. Granite's
    #: ``attention_multiplier`` (1/64 here, instead of 1/sqrt(head_dim) = 1/8) makes attention
    #: nearly uniform in a small freshly initialised model, so it can pool the picture but hardly
    #: pick one shape out of it; sqrt(8) on both restores standard attention logits.
    qk_scale: float = 2.83
    #: Weight of the attention-pointer loss (see :class:`AttentionPointer`); 0 turns it off. Finding
    #: a shape by its colour is the lookup learnt last, hence 2.
    pointer_weight: float = 2.0
    #: The language-model layer whose attention the pointer loss trains (head 0). The last one (9):
    #: the answer is read out right before the LM head (8 gave 80.4% against 86.0% on 120 held-out
    #: pictures).
    pointer_layer: int = 9
    #: Weight of the pointer's readout loss (see ``AttentionPointer.readout``); 0 turns it off. With
    #: it, colour answers went from 85.0% to 100% on 120 held-out pictures.
    readout_weight: float = 1.0
    #: A second pointer, for "What shape is red?" questions only, on (layer, head) of the language
    #: model; None = none. Those questions need the shape *found by its colour*, the reverse of
    #: the first pointer's main lookup, and one head shared by both learnt it least well.
    shape_pointer_layer: int | None = 9
    shape_pointer_head: int = 1
    #: A pointer for "How many shapes?" on (layer, head), None = none: its attention is asked to
    #: spread evenly over every shape of the picture, so that what the head gathers holds one value
    #: per shape (no readout: there is no single shape to name). Needed once layer 9's head 1 points
    #: for shape questions: that head was what counted, and counting three shapes fell to 7 of 39.
    count_pointer_layer: int | None = 8
    count_pointer_head: int = 1
    #: "cpu" (the bundled checkpoint's recipe) or a torch device such as "cuda" (for trying settings).
    device: str = "cpu"
    #: Every this many steps, print greedy accuracy per question type on ``eval_n`` validation
    #: pictures (:func:`g4v.demo.shapes.validation_set`, never the held-out ones); 0 = never.
    eval_every: int = 0
    eval_n: int = 48
    #: Steps of vision-only warm-up before the joint training (0 = none; see :func:`warm_up_vision`).
    vision_warmup_steps: int = 2200
    vision_warmup_lr: float = 3e-4
    #: Learning rate of the vision tower in the joint training (None = ``lr``, like every weight).
    #: A from-scratch ViT learns shapes at 1e-4..3e-4 and not at all at 5e-3.
    vision_lr: float | None = 3e-4


def lr_at(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return settings.lr * (settings.min_lr_ratio + (1 - settings.min_lr_ratio) * cosine)


# ── examples ────────────────────────────────────────────────────────────────────────────────────


def conversation_plan(picture: S.Picture, rng: random.Random, max_turns: int = 4,
                      shape_share: float = 0.5) -> list[tuple[S.QA, int | None]]:
    """The questions about one picture, each with the index of the shape it is about (None for the
    count). The first turn is in the inference format, its question type drawn uniformly; later turns
    ask further questions about the same picture, none whose answer an earlier turn gives away (a
    shape's colour and the shape of that colour are one fact, so only one of the two is asked: the
    shape, with probability ``shape_share``)."""
    shapes = picture.shapes

    def ask(kind: str, index: int) -> tuple[S.QA, int | None]:
        return S.question(kind, shapes, index), (None if kind == "count" else index)

    def fact(kind: str, index: int) -> tuple:
        return {"colour": ("identity", index), "shape": ("identity", index),
                "position": ("place", index)}.get(kind, ("count",))

    first_kind = S.QUESTION_TYPES[rng.randrange(len(S.QUESTION_TYPES))]
    first_index = rng.randrange(len(shapes))
    asked = {fact(first_kind, first_index)}
    rest = []
    for index in range(len(shapes)):
        for kind in ("colour" if rng.random() < 1 - shape_share else "shape", "position"):
            if fact(kind, index) not in asked:
                rest.append(ask(kind, index))
    if ("count",) not in asked:
        rest.append(ask("count", 0))
    rng.shuffle(rest)
    return [ask(first_kind, first_index), *rest][:max_turns]


def conversation_turns(picture: S.Picture, rng: random.Random, max_turns: int = 4, answer=None,
                       shape_share: float = 0.5) -> list[tuple[str, str]]:
    """(question, answer) turns about one picture (see :func:`conversation_plan`)."""
    answer = answer or (lambda qa: qa.answer)
    return [(qa.question, answer(qa)) for qa, _ in conversation_plan(picture, rng, max_turns, shape_share)]


def render(processor, turns: list[tuple[str, str]]) -> str:
    messages = []
    for i, (question, reply) in enumerate(turns):
        content = ([{"type": "image"}] if i == 0 else []) + [{"type": "text", "text": question}]
        messages.append({"role": "user", "content": content})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
    return processor.apply_chat_template(messages, tokenize=False)


def answer_labels(input_ids: torch.Tensor, tokenizer) -> torch.Tensor:
    """Labels = input ids on assistant answers (content + closing end-of-text), -100 elsewhere."""
    start = tokenizer.convert_tokens_to_ids("<|start_of_role|>")
    end_role = tokenizer.convert_tokens_to_ids("<|end_of_role|>")
    eot = tokenizer.convert_tokens_to_ids("<|end_of_text|>")
    assistant = tokenizer.encode("assistant", add_special_tokens=False)
    labels = torch.full_like(input_ids, -100)
    for row in range(input_ids.shape[0]):
        ids = input_ids[row].tolist()
        i, n = 0, len(ids)
        while i < n:
            if ids[i] == start:
                j = i + 1
                while j < n and ids[j] != end_role:
                    j += 1
                role = ids[i + 1 : j]
                i = j + 1
                if role == assistant:
                    while i < n and ids[i] != eot:
                        labels[row, i] = ids[i]
                        i += 1
                    if i < n:
                        labels[row, i] = eot
            i += 1
    return labels


def encode(processor, pictures: list[S.Picture], turns: list[list[tuple[str, str]]]) -> dict:
    """A right-padded training batch (positions as in single-example inference)."""
    tokenizer = processor.tokenizer
    texts = [render(processor, t) for t in turns]
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "right"
    try:
        batch = processor(text=texts, images=[p.image for p in pictures], return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = old_side
    batch = dict(batch)
    batch["labels"] = answer_labels(batch["input_ids"], tokenizer)
    return batch


class FeatureProbe(torch.nn.Module):
    """Auxiliary training signal: forward hooks keep the 8 projectors' outputs (views x 64 x hidden);
    linear heads classify each base-view feature's colour and shape (background included)."""

    def __init__(self, model, place: bool = False):
        super().__init__()
        self.place = place
        inner = model.model
        self.projectors = list(inner.layerwise_projectors) + list(inner.spatial_projectors)
        hidden = model.config.text_config.hidden_size
        self.heads = torch.nn.ModuleList(
            [torch.nn.Linear(hidden, 1 + len(S.COLOURS) + 1 + len(S.SHAPES) + (1 + len(S.PLACES)) * place)
             for _ in self.projectors])
        self.outputs: list = [None] * len(self.projectors)
        #: Mean over levels of the share of object cells whose attributes the heads got right (last batch).
        self.accuracy: dict[str, float] = {}
        self.config = model.config
        self._handles = [proj.register_forward_hook(self._keeper(i)) for i, proj in enumerate(self.projectors)]
        weights = torch.ones(1 + max(len(S.COLOURS), len(S.SHAPES), len(S.PLACES)))
        weights[0] = 0.3  # background is most cells
        self.register_buffer("class_weights", weights, persistent=False)

    def _keeper(self, i):
        def hook(module, args, output):
            self.outputs[i] = output
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def loss(self, pictures: list[S.Picture], image_sizes: torch.Tensor) -> torch.Tensor:
        from transformers.models.granite4_vision.modeling_granite4_vision import image_size_to_num_patches

        counts = [image_size_to_num_patches(size, self.config.image_grid_pinpoints, self.config.vision_config.image_size)
                  for size in image_sizes.tolist()]
        base_views = torch.tensor([sum(counts[:i]) for i in range(len(counts))])
        labels = [S.feature_labels(p) for p in pictures]
        device = self.class_weights.device
        colour = torch.tensor([c for c, _, _ in labels], device=device).flatten()
        shape = torch.tensor([s for _, s, _ in labels], device=device).flatten()
        place = torch.tensor([p for _, _, p in labels], device=device).flatten()
        nc, ns = 1 + len(S.COLOURS), 1 + len(S.SHAPES)
        total = 0.0
        on_object = colour > 0
        right = {"colour": 0.0, "shape": 0.0, **({"place": 0.0} if self.place else {})}
        for head, out in zip(self.heads, self.outputs):
            logits = head(out[base_views]).flatten(0, 1)  # (images * 64, classes)
            with torch.no_grad():  # how well each level tells the object cells' attributes (a diagnostic)
                for name, cols, target in (("colour", slice(0, nc), colour), ("shape", slice(nc, nc + ns), shape),
                                           ("place", slice(nc + ns, None), place)):
                    if name in right:
                        hits = logits[on_object, cols].argmax(-1) == target[on_object]
                        right[name] += hits.float().mean().item() / len(self.heads)
            total = total + torch.nn.functional.cross_entropy(logits[:, :nc], colour, weight=self.class_weights[:nc])
            total = total + torch.nn.functional.cross_entropy(logits[:, nc : nc + ns], shape,
                                                              weight=self.class_weights[:ns])
            if self.place:
                total = total + torch.nn.functional.cross_entropy(logits[:, nc + ns :], place,
                                                                  weight=self.class_weights[: 1 + len(S.PLACES)])
        self.outputs = [None] * len(self.projectors)
        self.accuracy = right
        return total / len(self.heads)


def answer_spans(labels: torch.Tensor) -> list[range]:
    """The [start, stop) token ranges of the labelled answers (word pieces plus closing end-of-text)."""
    answered = (labels != -100).tolist()
    spans, start = [], None
    for i, on in enumerate(answered + [False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            spans.append(range(start, i))
            start = None
    return spans


class AttentionPointer:
    """Auxiliary training signal for *binding*: at one language-model layer, one attention head of
    the token that predicts an answer should look at the image tokens of the shape the question
    names ("What colour is the star?" -> the star's cells, in the base view and in the tiles).

    Without it the tiny model learns what pooling the whole picture gives (how many shapes, the
    colour when there is one shape) and stalls there: finding one shape among a few hundred image
    tokens from a word several tokens back is a search with almost no gradient until attention is
    already sharp. A forward pre-hook keeps the layer's normalised input and rotary embeddings; the
    loss recomputes that head's attention logits for the answer-predicting positions only and asks
    for probability mass on the named shape's tokens (which tokens: :func:`g4v.tiling.plan_tiling`,
    the same token map the Tiling panel draws)."""

    def __init__(self, model, layer: int, head: int = 0, min_cover: float = 0.3, readout: bool = False,
                 kinds: frozenset[str] | None = None):
        self.attention = model.model.language_model.layers[layer].self_attn
        self.head = head
        #: With ``readout``, a throw-away linear head on what the pointer head gathers (its attention
        #: output, before ``o_proj``) names the colour, shape and place of the shape pointed at. Finding
        #: the right shape is not enough if the values read there do not say what it is.
        self.readout = (torch.nn.Linear(self.attention.head_dim, len(S.COLOURS) + len(S.SHAPES) + len(S.PLACES),
                                        device=self.attention.q_proj.weight.device) if readout else None)
        self.min_cover = min_cover
        #: Question kinds (see :data:`g4v.demo.shapes.QUESTION_TYPES`) this pointer trains on; None = all.
        self.kinds = kinds
        self.config = model.config
        self.image_token = model.config.image_token_index
        self._handle = self.attention.register_forward_pre_hook(self._keep, with_kwargs=True)
        self._inputs = None

    def _keep(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        self._inputs = (hidden, kwargs["position_embeddings"])

    def remove(self) -> None:
        self._handle.remove()

    def shape_tokens(self, picture: S.Picture) -> list[list[int]]:
        """For each shape, the indices (in packing order) of the base/tile image tokens it covers."""
        import numpy as np

        from g4v.tiling import plan_tiling

        mask = np.asarray(picture.mask)
        plan = plan_tiling((picture.size[1], picture.size[0]), self.config)
        covered = [[] for _ in picture.shapes]
        for token in plan.tokens:
            left, top, right, bottom = (int(round(v)) for v in token.box)
            if token.kind == "newline" or right <= left or bottom <= top:
                continue
            cell = mask[top:bottom, left:right]
            for index in range(len(picture.shapes)):
                if (cell == index + 1).mean() >= self.min_cover:
                    covered[index].append(token.index)
        return covered

    def losses(self, batch: dict, pictures: list[S.Picture],
               plans: list[list[tuple[S.QA, int | None]]]) -> dict[str, torch.Tensor]:
        """``pointer``: minus the log attention mass on the named shape's tokens, averaged over the
        answer-predicting positions; ``readout`` (with a readout head): cross-entropy of its colour,
        shape and place predictions."""
        from transformers.models.granite4_vision.modeling_granite4_vision import apply_rotary_pos_emb

        hidden, (cos, sin) = self._inputs
        self._inputs = None
        attention = self.attention
        head_dim = attention.head_dim
        group = attention.num_key_value_groups
        rows, queries, targets, named = [], [], [], []
        for row, (picture, plan) in enumerate(zip(pictures, plans)):
            image_positions = (batch["input_ids"][row] == self.image_token).nonzero().flatten()
            per_shape = self.shape_tokens(picture)
            for (qa, shape_index), answer in zip(plan, answer_spans(batch["labels"][row])):
                if self.kinds is not None and qa.kind not in self.kinds:
                    continue
                if shape_index is not None and per_shape[shape_index]:
                    shape_targets = [image_positions[per_shape[shape_index]]]
                    shape = picture.shapes[shape_index]
                elif qa.kind == "count" and self.kinds is not None:  # spread over every shape
                    shape_targets = [image_positions[tokens] for tokens in per_shape if tokens]
                    shape = None
                else:
                    continue
                if not shape_targets:
                    continue
                # Every position that predicts a word piece of the answer ("b" "l" "ue": blue or black is
                # only decided at the third piece) looks at the shape itself, not at the position before.
                for position in range(answer.start - 1, answer.stop - 2):
                    rows.append(row)
                    queries.append(position)
                    targets.append(shape_targets)
                    named.append(shape)
        if not rows:
            zero = hidden.new_zeros(())
            return {"pointer": zero, **({"readout": zero} if self.readout is not None else {})}
        batch_size, length, _ = hidden.shape
        query = attention.q_proj(hidden).view(batch_size, length, -1, head_dim).transpose(1, 2)
        key = attention.k_proj(hidden).view(batch_size, length, -1, head_dim).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        total, gathered = hidden.new_zeros(()), []
        for row, position, shape_targets in zip(rows, queries, targets):
            q = query[row, self.head, position]  # (head_dim,)
            k = key[row, self.head // group, : position + 1]  # (position + 1, head_dim): causal
            log_attention = torch.log_softmax((k @ q) * attention.scaling, dim=-1)
            # One shape: minus the log mass on it. Several (count questions): the mean of that over
            # the shapes, which is smallest when the mass is all on shapes and spread evenly.
            total = total - sum(torch.logsumexp(log_attention[t], dim=-1) for t in shape_targets) / len(shape_targets)
            gathered.append(log_attention)
        losses = {"pointer": total / len(rows)}
        if self.readout is not None:
            pointed = [i for i, shape in enumerate(named) if shape is not None]
            losses["readout"] = (self._readout_loss(hidden, [rows[i] for i in pointed], [gathered[i] for i in pointed],
                                                    [named[i] for i in pointed])
                                 if pointed else hidden.new_zeros(()))
        return losses

    def _readout_loss(self, hidden: torch.Tensor, rows: list[int], log_attentions: list[torch.Tensor],
                      named: list[S.Shape]) -> torch.Tensor:
        batch_size, length, _ = hidden.shape
        value = self.attention.v_proj(hidden).view(batch_size, length, -1, self.attention.head_dim).transpose(1, 2)
        kv_head = self.head // self.attention.num_key_value_groups
        outputs = torch.stack([log_attention.exp() @ value[row, kv_head, : len(log_attention)]
                               for row, log_attention in zip(rows, log_attentions)])  # (queries, head_dim)
        logits = self.readout(outputs)
        device = logits.device
        colours, shapes = len(S.COLOURS), len(S.SHAPES)
        colour, kind, place = torch.tensor([S.class_indices(s) for s in named], device=device).unbind(-1)
        cross_entropy = torch.nn.functional.cross_entropy
        return (cross_entropy(logits[:, :colours], colour) + cross_entropy(logits[:, colours:colours + shapes], kind)
                + cross_entropy(logits[:, colours + shapes:], place)) / 3


def make_pointers(model, settings: TrainSettings) -> list[AttentionPointer]:
    """The attention pointers the settings ask for: none (``pointer_weight`` 0), the pointer for
    every question that names a shape, and optionally a second one for shape questions only."""
    if settings.pointer_weight <= 0:
        return []
    readout = settings.readout_weight > 0
    pointers = [AttentionPointer(model, settings.pointer_layer, readout=readout)]
    if settings.shape_pointer_layer is not None:
        pointers.append(AttentionPointer(model, settings.shape_pointer_layer, head=settings.shape_pointer_head,
                                         readout=readout, kinds=frozenset({"shape"})))
    if settings.count_pointer_layer is not None:
        pointers.append(AttentionPointer(model, settings.count_pointer_layer, head=settings.count_pointer_head,
                                         kinds=frozenset({"count"})))
    return pointers


def parameter_groups(named: list, settings: TrainSettings) -> list[dict]:
    """AdamW groups: weight decay on matrices only; with ``vision_lr``, the vision tower apart (its
    ``lr_scale`` is vision_lr / lr, applied on top of the schedule)."""
    def is_matrix(name, param):
        return param.ndim >= 2 and "embed" not in name

    if settings.vision_lr is None:
        return [{"params": [p for n, p in named if is_matrix(n, p)], "weight_decay": settings.weight_decay},
                {"params": [p for n, p in named if not is_matrix(n, p)], "weight_decay": 0.0}]
    groups = []
    for vision, scale in ((False, 1.0), (True, settings.vision_lr / settings.lr)):
        part = [(n, p) for n, p in named if ("vision_tower" in n) == vision]
        groups += [{"params": [p for n, p in part if is_matrix(n, p)], "weight_decay": settings.weight_decay,
                    "lr_scale": scale},
                   {"params": [p for n, p in part if not is_matrix(n, p)], "weight_decay": 0.0, "lr_scale": scale}]
    return groups


def object_shape_logits(model, head: torch.nn.Linear, pictures: list[S.Picture], pixel_values: torch.Tensor):
    """Shape logits of every shape in the pictures' base views: the vision tower's last hidden state
    averaged over the patches the shape covers, through ``head``. Returns (logits, shape labels)."""
    from PIL import Image

    vision = model.model.vision_tower
    side = model.config.vision_config.image_size // model.config.vision_config.patch_size
    hidden = vision(pixel_values=pixel_values[:, 0]).last_hidden_state  # (pictures, side * side, hidden)
    pooled, labels = [], []
    for row, picture in enumerate(pictures):
        patches = torch.tensor(list(picture.mask.resize((side, side), Image.NEAREST).getdata()),
                               device=hidden.device)
        for index, shape in enumerate(picture.shapes):
            under = patches == index + 1
            if under.any():
                pooled.append(hidden[row][under].mean(0))
                labels.append(S.SHAPES.index(shape.kind))
    return head(torch.stack(pooled)), torch.tensor(labels, device=hidden.device)


def warm_up_vision(model, processor, settings: TrainSettings, progress: bool = True) -> list[float]:
    """Vision-only warm-up: train the vision tower alone to name each shape of a picture's base view
    (:func:`object_shape_logits`). Why: in the joint training the tiny ViT learns colour and place
    but hardly tells a star from a circle, and every question that names a shape needs that. On
    base views only, a step costs about a tenth of a joint step, and at a ViT-friendly learning
    rate (3e-4) it names 94-97% of shapes after 1600-2200 steps (docs/demo-model.md). Returns the
    per-step accuracies (on new pictures each step)."""
    head = torch.nn.Linear(model.config.vision_config.hidden_size, len(S.SHAPES)).to(settings.device)
    params = list(model.model.vision_tower.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=settings.vision_warmup_lr, betas=(0.9, 0.98))
    rng = random.Random(f"vision:{settings.seed}")
    bar = _progress(settings.vision_warmup_steps, "vision warm-up") if progress else None
    accuracies = []
    for step in range(settings.vision_warmup_steps):
        canvas = S.canvas_kind(rng)
        pictures = [S.picture(f"vision:{settings.seed}:{step}:{k}", canvas=canvas) for k in range(settings.batch_size)]
        pixel_values = processor.image_processor([p.image for p in pictures], return_tensors="pt")["pixel_values"]
        logits, labels = object_shape_logits(model, head, pictures, pixel_values.to(settings.device))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        accuracies.append((logits.argmax(-1) == labels).float().mean().item())
        if bar is not None:
            bar.update(1)
            if step % 25 == 0:
                bar.set_postfix(shape_acc=f"{sum(accuracies[-50:]) / len(accuracies[-50:]):.2f}")
    if bar is not None:
        bar.close()
    return accuracies


def validation_accuracy(model, processor, n: int) -> dict[str, float]:
    """Greedy first-turn accuracy per question type on ``n`` validation pictures (model left in train mode)."""
    from g4v.demo.evaluate import accuracy, batched_answers, items

    pairs = items(S.validation_set(n))
    model.eval()
    try:
        return accuracy(pairs, batched_answers(model, processor, pairs, batch_size=32))
    finally:
        model.train()


def _no_dropout(model) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _progress(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, mininterval=2.0)


# ── base model ──────────────────────────────────────────────────────────────────────────────────


def train_model(settings: TrainSettings, progress: bool = True, log_every: int = 25):
    """Train from the seeded random initialisation; returns (model, processor, stats)."""
    from g4v.demo.build import build_processor, build_random_model

    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True, warn_only=settings.device != "cpu")
    processor = build_processor()
    if settings.init:
        from transformers import Granite4VisionForConditionalGeneration

        model = Granite4VisionForConditionalGeneration.from_pretrained(settings.init, dtype=torch.float32)
    else:
        model = build_random_model(processor)  # the same init as the random bundled checkpoint
    if settings.qk_scale != 1.0:
        with torch.no_grad():
            for layer in model.model.language_model.layers:
                layer.self_attn.q_proj.weight.mul_(settings.qk_scale)
                layer.self_attn.k_proj.weight.mul_(settings.qk_scale)
    torch.manual_seed(settings.seed)
    model.to(settings.device)
    model.train()
    _no_dropout(model)
    probe = FeatureProbe(model, place=settings.aux_place).to(settings.device) if settings.aux_weight > 0 else None
    pointers = make_pointers(model, settings)
    warmup_started, warmup_accuracy = time.time(), []
    if settings.vision_warmup_steps:
        warmup_accuracy = warm_up_vision(model, processor, settings, progress=progress)
    warmup_time = time.time() - warmup_started
    named = list(model.named_parameters()) + (list(probe.named_parameters()) if probe else [])
    for number, pointer in enumerate(pointers):
        if pointer.readout is not None:
            named += list(pointer.readout.named_parameters(prefix=f"readout{number}"))
    optimizer = torch.optim.AdamW(parameter_groups(named, settings), lr=settings.lr, betas=(0.9, 0.98), eps=1e-8)
    rng = random.Random(f"turns:{settings.seed}")
    bar = _progress(settings.steps, "train") if progress else None
    started = time.time()
    losses, aux_losses, pointer_losses, readout_losses, curve, index = [], [], [], [], [], 0
    for step in range(settings.steps):
        ramp = settings.curriculum_fraction * settings.steps
        single_p = settings.single_shape_start * max(0.0, 1 - step / ramp) if ramp > 0 else 0.0
        three_p = settings.three_shape_share if settings.three_shape_share > 0 and not single_p else None
        canvas = S.canvas_kind(rng)
        pictures = []
        for _ in range(settings.batch_size):
            pictures.append(S.train_picture(settings.seed, index, single_shape_p=single_p or None, canvas=canvas,
                                            max_shapes_p=three_p))
            index += 1
        plans = [conversation_plan(p, rng, settings.max_turns, settings.shape_share) for p in pictures]
        turns = [[(qa.question, qa.answer) for qa, _ in plan] for plan in plans]
        batch = {k: v.to(settings.device) for k, v in encode(processor, pictures, turns).items()}
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, settings) * group.get("lr_scale", 1.0)
        loss = model(**batch).loss
        losses.append(loss.item())
        if probe is not None:
            aux = probe.loss(pictures, batch["image_sizes"])
            aux_losses.append(aux.item())
            loss = loss + settings.aux_weight * aux
        if pointers:
            pointing = [pointer.losses(batch, pictures, plans) for pointer in pointers]
            pointer_loss = sum(p["pointer"] for p in pointing)
            pointer_losses.append(pointer_loss.item())
            loss = loss + settings.pointer_weight * pointer_loss
            if pointers[0].readout is not None:
                readout_loss = sum(p["readout"] for p in pointing if "readout" in p)
                readout_losses.append(readout_loss.item())
                loss = loss + settings.readout_weight * readout_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]],
                                       settings.grad_clip)
        optimizer.step()
        if bar is not None:
            bar.update(1)
            if step % 5 == 0:
                postfix = {"loss": f"{sum(losses[-20:]) / len(losses[-20:]):.3f}"}
                if aux_losses:
                    postfix["aux"] = f"{sum(aux_losses[-20:]) / len(aux_losses[-20:]):.3f}"
                bar.set_postfix(postfix)
        if log_every and (step + 1) % log_every == 0:
            aux_text = f" aux {sum(aux_losses[-log_every:]) / log_every:.4f}" if aux_losses else ""
            if pointer_losses:
                aux_text += f" pointer {sum(pointer_losses[-log_every:]) / log_every:.4f}"
            if readout_losses:
                aux_text += f" readout {sum(readout_losses[-log_every:]) / log_every:.4f}"
            if probe is not None:
                aux_text += " probe " + " ".join(f"{k} {100 * v:.0f}%" for k, v in probe.accuracy.items())
            print(f"step {step + 1}/{settings.steps} loss {sum(losses[-log_every:]) / log_every:.4f}{aux_text}"
                  f" elapsed {time.time() - started:.0f}s", flush=True)
        if settings.eval_every and ((step + 1) % settings.eval_every == 0 or step + 1 == settings.steps):
            curve.append({"step": step + 1, **validation_accuracy(model, processor, settings.eval_n)})
            print(f"step {step + 1} validation " + " ".join(f"{k} {100 * v:.0f}%" for k, v in curve[-1].items()
                                                             if k != "step"), flush=True)
    if bar is not None:
        bar.close()
    if probe is not None:
        probe.remove()
    for pointer in pointers:
        pointer.remove()
    model.eval()
    model.to("cpu")
    stats = {
        "wall_time_s": round(time.time() - started + warmup_time, 1),
        "final_loss": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4),
        "final_aux_loss": round(sum(aux_losses[-20:]) / max(1, len(aux_losses[-20:])), 4),
        "pictures_seen": index,
    }
    if curve:
        stats["validation_curve"] = curve
    if warmup_accuracy:
        last = warmup_accuracy[-50:]
        stats["vision_warmup"] = {"wall_time_s": round(warmup_time, 1),
                                  "final_shape_accuracy": round(sum(last) / len(last), 4)}
    return model, processor, stats


def data_settings() -> dict:
    return {
        "generator": "g4v.demo.shapes",
        "colours": list(S.COLOURS),
        "shapes": list(S.SHAPES),
        "places": list(S.PLACES),
        "shape_radius": list(S.SHAPE_RADIUS),
        "shapes_per_picture": [1, 3],
        "train_pictures": "train_picture(seed, index) for index = 0, 1, ... (string seeds 'train:SEED:INDEX')",
        "held_out": f"eval_set(n) with integer seeds {S.EVAL_SEED} * 10_000_000 + i",
        "canvas": {"kinds": dict(S.CANVASES), "square": "88-128 px (1 tile)", "wide": "190-250 x 100-128 (1x2)", "tall": "100-128 x 190-250 (2x1)", "large": "200-256 px (2x2 or 3 tiles)", "one kind per batch": True},
    }


def train(out: Path, settings: TrainSettings, command: str, progress: bool = True) -> str:
    import json

    from g4v.demo.build import build_processor, save_checkpoint

    init = None
    if settings.init:  # read before training: ``out`` may replace it
        init = json.loads((Path(settings.init) / "g4v_build.json").read_text())
    model, processor, stats = train_model(settings, progress=progress)
    provenance = {
        "builder": command,
        "weights": "trained on synthetic shapes (g4v.demo.shapes), from the seeded random init of `python -m g4v.demo build`",
        "seed": settings.seed,
        "settings": asdict(settings),
        "data": data_settings(),
        "torch": torch.__version__,
        **stats,
    }
    if init is not None:
        provenance["init"] = init  # the earlier stage's own provenance (command, settings, sha256)
        provenance["weights"] = "trained on synthetic shapes (g4v.demo.shapes), continuing from the checkpoint in 'init'"
        provenance["total_wall_time_s"] = round(stats["wall_time_s"] + init.get("total_wall_time_s", init.get("wall_time_s", 0)), 1)
    # A fresh processor: any padded call (training batches, validation) leaves padding switched on
    # in the fast tokenizer's backend, and save_pretrained would write that into tokenizer.json.
    sha = save_checkpoint(model, build_processor(), Path(out), provenance)
    _drop_subconfig_dtypes(Path(out) / "config.json")
    return sha


def _drop_subconfig_dtypes(path: Path) -> None:
    """A model loaded with ``from_pretrained`` (``--init``) writes ``"dtype": "float32"`` into each
    sub-config; the random build writes none. Drop them so config.json stays byte-identical."""
    import json

    config = json.loads(path.read_text())
    for key in ("text_config", "vision_config", "qformer_config"):
        if isinstance(config.get(key), dict):
            config[key].pop("dtype", None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# ── adapter ─────────────────────────────────────────────────────────────────────────────────────


@dataclass
class AdapterSettings:
    steps: int = 800
    batch_size: int = 8
    lr: float = 6e-3
    rank: int = 8
    alpha: int = 16
    seed: int = 0
    threads: int = 1
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    max_turns: int = 8


def lora_config(rank: int, alpha: int):
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none", target_modules=LORA_TARGET_REGEX)


def train_adapter(base_dir: Path, out: Path, settings: AdapterSettings, command: str, progress: bool = True) -> dict:
    """Train the French-colours LoRA on the checkpoint in ``base_dir``; writes a PEFT folder ``out``."""
    import json
    import shutil

    from peft import get_peft_model
    from transformers import AutoProcessor, Granite4VisionForConditionalGeneration

    from g4v.demo.build import sha256_file

    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    processor = AutoProcessor.from_pretrained(base_dir)
    model = Granite4VisionForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(settings.seed)
    model = get_peft_model(model, lora_config(settings.rank, settings.alpha))
    model.train()
    _no_dropout(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    sched = TrainSettings(steps=settings.steps, lr=settings.lr, warmup_steps=settings.warmup_steps,
                          min_lr_ratio=settings.min_lr_ratio)
    rng = random.Random(f"adapter-turns:{settings.seed}")
    bar = _progress(settings.steps, "train-adapter") if progress else None
    started, losses, index = time.time(), [], 0
    for step in range(settings.steps):
        pictures = [S.picture(f"adapter:{settings.seed}:{index + k}") for k in range(settings.batch_size)]
        index += settings.batch_size
        turns = [conversation_turns(p, rng, settings.max_turns, answer=S.french_answer) for p in pictures]
        batch = encode(processor, pictures, turns)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, sched)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            if step % 5 == 0:
                bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    if bar is not None:
        bar.close()
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)  # PEFT's generated model card
    # Point base_model_name_or_path at the bundled folder (relative to the repository), not at this
    # machine's absolute path.
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = f"assets/{Path(base_dir).name}"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = out / "adapter_model.safetensors"
    info = {
        "builder": command,
        "base_model": Path(base_dir).name,
        "base_weights_sha256": json.loads((Path(base_dir) / "g4v_build.json").read_text()).get("weights_sha256"),
        "behaviour": "answers colour questions in French (" + ", ".join(f"{k}->{v}" for k, v in S.FRENCH.items())
        + "); every other answer unchanged",
        "targets": "language model only: " + LORA_TARGET_REGEX,
        "settings": asdict(settings),
        "wall_time_s": round(time.time() - started, 1),
        "final_loss": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4),
        "weights_sha256": sha256_file(weights),
    }
    (out / "g4v_adapter.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info
