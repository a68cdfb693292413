"""Train the demo LoRA adapter on the trained checkpoint: ``python -m g4v.demo train-adapter``.

The adapter (PEFT format) targets the language model only and answers colour questions in French,
leaving every other answer as it was. It is trained on the same conversations as the base model
(:mod:`g4v.demo.data`) with French colour answers, the base frozen, on the CPU and deterministically
for a given seed and thread count; ``g4v_adapter.json`` records the command, settings, base
weights' SHA-256 and the adapter's SHA-256. The settings are :class:`g4v.demo.recipe.AdapterSettings`.
"""

import json
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from g4v.demo import shapes as S
from g4v.demo.data import conversation_turns, encode
from g4v.demo.progress import no_dropout, progress_bar, tick
from g4v.demo.recipe import AdapterSettings, TrainSettings, lr_at

#: LoRA targets: every projection of the language model's decoder layers, nothing in the vision side.
LORA_TARGET_REGEX = r"model\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"


def lora_config(rank: int, alpha: int):
    """The adapter's PEFT config: rank, alpha, no dropout or bias, the language model only."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none", target_modules=LORA_TARGET_REGEX)


def train_adapter(base_dir: Path, out: Path, settings: AdapterSettings, command: str, progress: bool = True) -> dict:
    """Train the French-colours LoRA on the checkpoint in ``base_dir``; writes a PEFT folder ``out``
    and returns what its ``g4v_adapter.json`` records."""
    started = time.time()
    model, losses = train_lora(base_dir, settings, S.french_answer, "adapter", "train-adapter", progress)
    return save_adapter(model, base_dir, Path(out), {
        "builder": command,
        "settings": asdict(settings),
        "started": started,
        "final_loss": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4),
    })


def train_lora(base_dir: Path, settings, answer, name: str, label: str, progress: bool = True):
    """A LoRA (``settings.rank``, ``settings.alpha``, :data:`LORA_TARGET_REGEX`) trained on the frozen
    checkpoint in ``base_dir`` to give ``answer(qa)`` to the shape conversations; pictures are seeded
    ``NAME:SEED:INDEX``. Returns the PEFT model and the loss of every step. Shared by the French
    adapter and the layout checkpoint's blind LoRA (:mod:`g4v.demo.vlora`)."""
    from peft import get_peft_model
    from transformers import AutoProcessor, Granite4VisionForConditionalGeneration

    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    processor = AutoProcessor.from_pretrained(base_dir)
    model = Granite4VisionForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(settings.seed)
    model = get_peft_model(model, lora_config(settings.rank, settings.alpha))
    model.train()
    no_dropout(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    sched = TrainSettings(steps=settings.steps, lr=settings.lr, warmup_steps=settings.warmup_steps,
                          min_lr_ratio=settings.min_lr_ratio)
    rng = random.Random(f"{name}-turns:{settings.seed}")
    bar = progress_bar(settings.steps, label) if progress else None
    losses, index = [], 0
    for step in range(settings.steps):
        pictures = [S.picture(f"{name}:{settings.seed}:{index + k}") for k in range(settings.batch_size)]
        index += settings.batch_size
        turns = [conversation_turns(p, rng, settings.max_turns, answer=answer) for p in pictures]
        batch = encode(processor, pictures, turns)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, sched)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.item())
        tick(bar, step, every=5, name="loss", values=losses, window=20)
    if bar is not None:
        bar.close()
    return model, losses


def save_adapter(model, base_dir: Path, out: Path, run: dict) -> dict:
    """Write the PEFT folder ``out`` (replacing it) and its ``g4v_adapter.json``: the training ``run``
    (command, settings, loss; the wall time counts from ``run["started"]`` to the saved weights),
    what the adapter does, and the SHA-256 of its base's weights and of its own."""
    from g4v.loading import sha256_file

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
        "builder": run["builder"],
        "base_model": Path(base_dir).name,
        "base_weights_sha256": json.loads((Path(base_dir) / "g4v_build.json").read_text()).get("weights_sha256"),
        "behaviour": "answers colour questions in French (" + ", ".join(f"{k}->{v}" for k, v in S.FRENCH.items())
        + "); every other answer unchanged",
        "targets": "language model only: " + LORA_TARGET_REGEX,
        "settings": run["settings"],
        "wall_time_s": round(time.time() - run["started"], 1),
        "final_loss": run["final_loss"],
        "weights_sha256": sha256_file(weights),
    }
    (out / "g4v_adapter.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info
