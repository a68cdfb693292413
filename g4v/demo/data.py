"""The training examples of the demo model: conversations about one synthetic picture, rendered
and labelled exactly as the engines will see them.

Used by both trainings (:mod:`g4v.demo.loop`, :mod:`g4v.demo.adapter_training`); the pictures
themselves come from :mod:`g4v.demo.shapes`. Three choices make the examples worth their cost:

* **exactly the inference format**: each example is rendered by the chat template and expanded by the
  processor (one ``<image>`` placeholder per visual feature), so training sees what the engines see;
* **several answers per picture**: the first question (its type drawn uniformly) is the inference
  format; the conversation then asks every other question about the same picture (up to
  ``max_turns``), so one costly vision pass trains on up to 7 answers. Questions whose answer an
  earlier turn gives away are left out (:func:`conversation_plan`);
* **labels only on answers** (answer tokens plus the closing ``<|end_of_text|>``).
"""

import random

import torch

from g4v.demo import shapes as S


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
    """The conversation as the chat template writes it (the picture in the first user turn)."""
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


def data_settings() -> dict:
    """What the training pictures are, for the checkpoint's provenance (``g4v_build.json``)."""
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
