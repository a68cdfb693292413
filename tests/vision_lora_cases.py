"""Prompts and references shared by the vision LoRA tests of both environments (transformers here,
vLLM in tests/vllm): held-out shape pictures with their questions, and a text-only prompt."""

import shutil
from pathlib import Path

from g4v.checkpoint.vision_lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from g4v.conversation import Message, SamplingSettings
from g4v.demo import shapes as S

GREEDY = SamplingSettings(max_new_tokens=8, temperature=0)
PICTURES = S.eval_set(3)
IMAGE_PROMPTS = [[Message("user", qa.question, [p.image])] for p in PICTURES for qa in p.qas]
TEXT_PROMPTS = [[Message("user", "What colour is the shape?")], [Message("user", "How many shapes are there?")]]


def base_copy(layout: Path, out: Path) -> Path:
    """The layout folder's base alone, copied without the adapter files: the reference for the base
    language model, loaded by plain ``from_pretrained`` with no vision LoRA code involved."""
    out.mkdir(parents=True, exist_ok=True)
    for path in layout.iterdir():
        if path.name not in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            shutil.copyfile(path, out / path.name)
    return out


def hand_merged(layout: Path, out: Path) -> Path:
    """The vision model computed from the files alone (safetensors, no g4v or PEFT code):
    ``W0 + alpha / r * B @ A`` in float32 for every adapted projection, saved beside a copy of
    the other files. The reference for what base + vision LoRA must answer."""
    import json

    from safetensors.torch import load_file, save_file

    base_copy(layout, out)
    weights = {k: v.float() for k, v in load_file(str(layout / "model.safetensors")).items()}
    lora = load_file(str(layout / ADAPTER_WEIGHTS))
    config = json.loads((layout / ADAPTER_CONFIG).read_text())
    scaling = config["lora_alpha"] / config["r"]
    for key in lora:
        if key.endswith(".lora_A.weight"):
            module = key[len("base_model.model."):-len(".lora_A.weight")]
            delta = lora[key.replace("lora_A", "lora_B")].float() @ lora[key].float()
            weights[module + ".weight"] = (weights[module + ".weight"] + scaling * delta).contiguous()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    settings = json.loads((out / "config.json").read_text())
    settings["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(settings, indent=2))
    return out


def tokens(engine, prompts, adapter=None) -> list[list[int]]:
    return [engine.generate(p, GREEDY, adapter=adapter).token_ids for p in prompts]


def vision_model_plus_french(layout: Path, french: Path, out: Path) -> Path:
    """The vision model with the French adapter merged (W0 + s_v B_v A_v + s_f B_f A_f): the
    reference for both kinds of user adapter."""
    return merged_copy(layout, [layout, french], out)


def merged_copy(layout: Path, loras: list[Path], out: Path) -> Path:
    """The layout folder's base with each LoRA folder of ``loras`` merged, written by this test
    code alone from the raw safetensors files (float32): independent of g4v's LoRA code, PEFT and
    vLLM. ``[layout]``: the vision model."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    base_copy(layout, out)
    weights = {k: v.float() for k, v in load_file(str(out / "model.safetensors")).items()}
    for folder in loras:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
        lora = load_file(str(folder / ADAPTER_WEIGHTS))
        for key in [k for k in lora if k.endswith(".lora_A.weight")]:
            module = key[len("base_model.model."):-len(".lora_A.weight")]
            delta = lora[key.replace("lora_A", "lora_B")].float() @ lora[key].float()
            weights[f"{module}.weight"] += config["lora_alpha"] / config["r"] * delta
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
