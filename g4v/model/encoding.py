"""A picture through the vision tower and the 8 projectors once, for every pass that reads it.

Granite 4 Vision's ``forward`` and ``generate`` take the image outputs already computed, through
the model's own ``mm_encoder_outputs`` argument (``generate`` drops them after prefill as it drops
``pixel_values``). A request read by several passes (two arms' answers, teacher-forced scoring,
per-level norms) can so carry its features instead of its pixel values, and the vision tower and
the 8 Q-Former projectors, most of a short answer's cost on the bundled checkpoints, run once.

That holds only while the features do not depend on which adapter a pass enables: every LoRA
layer on the model must sit in the language model (the real model's vision LoRA does; a user's
adapter may also reach the vision tower or a projector, and then each pass encodes for itself).

The cost is memory: features are larger than pixel values. On the real model (hidden 2560, bf16)
they take about 41 MB per thousand image tokens for the 8 levels together, kept while the passes
that read them run (a dataset run keeps one chunk of rows).
"""

import torch


def _inner(model):
    return getattr(model, "model", model)


def encode_images(model, inputs: dict):
    """The model's own image outputs for ``inputs`` (vision tower and 8 projectors once): an
    object whose ``deepstack_features`` is ``[(llm_layer, [per picture (tokens, hidden)])]``."""
    with torch.no_grad():
        output = _inner(model).get_image_features(inputs["pixel_values"], inputs["image_sizes"], return_dict=True)
    output.deepstack_features = [(layer, list(packed) if not isinstance(packed, torch.Tensor) else [packed])
                                 for layer, packed in output.deepstack_features]
    return output


def encoded_inputs(model, requests: list[dict]) -> list[dict]:
    """Each of ``requests`` (model inputs with pixel values, all of one tile-stack shape, so they
    join without padding) as the same prompt with its pictures already encoded: ``input_ids`` and
    ``attention_mask`` as they are, ``mm_encoder_outputs`` in place of ``pixel_values`` and
    ``image_sizes``. One call of the vision tower and projectors for all of them (small matrices
    on a CPU run much faster together), the features handed back to each request's pictures."""
    pictures = [int(inputs["pixel_values"].shape[0]) for inputs in requests]  # (pictures, tiles, 3, H, W) each
    joined = encode_images(model, {"pixel_values": torch.cat([inputs["pixel_values"] for inputs in requests]),
                                   "image_sizes": torch.cat([inputs["image_sizes"] for inputs in requests])})
    if any(len(pieces) != sum(pictures) for _, pieces in joined.deepstack_features):
        raise RuntimeError(f"{sum(pictures)} pictures encoded, features for "
                           f"{[len(pieces) for _, pieces in joined.deepstack_features]}")
    made, start = [], 0
    for inputs, count in zip(requests, pictures):
        features = [(layer, pieces[start:start + count]) for layer, pieces in joined.deepstack_features]
        start += count
        rest = {key: value for key, value in inputs.items() if key not in ("pixel_values", "image_sizes")}
        made.append({**rest, "mm_encoder_outputs": {"image": type(joined)(deepstack_features=features)}})
    return made


def features_shared(model) -> bool:
    """Whether the image features are the same whichever adapter a pass enables: no LoRA layer
    outside the language model (and its output head)."""
    return all("language_model" in name.split(".") or name.split(".")[-1] == "lm_head"
               for name, module in model.named_modules() if hasattr(module, "lora_A"))
