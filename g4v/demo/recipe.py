"""The settings of the demo model's two trainings, and their learning-rate schedule.

:class:`TrainSettings` is ``python -m g4v.demo train`` (:mod:`g4v.demo.loop`), :class:`AdapterSettings`
is ``python -m g4v.demo train-adapter`` (:mod:`g4v.demo.adapter_training`), :class:`DocumentsSettings`
is ``python -m g4v.demo train-documents`` (:mod:`g4v.demo.documents_training`), :class:`VisionLoraSettings`
is ``python -m g4v.demo build-vlora`` (:mod:`g4v.demo.vlora`). Each field is one
command-line flag (``--kebab-case``, help from the field's metadata: see
:mod:`g4v.settings.flags`), so a setting's name, type, default and help are written here
only. The defaults are the recipe of the bundled checkpoint and adapter: ``train`` with no options
rebuilds the bundled weights (a test checks the defaults against the settings stored beside them),
and every run records ``asdict(settings)`` in its provenance.
"""

import math
from dataclasses import dataclass, field


def _setting(default, help: str):
    """A settings field: its default and the help of its flag."""
    return field(default=default, metadata={"help": help})


@dataclass
class TrainSettings:
    """``python -m g4v.demo train``: every weight, from the seeded random initialisation."""

    steps: int = _setting(1050, "joint training steps")
    batch_size: int = _setting(8, "pictures per step")
    lr: float = _setting(5e-3, "peak learning rate")
    min_lr_ratio: float = _setting(0.05, "the cosine decay ends at lr times this")
    warmup_steps: int = _setting(50, "linear learning-rate warm-up steps")
    weight_decay: float = _setting(0.01, "AdamW weight decay (matrices only)")
    grad_clip: float = _setting(1.0, "gradient norm clipping")
    seed: int = _setting(0, "seed of the initialisation, the pictures and the conversations")
    threads: int = _setting(2, "torch CPU threads")
    #: Curriculum: the share of forced one-shape pictures falls linearly from this to 0 ...
    single_shape_start: float = _setting(0.5, "share of one-shape pictures at the start of the curriculum")
    #: ... over this fraction of the steps.
    curriculum_fraction: float = _setting(0.3, "fraction of the steps over which the one-shape share falls to 0")
    #: After the curriculum, the share of pictures forced to hold three shapes (the rest draw one to
    #: three evenly, so about half hold three); 0 = none. Binding ("What shape is red?") and counting
    #: fail only with several shapes, and a three-shape picture asks up to 7 questions per vision pass.
    three_shape_share: float = _setting(0.3, "after the curriculum, share of pictures forced to hold three shapes")
    max_turns: int = _setting(8, "questions per picture (vision pass)")
    #: In later turns, how often a shape's identity is asked as "What shape is red?" rather than
    #: "What colour is the star?" (naming a shape is the slowest answer to learn; the pointer's
    #: readout keeps colour learnt even when it is asked rarely).
    shape_share: float = _setting(0.9, "share of 'What shape is X?' among later turns' identity questions")
    #: Weight of the auxiliary dense loss (see :class:`g4v.demo.aids.FeatureProbe`); 0 turns it off.
    aux_weight: float = _setting(1.0, "weight of the dense probe loss")
    #: Predict each cell's place too (left/right/top/bottom of the object under it).
    aux_place: bool = _setting(True, "the probe also predicts each cell's place")
    #: Start from this trained checkpoint instead of the seeded random initialisation.
    init: str | None = _setting(None, "continue from this trained checkpoint (a second stage)")
    #: Multiply the language model's q_proj and k_proj weights by this before training. Granite's
    #: ``attention_multiplier`` (1/64 here, instead of 1/sqrt(head_dim) = 1/8) makes attention
    #: nearly uniform in a small freshly initialised model, so it can pool the picture but hardly
    #: pick one shape out of it; sqrt(8) on both restores standard attention logits.
    qk_scale: float = _setting(2.83, "multiply the LM's q/k projection weights by this first (sharper attention)")
    #: Weight of the attention-pointer loss (see :class:`g4v.demo.aids.AttentionPointer`); 0 turns it
    #: off. Finding a shape by its colour is the lookup learnt last, hence 2.
    pointer_weight: float = _setting(2.0, "weight of the attention-pointer loss (binding)")
    #: The language-model layer whose attention the pointer loss trains (head 0). The last one (9):
    #: the answer is read out right before the LM head (docs/demo-model.md compares layer 8).
    pointer_layer: int = _setting(9, "the language-model layer of the pointer (head 0)")
    #: Weight of the pointer's readout loss (see ``AttentionPointer.readout``); 0 turns it off.
    #: docs/demo-model.md ("Why the readout") has what it changed.
    readout_weight: float = _setting(1.0, "weight of the pointer's readout loss (what the pointed-at shape is)")
    #: A second pointer, for "What shape is red?" questions only, on (layer, head) of the language
    #: model; None = none. Those questions need the shape *found by its colour*, the reverse of
    #: the first pointer's main lookup, and one head shared by both learnt it least well.
    shape_pointer_layer: int | None = _setting(
        9, "a second pointer, for 'What shape is ...?' questions only, at this layer")
    shape_pointer_head: int = _setting(1, "the head of the second pointer")
    #: A pointer for "How many shapes?" on (layer, head), None = none: its attention is asked to
    #: spread evenly over every shape of the picture, so that what the head gathers holds one value
    #: per shape (no readout: there is no single shape to name). Needed once layer 9's head 1 points
    #: for shape questions: that head was what counted, and counting broke without this pointer.
    count_pointer_layer: int | None = _setting(
        8, "a pointer for 'How many shapes?', spread evenly over every shape, at this layer")
    count_pointer_head: int = _setting(1, "the head of the count pointer")
    #: "cpu" (the bundled checkpoint's recipe) or a torch device such as "cuda" (for trying settings).
    device: str = _setting("cpu", "torch device (the bundled recipe is cpu)")
    #: Every this many steps, print greedy accuracy per question type on ``eval_n`` validation
    #: pictures (:func:`g4v.demo.shapes.validation_set`, never the held-out ones); 0 = never.
    eval_every: int = _setting(0, "print validation accuracy every N steps (0: never)")
    eval_n: int = _setting(48, "validation pictures")
    #: Steps of vision-only warm-up before the joint training (0 = none; see
    #: :func:`g4v.demo.loop.warm_up_vision`).
    vision_warmup_steps: int = _setting(2200, "vision-only shape warm-up steps before the joint training (0: none)")
    vision_warmup_lr: float = _setting(3e-4, "learning rate of the vision-only warm-up")
    #: Learning rate of the vision tower in the joint training (None = ``lr``, like every weight).
    #: A from-scratch ViT needs a much lower rate than the rest (docs/demo-model.md).
    vision_lr: float | None = _setting(3e-4, "learning rate of the vision tower in the joint training")


@dataclass
class AdapterSettings:
    """``python -m g4v.demo train-adapter``: the French-colours LoRA on the trained checkpoint, with
    the same schedule (:func:`lr_at`)."""

    steps: int = _setting(800, "training steps")
    batch_size: int = _setting(8, "pictures per step")
    lr: float = _setting(6e-3, "peak learning rate")
    rank: int = _setting(8, "LoRA rank")
    alpha: int = _setting(16, "LoRA alpha")
    seed: int = _setting(0, "seed of the LoRA initialisation, the pictures and the conversations")
    threads: int = _setting(1, "torch CPU threads")
    warmup_steps: int = _setting(10, "linear learning-rate warm-up steps")
    min_lr_ratio: float = _setting(0.1, "the cosine decay ends at lr times this")
    max_turns: int = _setting(8, "questions per picture")


@dataclass
class VisionLoraSettings:
    """``python -m g4v.demo build-vlora``: the blind LoRA trained on the trained checkpoint, whose
    negation becomes the layout checkpoint's vision LoRA (:mod:`g4v.demo.vlora`)."""

    steps: int = _setting(40, "training steps of the blind LoRA")
    batch_size: int = _setting(8, "pictures per step")
    lr: float = _setting(6e-3, "peak learning rate")
    rank: int = _setting(16, "LoRA rank (the vision LoRA's)")
    alpha: int = _setting(16, "LoRA alpha (= rank: scaling 1, as the real vision LoRA's)")
    seed: int = _setting(35, "seed of the LoRA initialisation, the pictures, the conversations, the blind answers")
    threads: int = _setting(2, "torch CPU threads")
    warmup_steps: int = _setting(10, "linear learning-rate warm-up steps")
    min_lr_ratio: float = _setting(0.1, "the cosine decay ends at lr times this")
    max_turns: int = _setting(8, "questions per picture")


def lr_at(step: int, settings: TrainSettings) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at the last step."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return settings.lr * (settings.min_lr_ratio + (1 - settings.min_lr_ratio) * cosine)


@dataclass
class DocumentsSettings:
    """``python -m g4v.demo train-documents``: a document stage (issue 21); the defaults are the
    second stage's. Every weight, from the checkpoint ``init``, on a mix of chart-to-CSV, key-value
    extraction and the first stage's shape conversations (so those keep their accuracy), with
    :func:`lr_at`'s schedule."""

    init: str = _setting("assets/granite4-vision-tiny-trained",
                         "the checkpoint this stage continues from (the first stage's, or one this command wrote)")
    steps: int = _setting(1200, "training steps")
    batch_size: int = _setting(8, "pictures per step (all of one task and one canvas kind)")
    #: Chosen from two short trials (1e-3 and 3e-3; docs/demo-model.md, "How the second stage was found").
    lr: float = _setting(3e-3, "peak learning rate (language model and projectors)")
    #: The vision tower learnt slowly and easily forgets: as in the first stage, its own lower rate.
    vision_lr: float | None = _setting(1e-4, "learning rate of the vision tower (None: lr)")
    min_lr_ratio: float = _setting(0.05, "the cosine decay ends at lr times this")
    warmup_steps: int = _setting(30, "linear learning-rate warm-up steps")
    weight_decay: float = _setting(0.01, "AdamW weight decay (matrices only)")
    grad_clip: float = _setting(1.0, "gradient norm clipping")
    seed: int = _setting(0, "seed of the pictures, the charts, the task draws and the conversations")
    threads: int = _setting(2, "torch CPU threads")
    #: Each step is one task; these are the shares of chart and key-value steps, the rest are the
    #: first stage's shape conversations (up to 7 answers a picture), which keep the four question
    #: types from being forgotten.
    chart_share: float = _setting(0.5, "share of steps that train chart to CSV")
    kvp_share: float = _setting(0.2, "share of steps that train key-value extraction")
    three_shape_share: float = _setting(0.3, "share of shape pictures forced to hold three shapes")
    max_turns: int = _setting(8, "questions per picture in the shape conversations")
    shape_share: float = _setting(0.9, "share of 'What shape is X?' among later turns' identity questions")
    #: Weight of the attention-pointer loss (see :mod:`g4v.demo.documents_training`); 0 turns it off.
    pointer_weight: float = _setting(1.0, "weight of the attention-pointer loss (rows to bars, objects to shapes)")
    device: str = _setting("cpu", "torch device (the recipe is cpu)")
    eval_every: int = _setting(0, "print validation scores every N steps (0: never)")
    eval_n: int = _setting(32, "validation pictures and charts")
