"""Real ``transformers.Trainer`` runs on the bundled checkpoint, for the training monitor's tests.

Each example is a prompt exactly as the engines prepare it (so the Deepstack inspector, run on a
saved checkpoint with the same picture and prompt, reads the same tokens), labelled on every text
token but the first (so the Trainer's loss, a sum over ``num_items_in_batch`` labels, is the
model's own mean). Dropout is off: the training forward then equals an inference forward.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch

from g4v.conversation import Message
from g4v.paths import BUNDLED_MODEL_DIR
from tests.conftest import make_image

PROMPTS = ("What colour is the shape?", "Where is the star?", "How many shapes?", "What shape is red?")
PICTURES = ((128, 128, 1), (200, 110, 2), (120, 230, 3), (140, 140, 4))


def examples(engine) -> list[tuple]:
    """``(picture, prompt, model inputs with labels)`` for each of :data:`PICTURES`."""
    made = []
    for (width, height, seed), prompt in zip(PICTURES, PROMPTS):
        picture = make_image(width, height, seed)
        inputs = dict(engine.prepare_inputs([Message("user", prompt, [picture])]))
        labels = inputs["input_ids"].clone()
        labels[labels == engine.model.config.image_token_index] = -100
        labels[:, 0] = -100
        inputs["labels"] = labels
        made.append((picture, prompt, inputs))
    return made


def without_dropout(model):
    """Every dropout off: the modules, and the attention dropout that the Q-Former's attention
    applies from its config in training mode (a float, not a module)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return model


def fresh_model(folder=BUNDLED_MODEL_DIR):
    from transformers import Granite4VisionForConditionalGeneration

    return without_dropout(Granite4VisionForConditionalGeneration.from_pretrained(folder, dtype=torch.float32))


class _Indices(torch.utils.data.Dataset):
    def __init__(self, count: int):
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        return {"index": index}


@dataclass
class TrainerRun:
    trainer: object
    folder: Path
    batches: list[int] = field(default_factory=list)  # example index of each step, in order


def make_trainer(model, items: list[tuple], folder: Path, steps: int, save: bool = True, tensorboard: bool = True,
                 lr: float = 1e-3) -> TrainerRun:
    """A Trainer over ``items`` (batch size 1) that saves every step's checkpoint when ``save``; the
    initial weights go to ``checkpoint-0`` so that step 1 has a checkpoint before it too."""
    from transformers import AutoProcessor, Trainer, TrainingArguments

    processor = AutoProcessor.from_pretrained(BUNDLED_MODEL_DIR)
    run = TrainerRun(None, folder)
    if save:
        model.save_pretrained(folder / "checkpoint-0")
        processor.save_pretrained(folder / "checkpoint-0")

    def collate(features):
        index = features[0]["index"]
        run.batches.append(index)
        return items[index][2]

    args = TrainingArguments(output_dir=str(folder), max_steps=steps, per_device_train_batch_size=1, learning_rate=lr,
                             lr_scheduler_type="constant", logging_steps=1, save_steps=1 if save else steps + 1,
                             save_strategy="steps" if save else "no", save_only_model=True, use_cpu=True,
                             report_to=["tensorboard"] if tensorboard else [], remove_unused_columns=False,
                             disable_tqdm=True, seed=0, max_grad_norm=1.0)
    run.trainer = Trainer(model=model, args=args, train_dataset=_Indices(len(items)), data_collator=collate,
                          processing_class=processor)
    return run


def hook_count(model) -> int:
    """Forward hooks on the model's modules (transformers keeps a few of its own: compare counts)."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
