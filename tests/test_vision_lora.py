"""The layout checkpoint (base language model + vision LoRA in one folder) on the transformers
engine: the checkpoint restores the trained one exactly; g4v, not transformers, attaches the LoRA;
native mode gives text-only prompts the base model's tokens and image prompts the vision model's
(the trained merged checkpoint's, an independent reference); merged mode matches native."""

import json

import pytest
import torch
from safetensors.torch import load_file
from tests.vision_lora_cases import GREEDY, IMAGE_PROMPTS, TEXT_PROMPTS, base_copy, tokens

from g4v.engines.hf import TransformersEngine
from g4v.engines.vision_lora import ADAPTER_WEIGHTS, BaseView, describe, find_vision_lora
from g4v.errors import G4VError
from g4v.loading import VISION_ADAPTER, load_model
from g4v.paths import ASSETS_DIR, TRAINED_MODEL_DIR, VLORA_MODEL_DIR

pytestmark = pytest.mark.slow
LAYOUT = str(VLORA_MODEL_DIR)
FRENCH = ASSETS_DIR / "adapters" / "tiny-trained-french"


def engine(mode=None, model=LAYOUT):
    return TransformersEngine(model, device="cpu", dtype="float32", vision_lora=mode)


@pytest.fixture(scope="module")
def native():
    return engine("native")


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Tokens of the trained checkpoint (the vision model) and of the bare base (a plain copy)."""
    trained = engine(model=str(TRAINED_MODEL_DIR))
    base = engine(model=str(base_copy(VLORA_MODEL_DIR, tmp_path_factory.mktemp("base"))))
    return {"vision": tokens(trained, IMAGE_PROMPTS), "vision_text": tokens(trained, TEXT_PROMPTS),
            "base_image": tokens(base, IMAGE_PROMPTS), "base_text": tokens(base, TEXT_PROMPTS), "base": base}


def test_base_plus_lora_is_the_trained_checkpoint_exactly():
    """Read with safetensors alone: W0 + B @ A == W on all 70 projections, everything else equal."""
    trained = load_file(str(TRAINED_MODEL_DIR / "model.safetensors"))
    base = load_file(str(VLORA_MODEL_DIR / "model.safetensors"))
    lora = load_file(str(VLORA_MODEL_DIR / ADAPTER_WEIGHTS))
    config = json.loads((VLORA_MODEL_DIR / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    adapted = {k[len("base_model.model."):-len(".lora_A.weight")] + ".weight" for k in lora if ".lora_A." in k}
    assert len(adapted) == 70 and set(trained) == set(base)
    for name, weight in trained.items():
        if name in adapted:
            module = "base_model.model." + name[: -len(".weight")]
            delta = lora[module + ".lora_B.weight"] @ lora[module + ".lora_A.weight"]
            assert not torch.equal(base[name], weight)
            assert torch.equal(base[name].float() + scaling * delta, weight.float()), name
        else:
            assert torch.equal(base[name], weight), name
    size = sum(p.stat().st_size for p in VLORA_MODEL_DIR.iterdir())
    assert size < 15e6


def test_the_builder_is_seeded(tmp_path):
    from g4v.demo.vlora import build_vlora

    info = build_vlora(tmp_path / "again")
    written = json.loads((VLORA_MODEL_DIR / "g4v_build.json").read_text())
    assert (info["weights_sha256"], info["adapter_sha256"]) == (written["weights_sha256"], written["adapter_sha256"])


def test_transformers_does_not_attach_the_lora_behind_g4vs_back(references):
    """Plain from_pretrained on the folder attaches it (PEFT installed: the trap); g4v's load in
    mode off has no LoRA layer and answers as the bare base."""
    from transformers import AutoModelForImageTextToText

    attached = AutoModelForImageTextToText.from_pretrained(LAYOUT, dtype=torch.float32)
    assert getattr(attached, "peft_config", None), "transformers no longer attaches a folder's adapter"
    off = engine("off")
    assert not any("lora_A" in name for name, _ in off.model.named_modules())
    assert tokens(off, IMAGE_PROMPTS) == references["base_image"]
    assert off.info.details["vision_lora"] == "vision LoRA: off, rank 16, 70 modules"


def test_native_text_gets_the_base_and_images_get_the_vision_model(native, references):
    assert native.info.details["vision_lora"] == "vision LoRA: native, rank 16, 70 modules"
    assert tokens(native, IMAGE_PROMPTS) == references["vision"]
    assert tokens(native, TEXT_PROMPTS) == references["base_text"]
    # the two models differ on these prompts, so the checks above can fail
    assert references["vision"] != references["base_image"]
    assert references["vision_text"] != references["base_text"]
    streamed = "".join(native.stream(IMAGE_PROMPTS[0], GREEDY))
    assert streamed == native.generate(IMAGE_PROMPTS[0], GREEDY).text


def test_a_user_adapter_replaces_the_vision_lora(native, references):
    """As vLLM serves one LoRA per request: the named adapter on the base, without the vision LoRA."""
    from peft import PeftModel

    native.register_adapter("french", str(FRENCH))
    reference = PeftModel.from_pretrained(references["base"].model, str(FRENCH)).eval()
    try:
        expected = tokens(references["base"], IMAGE_PROMPTS[:4])
    finally:
        reference.unload()
    assert tokens(native, IMAGE_PROMPTS[:4], adapter="french") == expected
    assert native.active_adapter(None, image=True) == VISION_ADAPTER
    assert native.active_adapter(None, image=False) is None


def test_merged_matches_native(native):
    merged = engine("merged")
    assert merged.info.details["vision_lora"].startswith("vision LoRA: merged")
    assert tokens(merged, IMAGE_PROMPTS) == tokens(native, IMAGE_PROMPTS)
    inputs = native.prepare_inputs(IMAGE_PROMPTS[0])
    with torch.inference_mode():
        with native.adapter_scope(None, image=True) as model:
            native_logits = model(**inputs).logits
        merged_logits = merged.model(**inputs).logits
    torch.testing.assert_close(merged_logits, native_logits, rtol=1e-4, atol=1e-4)


def test_checkpoints_without_a_vision_lora_are_untouched():
    assert find_vision_lora(str(TRAINED_MODEL_DIR)) is None
    assert describe("native", None).startswith("vision LoRA: none")
    with pytest.raises(G4VError, match="unknown vision LoRA mode"):
        load_model(LAYOUT, vision_lora="sometimes")


def test_the_base_view_hides_the_adapter_files_of_a_sharded_folder(tmp_path):
    """A sharded base (index + shards) keeps its shards and index in the view; no adapter file."""
    from safetensors.torch import save_file

    folder = base_copy(VLORA_MODEL_DIR, tmp_path / "sharded")
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(folder / file))
    weight_map = {k: file for file, keys in halves.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for name in ("adapter_config.json", ADAPTER_WEIGHTS):
        (folder / name).symlink_to(VLORA_MODEL_DIR / name)
    lora = find_vision_lora(str(folder))
    with BaseView(folder) as view:
        listed = sorted(p.name for p in view.path.iterdir())
    assert "adapter_config.json" not in listed and ADAPTER_WEIGHTS not in listed
    assert {"model.safetensors.index.json", *halves} <= set(listed)
    sharded = engine("native", model=str(folder))
    assert sharded.info.details["vision_lora"] == describe("native", lora)
    assert tokens(sharded, IMAGE_PROMPTS[:4]) == tokens(engine("native"), IMAGE_PROMPTS[:4])


def test_vllm_settings_that_cannot_serve_the_vision_lora_are_one_line():
    """Checked before vLLM starts (pure argument building, no vLLM needed)."""
    from g4v.engines.vllm_engine import VLLMSettings, engine_arguments

    arguments = engine_arguments(LAYOUT, VLLMSettings(), vision_rank=16)
    assert arguments["enable_lora"] and arguments["max_lora_rank"] == 16
    assert arguments["max_loras"] == engine_arguments(LAYOUT, VLLMSettings())["max_loras"] + 1
    assert engine_arguments(LAYOUT, VLLMSettings(), vision_rank=256)["max_lora_rank"] == 256
    assert engine_arguments(LAYOUT, VLLMSettings(), vision_rank=200)["max_lora_rank"] == 256
    with pytest.raises(G4VError, match="max_lora_rank 8 is below the vision LoRA's rank 16"):
        engine_arguments(LAYOUT, VLLMSettings(max_lora_rank=8), vision_rank=16)
    with pytest.raises(G4VError, match="needs LoRA in vLLM: drop --no-lora"):
        engine_arguments(LAYOUT, VLLMSettings(enable_lora=False), vision_rank=16)


def test_the_vllm_server_is_given_the_base_view_and_the_default_mm_lora():
    from g4v.engines.vllm_server import VLLMServer

    server = VLLMServer(LAYOUT, served_name="g4v")
    try:
        command = server.command
        served = command[command.index("--model") + 1]
        assert served == str(server.view.path)
        assert "adapter_model.safetensors" not in {p.name for p in server.view.path.iterdir()}
        assert command[command.index("--default-mm-loras") + 1] == json.dumps({"image": LAYOUT})
        assert command[command.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in command
    finally:
        server.stop()
    assert server.view is None


def test_chat_says_the_vision_lora_mode_in_one_line(capsys):
    from g4v.cli import main

    assert main(["chat", "--model", LAYOUT, "--vision-lora", "off", "What colour is the shape?",
                 "--max-new-tokens", "2"]) == 0
    assert "vision LoRA: off, rank 16, 70 modules" in capsys.readouterr().err


def test_merge_lora_writes_the_vision_model(tmp_path):
    """No --adapter: the model's own vision LoRA merged; the result is the trained checkpoint's
    weights (float32) and has no adapter config left to apply a second time."""
    from g4v.lora.merge import merge_lora

    result = merge_lora(LAYOUT, None, tmp_path / "merged")
    assert result.merged_layers == 70 and not (tmp_path / "merged" / "adapter_config.json").exists()
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    trained = load_file(str(TRAINED_MODEL_DIR / "model.safetensors"))
    assert set(merged) == set(trained)
    assert all(torch.equal(merged[k], trained[k].float()) for k in trained)
