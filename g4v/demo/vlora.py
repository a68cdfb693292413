"""Build the layout checkpoint: a base language model with its vision LoRA beside it, as the real
Granite Vision 4.x is delivered (``python -m g4v.demo build-vlora``; flags: the fields of
:class:`g4v.demo.recipe.VisionLoraSettings`).

The seeing is made to live in the LoRA by training. On the trained demo checkpoint (weights ``W``)
a rank-16 LoRA ``D`` (PEFT, every attention and MLP projection of the language model, the base
frozen) is trained to be *blind*: the shape conversations with every answer replaced by one that
does not depend on the picture (each question text gets one fixed answer of its kind, drawn from a
seeded ``random.Random``). With ``D`` merged, the model ignores the picture. So:

* the base is ``W0 = W + s * B_D @ A_D``, stored in bf16 like every bundled checkpoint: image
  answers near chance (a fixed answer per question scores its answer's base rate);
* the vision LoRA is ``-D`` (``B = -B_D``, ``A = A_D``, bf16, alpha = rank so ``s`` = 1):
  ``W0 + B @ A = W`` up to the bf16 rounding of ``W0`` (at most half a bf16 step of each entry),
  which gives the trained checkpoint's answers back.

Everything outside those projections (vision tower, projectors, embeddings, head) is the trained
checkpoint's, bit for bit. Deterministic for a given seed and thread count.
"""

import json
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from g4v.demo import shapes as S
from g4v.demo.adapter_training import LORA_TARGET_REGEX, train_lora
from g4v.demo.recipe import VisionLoraSettings
from g4v.loading import save_weights
from g4v.paths import TRAINED_MODEL_DIR, VLORA_MODEL_DIR

_TENSOR_PREFIX = "base_model.model."
_NOT_COPIED = ("model.safetensors", "g4v_build.json", "training_log.jsonl")
#: The answers of each question kind, for the blind answers.
ANSWERS = {"colour": tuple(S.COLOURS), "shape": S.SHAPES, "position": tuple(S.PLACES),
           "count": tuple(S.NUMBERS.values())}


def blind_answer(seed: int):
    """``qa -> answer``: one fixed answer of the question's kind per question text, whatever the
    picture (seeded by the question, so every run and every picture agree)."""
    def answer(qa: S.QA) -> str:
        return random.Random(f"blind:{seed}:{qa.question}").choice(ANSWERS[qa.kind])
    return answer


def build_vlora(out: Path = VLORA_MODEL_DIR, source: Path = TRAINED_MODEL_DIR,
                settings: VisionLoraSettings | None = None, command: str = "python -m g4v.demo build-vlora",
                progress: bool = True) -> dict:
    """Write the layout checkpoint to ``out`` (replaced); returns its provenance."""
    settings = settings or VisionLoraSettings()
    started = time.time()
    peft_model, losses = train_lora(Path(source), settings, blind_answer(settings.seed), "blind", "build-vlora",
                                    progress)
    scaling = settings.alpha / settings.rank
    lora: dict[str, torch.Tensor] = {}
    trained = _blind_pairs(peft_model)
    model = peft_model.unload()  # the trained checkpoint's weights, the LoRA layers removed
    layers = dict(model.named_modules())
    with torch.no_grad():
        for name, (lora_a, lora_b) in trained.items():
            weight = layers[name].weight  # W: bf16 values held in float32
            # The stored (bf16) LoRA is what both sides use, so the base is blind by the same D.
            lora_a, lora_b = lora_a.to(torch.bfloat16), lora_b.to(torch.bfloat16)
            delta = scaling * (lora_b.float() @ lora_a.float())
            weight.copy_((weight + delta).to(torch.bfloat16).float())  # W0, rounded as it is stored
            lora[f"{_TENSOR_PREFIX}{name}.lora_A.weight"] = lora_a.contiguous()
            lora[f"{_TENSOR_PREFIX}{name}.lora_B.weight"] = (-lora_b).contiguous()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in sorted(Path(source).iterdir()):
        if path.is_file() and path.name not in _NOT_COPIED:
            shutil.copyfile(path, out / path.name)
    base_sha = save_weights(model, out, dtype=torch.bfloat16)
    adapter_sha = _save_adapter(out, lora, settings)
    provenance = {"command": command, "source": "assets/" + Path(source).name, "settings": asdict(settings),
                  "modules": len(lora) // 2,
                  "derivation": "a blind LoRA D trained on the source (answers independent of the picture); "
                                "base W0 = bf16(W + s * B_D @ A_D); vision LoRA B = -B_D, A = A_D (bf16)",
                  "final_loss": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4),
                  "wall_time_s": round(time.time() - started, 1),
                  "weights_sha256": base_sha, "adapter_sha256": adapter_sha}
    (out / "g4v_build.json").write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    return provenance


def _blind_pairs(peft_model) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``module -> (A_D, B_D)`` of the trained blind LoRA, by the plain model's module names."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model)
    names = sorted(k[len(_TENSOR_PREFIX):-len(".lora_A.weight")] for k in state if k.endswith(".lora_A.weight"))
    return {n: (state[f"{_TENSOR_PREFIX}{n}.lora_A.weight"].detach().clone(),
                state[f"{_TENSOR_PREFIX}{n}.lora_B.weight"].detach().clone()) for n in names}


def _save_adapter(out: Path, tensors: dict[str, torch.Tensor], settings: VisionLoraSettings) -> str:
    """``adapter_config.json`` (PEFT's own, from ``LoraConfig``) and ``adapter_model.safetensors``."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    from g4v.checkpoint.vision_lora import ADAPTER_WEIGHTS
    from g4v.loading import sha256_file

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0,
                        target_modules=LORA_TARGET_REGEX, bias="none", inference_mode=True)
    config.base_model_name_or_path = "assets/" + out.name
    config.save_pretrained(str(out))
    data = json.loads((out / "adapter_config.json").read_text())
    data.pop("peft_version", None)  # the build does not depend on PEFT's version; keep the file stable
    (out / "adapter_config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    path = out / ADAPTER_WEIGHTS
    save_file(tensors, str(path), metadata={"format": "pt"})
    return sha256_file(path)
