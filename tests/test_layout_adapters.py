"""A user's adapters on the layout checkpoint, transformers side (vLLM: tests/vllm/test_layout_adapters.py).

The two kinds are built from the bundled files (``g4v.demo.layout_adapters``): the French adapter
*on the vision model* (its recorded base a merge-lora checkpoint of the vision LoRA) and folded
into a *replacement* of the vision LoRA. Both must answer as the vision model with the French
adapter merged by this test's own arithmetic; the combinations that would run another model are
one line each."""

import json
import shutil

import pytest
from tests.vision_lora_cases import IMAGE_PROMPTS, TEXT_PROMPTS, base_copy, tokens, vision_model_plus_french

from g4v.conversation import SamplingSettings
from g4v.demo.layout_adapters import ON_VISION_MODEL_NAME, REPLACEMENT_NAME, build_layout_adapters
from g4v.engines.base import WITHOUT_VISION_LORA
from g4v.engines.hf import TransformersEngine
from g4v.errors import G4VError
from g4v.lora.activation import ON_VISION_MODEL, REPLACES, activate_adapter
from g4v.paths import FRENCH_ADAPTER_DIR, VLORA_MODEL_DIR

pytestmark = pytest.mark.slow
LAYOUT = str(VLORA_MODEL_DIR)
#: Colour questions (the French adapter changes these) and a position question, on which the
#: French adapter without the vision LoRA answers otherwise (two of these four, seen here).
PROMPTS = [IMAGE_PROMPTS[i] for i in (0, 2, 4, 8)]


def engine(mode=None, model=LAYOUT):
    return TransformersEngine(model, device="cpu", dtype="float32", vision_lora=mode)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_layout_adapters(tmp_path_factory.mktemp("layout-adapters") / "out")


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    reference = engine(model=str(vision_model_plus_french(VLORA_MODEL_DIR, FRENCH_ADAPTER_DIR,
                                                          tmp_path_factory.mktemp("reference"))))
    return tokens(reference, PROMPTS)


@pytest.fixture(scope="module")
def native():
    return engine("native")


def test_both_kinds_answer_as_the_vision_model_with_the_french_adapter(native, built, expected):
    replacement = activate_adapter(native, REPLACEMENT_NAME, built["adapters"])
    stacked = activate_adapter(native, ON_VISION_MODEL_NAME, built["adapters"])
    assert (replacement.kind, stacked.kind) == (REPLACES, ON_VISION_MODEL)
    assert tokens(native, PROMPTS, adapter=replacement.name) == expected
    assert tokens(native, PROMPTS, adapter=stacked.name) == expected
    # the checks can fail: the vision model alone, and the French adapter run instead of the vision
    # LoRA (what the engine did with every user adapter before it told the kinds apart), differ
    assert tokens(native, PROMPTS) != expected
    native.register_adapter("french-instead", str(FRENCH_ADAPTER_DIR))
    assert tokens(native, PROMPTS, adapter="french-instead") != expected


def test_the_base_language_model_is_one_request_away(native, tmp_path):
    """adapter=WITHOUT_VISION_LORA: the base language model on image prompts too (a plain copy of
    the base without the adapter files is the reference)."""
    base = engine(model=str(base_copy(VLORA_MODEL_DIR, tmp_path / "base")))
    assert tokens(native, PROMPTS, adapter=WITHOUT_VISION_LORA) == tokens(base, PROMPTS)
    assert tokens(native, TEXT_PROMPTS, adapter=WITHOUT_VISION_LORA) == tokens(base, TEXT_PROMPTS)
    with pytest.raises(G4VError, match="merged into the weights"):
        engine("merged").generate(PROMPTS[0], SamplingSettings(max_new_tokens=1), adapter=WITHOUT_VISION_LORA)


def test_merged_mode_runs_the_adapter_on_the_vision_model_and_refuses_a_replacement(built, expected):
    merged = engine("merged")
    stacked = activate_adapter(merged, ON_VISION_MODEL_NAME, built["adapters"])
    assert tokens(merged, PROMPTS, adapter=stacked.name) == expected
    with pytest.raises(G4VError) as refused:
        activate_adapter(merged, REPLACEMENT_NAME, built["adapters"])
    assert str(refused.value) == (f"adapter {REPLACEMENT_NAME} replaces the vision LoRA, which is merged into these "
                                  "weights (--vision-lora merged), so it would run on top of it: use --vision-lora native")
    assert merged.adapters() == [stacked.name]


def test_off_mode_refuses_an_adapter_trained_on_the_vision_model(built):
    off = engine("off")
    with pytest.raises(G4VError, match=f"^adapter {ON_VISION_MODEL_NAME} was trained on the vision model .*off here"):
        activate_adapter(off, ON_VISION_MODEL_NAME, built["adapters"])
    assert activate_adapter(off, REPLACEMENT_NAME, built["adapters"]).kind == REPLACES


def test_the_kind_comes_from_the_marker_then_the_recorded_base_then_rank_and_targets(native, built, tmp_path):
    adapters = tmp_path / "adapters"
    shutil.copytree(built["adapters"], adapters)
    # no recorded merge: the French adapter (rank 8 < the vision LoRA's 16) cannot hold the vision LoRA
    assert activate_adapter(native, str(FRENCH_ADAPTER_DIR.name), FRENCH_ADAPTER_DIR.parent).kind == ON_VISION_MODEL
    marked = adapters / REPLACEMENT_NAME / "g4v_adapter.json"
    marked.write_text(json.dumps({"kind": "on-vision-model"}))
    assert activate_adapter(native, REPLACEMENT_NAME, adapters).kind == ON_VISION_MODEL
    marked.write_text(json.dumps({"kind": "sideways"}))
    with pytest.raises(G4VError, match="names an unknown kind 'sideways'"):
        activate_adapter(native, REPLACEMENT_NAME, adapters)
    marked.unlink()
    # the replacement's recorded base made a merge-lora checkpoint of the vision LoRA: on the vision model
    config_path = adapters / REPLACEMENT_NAME / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "base_model_name_or_path": str(built["vision-model"])}))
    assert activate_adapter(native, REPLACEMENT_NAME, adapters).kind == ON_VISION_MODEL
    # a merge-lora record of another model's vision LoRA is no evidence: rank and targets decide
    other = tmp_path / "other-merge"
    shutil.copytree(built["vision-model"], other)
    record = json.loads((other / "g4v_merge.json").read_text())
    (other / "g4v_merge.json").write_text(json.dumps({**record, "base": "someone/else"}))
    config_path.write_text(json.dumps({**config, "base_model_name_or_path": str(other)}))
    assert activate_adapter(native, REPLACEMENT_NAME, adapters).kind == REPLACES


def test_an_adapter_on_a_checkpoint_without_a_vision_lora_has_no_kind(hf_engine):
    from g4v.paths import ASSETS_DIR

    assert activate_adapter(hf_engine, "demo-lora", ASSETS_DIR / "adapters").kind is None
