"""Adapters whose ``init_lora_weights`` rewrites the base weights (PiSSA, OLoRA, ...) are refused.

PEFT re-runs an adapter's initialisation when it loads it; for these methods that initialisation
subtracts a low-rank part from the base layer's weight. The model the workbench calls "base"
(adapters disabled) would then no longer be the base, and ``merge-lora`` would merge into weights
PEFT never serves. The adapters here are real ones, built and saved by PEFT on the bundled model.
"""

import json
import shutil

import pytest
import torch
from tests.conftest import make_image
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoConfig

from g4v.conversation import Message, SamplingSettings
from g4v.demo.adapter import ADAPTER_NAME, TARGET_MODULES
from g4v.engines.hf import TransformersEngine
from g4v.errors import G4VError
from g4v.loading import load_model
from g4v.lora.checks import check_adapter, load_adapter_spec
from g4v.lora.folders import CONFIG_FILE
from g4v.paths import ASSETS_DIR, BUNDLED_MODEL_DIR

MODEL = str(BUNDLED_MODEL_DIR)
REWRITES = "rewrites the base weights when PEFT loads it"


@pytest.fixture(scope="module")
def adapters_root(tmp_path_factory):
    """PiSSA and OLoRA adapters made by PEFT on the bundled model, in an adapter folder."""
    root = tmp_path_factory.mktemp("init") / "adapters"
    for init in ("pissa", "olora"):
        base = load_model(MODEL, device="cpu", dtype="float32").model
        config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGET_MODULES, init_lora_weights=init)
        get_peft_model(base, config).save_pretrained(str(root / init))
    return root


@pytest.fixture(scope="module")
def model_config():
    return AutoConfig.from_pretrained(MODEL)


def logits(model, inputs) -> torch.Tensor:
    with torch.inference_mode():
        return model(**inputs).logits[0].float()


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_peft_changes_the_base_when_it_loads_them(adapters_root, init):
    """Why they are refused: with the adapter loaded and disabled, PEFT's "base" is another model."""
    engine = TransformersEngine(MODEL, device="cpu", dtype="float32")
    inputs = engine.prepare_inputs([Message("user", "What is it?", [make_image(64, 64)])])
    before = logits(engine.model, inputs)
    q_proj = engine.model.model.language_model.layers[0].self_attn.q_proj.weight.detach().clone()
    peft_model = PeftModel.from_pretrained(engine.model, str(adapters_root / init))
    with peft_model.disable_adapter():
        after = logits(peft_model, inputs)
    assert not torch.equal(peft_model.base_model.model.model.language_model.layers[0].self_attn.q_proj.base_layer.weight,
                           q_proj)
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_check_adapter_refuses_them_in_one_line(adapters_root, model_config, init):
    with pytest.raises(G4VError) as info:
        load_adapter_spec(init, model_config, [adapters_root])
    message = str(info.value)
    assert f"init_lora_weights={init!r}" in message and REWRITES in message
    assert "\n" not in message


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_the_engine_keeps_serving_the_base(adapters_root, init):
    from g4v.lora.activation import activate_adapter

    engine = TransformersEngine(MODEL, device="cpu", dtype="float32")
    chat = [Message("user", "What is it?", [make_image(64, 64)])]
    before = engine.generate(chat, SamplingSettings(max_new_tokens=6))
    reference = logits(engine.model, engine.prepare_inputs(chat))
    with pytest.raises(G4VError, match=REWRITES):
        activate_adapter(engine, init, adapters_dir=str(adapters_root))
    assert engine.adapters() == []
    assert torch.equal(logits(engine.model, engine.prepare_inputs(chat)), reference)
    assert engine.generate(chat, SamplingSettings(max_new_tokens=6)).token_ids == before.token_ids


def with_init(tmp_path, value):
    folder = tmp_path / "adapter"
    shutil.copytree(ASSETS_DIR / "adapters" / ADAPTER_NAME, folder)
    config = json.loads((folder / CONFIG_FILE).read_text())
    config["init_lora_weights"] = value
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("value", ["pissa", "pissa_niter_4", "PiSSA", "olora", "OLoRA", "corda", "loftq", "lora_ga"])
def test_every_base_rewriting_value_is_refused(tmp_path, model_config, value):
    with pytest.raises(G4VError, match=REWRITES):
        check_adapter(with_init(tmp_path, value), model_config)


@pytest.mark.parametrize("value", [True, False, None, "gaussian", "orthogonal", "eva", "mica"])
def test_values_that_only_start_a_and_b_are_accepted(tmp_path, model_config, value):
    assert check_adapter(with_init(tmp_path, value), model_config).rank == 8


@pytest.mark.parametrize("value", ["magic", 3, ["pissa"]])
def test_unknown_values_are_refused(tmp_path, model_config, value):
    with pytest.raises(G4VError, match="unknown init_lora_weights"):
        check_adapter(with_init(tmp_path, value), model_config)


def test_merge_lora_refuses_them_and_writes_nothing(adapters_root, tmp_path):
    from g4v.lora.merge import merge_lora

    with pytest.raises(G4VError, match=REWRITES):
        merge_lora(MODEL, "pissa", tmp_path / "merged", adapters_dir=str(adapters_root))
    assert not (tmp_path / "merged").exists()
