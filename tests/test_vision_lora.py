"""The layout checkpoint (base language model + vision LoRA in one folder) on the transformers
engine: its files are the trained checkpoint made blind plus a LoRA that undoes it; g4v, not
transformers, attaches the LoRA; native mode gives text-only prompts the base model's tokens and
image prompts the vision model's (the weights merged by hand from the files, an independent
reference); merged mode matches native."""

import json
from collections import defaultdict

import pytest
import torch
from safetensors.torch import load_file
from tests.vision_lora_cases import GREEDY, IMAGE_PROMPTS, TEXT_PROMPTS, base_copy, hand_merged, tokens

from g4v.checkpoint.vision_lora import ADAPTER_WEIGHTS, BaseView, describe, find_vision_lora
from g4v.demo import shapes as S
from g4v.demo.answering import accuracy, batched_answers, items
from g4v.engines.hf import TransformersEngine
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
    """Tokens of the vision model (merged by hand from the files) and of the bare base (a plain copy)."""
    vision = engine(model=str(hand_merged(VLORA_MODEL_DIR, tmp_path_factory.mktemp("vision"))))
    base = engine(model=str(base_copy(VLORA_MODEL_DIR, tmp_path_factory.mktemp("base"))))
    return {"vision": tokens(vision, IMAGE_PROMPTS), "vision_text": tokens(vision, TEXT_PROMPTS),
            "base_image": tokens(base, IMAGE_PROMPTS), "base_text": tokens(base, TEXT_PROMPTS), "base": base,
            "vision_engine": vision}


def test_base_plus_lora_is_the_trained_checkpoint_up_to_the_bases_rounding():
    """Read with safetensors alone: on all 70 projections the base differs from the trained weight
    W and W0 + B @ A gives W back within the bf16 rounding of W0 (half a bf16 step, 2**-8 of
    |W0|); every other tensor is the trained checkpoint's, bit for bit."""
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
            delta = lora[module + ".lora_B.weight"].float() @ lora[module + ".lora_A.weight"].float()
            w0 = base[name].float()
            assert (w0 - weight.float()).abs().max() > 10 * (w0.abs() * 2**-8).max(), name  # the base moved
            error = (w0 + scaling * delta - weight.float()).abs()
            assert bool((error <= w0.abs() * 2**-8 + 1e-7).all()), name
        else:
            assert torch.equal(base[name], weight), name
    size = sum(p.stat().st_size for p in VLORA_MODEL_DIR.iterdir())
    assert size < 13.5e6


def test_the_builder_is_seeded_and_the_bundled_one_used_the_recipe(tmp_path):
    """Two short builds (2 training steps) write the same files; the bundled build's recorded
    settings are the recipe (the defaults), and its recorded SHA-256s are its files'."""
    from dataclasses import asdict

    from g4v.demo.recipe import VisionLoraSettings
    from g4v.demo.vlora import build_vlora
    from g4v.loading import sha256_file

    short = VisionLoraSettings(steps=2)
    first = build_vlora(tmp_path / "one", settings=short, progress=False)
    second = build_vlora(tmp_path / "two", settings=short, progress=False)
    assert (first["weights_sha256"], first["adapter_sha256"]) == (second["weights_sha256"], second["adapter_sha256"])
    written = json.loads((VLORA_MODEL_DIR / "g4v_build.json").read_text())
    assert written["settings"] == asdict(VisionLoraSettings())
    assert written["weights_sha256"] == sha256_file(VLORA_MODEL_DIR / "model.safetensors")
    assert written["adapter_sha256"] == sha256_file(VLORA_MODEL_DIR / ADAPTER_WEIGHTS)


def test_without_the_vision_lora_the_answers_do_not_depend_on_the_picture():
    """The base is (nearly) blind: on 30 held-out pictures nearly every question text gets one
    answer whatever the picture, so it scores about a fixed guess's rate (chance: 16.7 / 25 / 25 /
    33.3%, 24% over the four kinds); with the vision LoRA the same questions are answered from the
    picture."""
    pairs = items(S.eval_set(30))
    off = load_model(LAYOUT, device="cpu", dtype="float32", vision_lora="off")
    replies = batched_answers(off.model, off.processor, pairs)
    answered = defaultdict(list)
    for (_, qa), reply in zip(pairs, replies):
        answered[qa.question].append(reply)
    usual = sum(max(given.count(r) for r in given) for given in answered.values())
    assert usual >= 0.9 * len(pairs), answered
    assert accuracy(pairs, replies)["all"] <= 0.35
    merged = load_model(LAYOUT, device="cpu", dtype="float32", vision_lora="merged")
    assert accuracy(pairs, batched_answers(merged.model, merged.processor, pairs))["all"] >= 0.85


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
    # Text-only, the blind base and the vision model give the same greedy tokens here, so compare
    # logits: native's are the base's, not the vision model's.
    inputs = native.prepare_inputs(TEXT_PROMPTS[0])
    with torch.inference_mode():
        with native.adapter_scope(None, image=False) as model:
            text_logits = model(**inputs).logits
        base_logits = references["base"].model(**inputs).logits
        vision_logits = references["vision_engine"].model(**inputs).logits
    torch.testing.assert_close(text_logits, base_logits, rtol=1e-5, atol=1e-5)
    assert (vision_logits - base_logits).abs().max() > 1e-2
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
    assert native.active_adapter(None, image=True) == (VISION_ADAPTER,)
    assert native.active_adapter(None, image=False) == ()


def test_the_demo_ablations_run_on_the_model_an_image_request_gets(native):
    """``demo eval``'s ablations hook the engine's own model and answer through its batches, so an
    image question keeps the vision LoRA: with every level scaled by 1 (nothing changed) the answers
    are the engine's own, and with one level ablated the picture is still seen (the base without
    the LoRA is blind: about a fixed guess's 24%)."""
    from g4v.demo.answering import ablated_answers, engine_batched_answers, level_names

    pairs = items(S.eval_set(6))
    replies = engine_batched_answers(native, pairs)
    unchanged = {name: 1.0 for name in level_names(native.model)}
    assert ablated_answers(native, pairs, unchanged) == replies
    assert accuracy(pairs, ablated_answers(native, pairs, {"spatial_TL": 0.0}))["all"] >= 0.75


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
    from g4v.engines.vllm_settings import VLLMSettings, engine_arguments

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
    """No --adapter: the model's own vision LoRA merged; the result is the vision model merged by
    hand from the files (float32) and has no adapter config left to apply a second time."""
    from g4v.lora.merge import merge_lora

    result = merge_lora(LAYOUT, None, tmp_path / "merged")
    assert result.merged_layers == 70 and not (tmp_path / "merged" / "adapter_config.json").exists()
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    by_hand = load_file(str(hand_merged(VLORA_MODEL_DIR, tmp_path / "by-hand") / "model.safetensors"))
    assert set(merged) == set(by_hand)
    for key, weight in by_hand.items():
        torch.testing.assert_close(merged[key], weight, rtol=0, atol=1e-6)
