"""Adapter folders and adapter checks: each malformed adapter gets its own one-line error."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from g4v.demo.adapter import ADAPTER_NAME
from g4v.errors import G4VError
from g4v.lora.checks import check_adapter, load_adapter_spec
from g4v.lora.folders import ADAPTERS_ENV, CONFIG_FILE, WEIGHTS_FILE, adapter_dirs, list_adapters, resolve_adapter
from g4v.paths import ASSETS_DIR, BUNDLED_MODEL_DIR

DEMO = ASSETS_DIR / "adapters" / ADAPTER_NAME
LAYER0_Q = "base_model.model.model.language_model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def model_config():
    return AutoConfig.from_pretrained(BUNDLED_MODEL_DIR)


@pytest.fixture
def adapters_root(tmp_path):
    """An adapter folder holding a copy of the demo adapter."""
    root = tmp_path / "adapters"
    shutil.copytree(DEMO, root / "good")
    return root


def edit_config(folder, **changes):
    path = folder / CONFIG_FILE
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_weights(folder, change):
    tensors = load_file(str(folder / WEIGHTS_FILE))
    change(tensors)
    save_file(tensors, str(folder / WEIGHTS_FILE))


def error_of(folder, model_config) -> str:
    with pytest.raises(G4VError) as info:
        check_adapter(folder, model_config)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_demo_adapter_passes_and_is_small(model_config):
    spec = load_adapter_spec(ADAPTER_NAME, model_config, [DEMO.parent])
    assert spec.rank == 8 and spec.scaling == 2.0
    assert len(spec.modules) == 10 * 7  # every language-model linear layer
    assert all(m.startswith("model.language_model.layers.") for m in spec.modules)
    assert sum(p.stat().st_size for p in DEMO.iterdir()) < 1_000_000
    config = json.loads((DEMO / CONFIG_FILE).read_text())
    assert not config["modules_to_save"] and config["peft_type"] == "LORA"


def test_builder_reproduces_the_demo_adapter_bit_for_bit(tmp_path):
    from g4v.demo.adapter import build_adapter

    out = build_adapter(tmp_path / "rebuilt")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in DEMO.iterdir())
    for path in DEMO.iterdir():
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name


# ── folders ────────────────────────────────────────────────────────────────────────────────────


def test_adapter_dirs_from_flag_env_and_default(monkeypatch, tmp_path):
    monkeypatch.delenv(ADAPTERS_ENV, raising=False)
    assert adapter_dirs() == [ASSETS_DIR / "adapters"]
    monkeypatch.setenv(ADAPTERS_ENV, f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    assert adapter_dirs() == [tmp_path / "a", tmp_path / "b"]
    assert adapter_dirs(str(tmp_path / "c")) == [tmp_path / "c"]


def test_names_and_paths_inside_the_folders_resolve(adapters_root):
    assert list_adapters([adapters_root]) == ["good"]
    assert resolve_adapter("good", [adapters_root]) == ("good", (adapters_root / "good").resolve())
    assert resolve_adapter(str(adapters_root / "good"), [adapters_root])[0] == "good"


@pytest.mark.parametrize("escape", ["{root}/..", "{root}/good/../..", "/etc", "{root}/symlink", "symlink", ".."])
def test_paths_outside_the_folders_are_refused(adapters_root, tmp_path, escape):
    outside = tmp_path / "outside"
    shutil.copytree(DEMO, outside)  # a valid adapter: refused for where it is, not what it is
    (adapters_root / "symlink").symlink_to(outside)
    with pytest.raises(G4VError, match="outside the adapter folders"):
        resolve_adapter(escape.format(root=adapters_root), [adapters_root])


def test_an_outside_path_is_refused_even_when_valid(adapters_root, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(DEMO, outside)
    with pytest.raises(G4VError, match="outside the adapter folders"):
        resolve_adapter(str(outside), [adapters_root])


def test_unknown_name_lists_the_available_ones(adapters_root):
    with pytest.raises(G4VError, match=r"unknown adapter 'nope' \(available: good\)"):
        resolve_adapter("nope", [adapters_root])


# ── malformed adapters: one error each ─────────────────────────────────────────────────────────


def test_missing_config(adapters_root, model_config):
    (adapters_root / "good" / CONFIG_FILE).unlink()
    assert "adapter_config.json is missing" in error_of(adapters_root / "good", model_config)


def test_invalid_json(adapters_root, model_config):
    (adapters_root / "good" / CONFIG_FILE).write_text('{"peft_type": "LORA",')
    assert "not valid JSON" in error_of(adapters_root / "good", model_config)


def test_not_lora(adapters_root, model_config):
    edit_config(adapters_root / "good", peft_type="IA3")
    assert "not a LoRA adapter" in error_of(adapters_root / "good", model_config)


def test_modules_to_save(adapters_root, model_config):
    edit_config(adapters_root / "good", modules_to_save=["lm_head"])
    assert "modules_to_save (lm_head)" in error_of(adapters_root / "good", model_config)


def test_dora_is_refused(adapters_root, model_config):
    edit_config(adapters_root / "good", use_dora=True)
    assert "DoRA" in error_of(adapters_root / "good", model_config)


@pytest.mark.parametrize("changes, words", [({"r": 0}, "rank r"), ({"r": "8"}, "rank r"),
                                            ({"lora_alpha": -1}, "lora_alpha"), ({"lora_alpha": 1e9}, "scaling")])
def test_insane_rank_or_alpha(adapters_root, model_config, changes, words):
    edit_config(adapters_root / "good", **changes)
    assert words in error_of(adapters_root / "good", model_config)


def test_vision_tower_targets(adapters_root, model_config):
    # PEFT matches short names anywhere: SigLIP has q_proj too, so this would adapt the tower.
    edit_config(adapters_root / "good", target_modules=["q_proj", "v_proj"])
    assert "targets the vision tower" in error_of(adapters_root / "good", model_config)


def test_vision_tower_weights(adapters_root, model_config):
    """The config names only the language model, but the file carries tower weights too."""

    def add_tower(tensors):
        tower = "base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj"
        tensors[f"{tower}.lora_A.weight"] = torch.zeros(8, 64)
        tensors[f"{tower}.lora_B.weight"] = torch.zeros(64, 8)

    edit_weights(adapters_root / "good", add_tower)
    assert "targets the vision tower" in error_of(adapters_root / "good", model_config)


def test_unknown_module(adapters_root, model_config):
    edit_config(adapters_root / "good", target_modules=["q_proj_typo"])
    assert "unknown module 'q_proj_typo'" in error_of(adapters_root / "good", model_config)


def test_projector_targets_are_not_language_model(adapters_root, model_config):
    edit_config(adapters_root / "good", target_modules=r"model\.layerwise_projectors\.0\.out_linear")
    assert "not a language-model module" in error_of(adapters_root / "good", model_config)


def test_wrong_shapes(adapters_root, model_config):
    edit_weights(adapters_root / "good", lambda t: t.update({f"{LAYER0_Q}.lora_A.weight": torch.zeros(8, 96)}))
    message = error_of(adapters_root / "good", model_config)
    assert "has shape [8, 96], this model needs [8, 128]" in message


def test_missing_weights_file(adapters_root, model_config):
    (adapters_root / "good" / WEIGHTS_FILE).unlink()
    assert "adapter_model.safetensors is missing" in error_of(adapters_root / "good", model_config)


def test_corrupt_weights_file(adapters_root, model_config):
    path = adapters_root / "good" / WEIGHTS_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "is corrupt" in error_of(adapters_root / "good", model_config)


def test_garbage_weights_file(adapters_root, model_config):
    (adapters_root / "good" / WEIGHTS_FILE).write_bytes(b"\x00" * 64)
    assert "is corrupt" in error_of(adapters_root / "good", model_config)


def test_half_a_pair(adapters_root, model_config):
    edit_weights(adapters_root / "good", lambda t: t.pop(f"{LAYER0_Q}.lora_B.weight"))
    assert "has no lora_B weight" in error_of(adapters_root / "good", model_config)


def test_non_finite_weights(adapters_root, model_config):
    edit_weights(adapters_root / "good", lambda t: t[f"{LAYER0_Q}.lora_A.weight"].__setitem__((0, 0), float("nan")))
    assert "non-finite" in error_of(adapters_root / "good", model_config)


def test_the_errors_are_all_different(adapters_root, model_config, tmp_path):
    """The acceptance list, side by side: every case names its own problem."""
    cases = {
        "missing config": lambda f: (f / CONFIG_FILE).unlink(),
        "modules_to_save": lambda f: edit_config(f, modules_to_save=["lm_head"]),
        "vision tower": lambda f: edit_config(f, target_modules=["q_proj"]),
        "unknown module": lambda f: edit_config(f, target_modules=["nonexistent_proj"]),
        "wrong shapes": lambda f: edit_weights(f, lambda t: t.update({f"{LAYER0_Q}.lora_B.weight": torch.zeros(128, 4)})),
        "corrupt weights": lambda f: (f / WEIGHTS_FILE).write_bytes(b"not safetensors"),
    }
    messages = set()
    for label, spoil in cases.items():
        folder = tmp_path / label.replace(" ", "_")
        shutil.copytree(DEMO, folder)
        spoil(folder)
        messages.add(error_of(folder, model_config).replace(folder.name, "X"))
    assert len(messages) == len(cases)


# ── what an adapter folder may link to (every file a load reads stays inside) ─────────────────


@pytest.mark.parametrize("linked", [WEIGHTS_FILE, CONFIG_FILE])
def test_a_file_linked_to_outside_the_folders_is_refused(adapters_root, tmp_path, linked):
    """The folder is inside, one of its files points elsewhere: refused before anything reads it,
    naming the file but not where it points (a server path)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (adapters_root / "good" / linked).rename(outside / linked)
    (adapters_root / "good" / linked).symlink_to(outside / linked)
    for call in (lambda: resolve_adapter("good", [adapters_root]),
                 lambda: load_adapter_spec("good", AutoConfig.from_pretrained(BUNDLED_MODEL_DIR), [adapters_root])):
        with pytest.raises(G4VError) as info:
            call()
        message = str(info.value)
        assert linked in message and "outside the adapter folders" in message
        assert str(tmp_path) not in message and "\n" not in message


def test_a_config_linked_to_any_file_is_not_read(adapters_root, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"peft_type": "LORA", "password": "hunter2"}')
    (adapters_root / "good" / CONFIG_FILE).unlink()
    (adapters_root / "good" / CONFIG_FILE).symlink_to(secret)
    with pytest.raises(G4VError, match="adapter_config.json links outside the adapter folders"):
        resolve_adapter("good", [adapters_root])


def test_links_that_stay_inside_the_folders_are_accepted(adapters_root, model_config):
    """Two adapters sharing one weights file through a link is fine: it never leaves the folders."""
    shutil.copytree(adapters_root / "good", adapters_root / "twin")
    (adapters_root / "twin" / WEIGHTS_FILE).unlink()
    (adapters_root / "twin" / WEIGHTS_FILE).symlink_to(adapters_root / "good" / WEIGHTS_FILE)
    spec = load_adapter_spec("twin", model_config, [adapters_root])
    assert spec.name == "twin" and len(spec.modules) == 70


@pytest.fixture
def nested_root(tmp_path):
    root = tmp_path / "adapters"
    shutil.copytree(DEMO, root / "team" / "my-lora")
    return root


def test_nested_adapters_resolve_by_their_listed_name(nested_root, tmp_path, monkeypatch, model_config):
    monkeypatch.chdir(tmp_path)  # the name means a folder under the adapter folders, not the CWD
    assert list_adapters([nested_root]) == ["team/my-lora"]
    assert resolve_adapter("team/my-lora", [nested_root]) == ("team/my-lora", (nested_root / "team" / "my-lora").resolve())
    assert load_adapter_spec("team/my-lora", model_config, [nested_root]).name == "team/my-lora"
    with pytest.raises(G4VError, match=r"unknown adapter 'team/nope' \(available: team/my-lora\)"):
        resolve_adapter("team/nope", [nested_root])


def test_a_nested_adapter_answers_like_the_same_adapter_unnested(hf_engine, nested_root):
    from tests.conftest import make_image

    from g4v.conversation import Message, SamplingSettings
    from g4v.lora.activation import activate_adapter

    chat = [Message("user", "What is in this picture?", [make_image(96, 64, seed=5)])]
    settings = SamplingSettings(max_new_tokens=8)
    nested = activate_adapter(hf_engine, "team/my-lora", adapters_dir=str(nested_root)).name
    plain = activate_adapter(hf_engine, ADAPTER_NAME).name
    assert nested == "team/my-lora" and plain == ADAPTER_NAME
    answer = hf_engine.generate(chat, settings, adapter=nested)
    assert answer.token_ids == hf_engine.generate(chat, settings, adapter=plain).token_ids
    assert answer.token_ids != hf_engine.generate(chat, settings).token_ids


# ── names a user types ─────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("typed, words", [
    ("a" * 5000, "adapter name is too long (5000 characters; the limit is 255)"),
    ("team/" + "b" * 300, "adapter name is too long (300 characters; the limit is 255)"),
    ("é" * 200, "adapter name is too long (400 bytes in UTF-8; the limit is 255)"),
    ("/" + "c/" * 3000, "adapter path is too long"),
    ("bad\udcffname", "adapter name is not valid UTF-8 text"),
    ("bad\ud800name", "adapter name is not valid UTF-8 text"),
])
def test_unusable_names_get_one_line(adapters_root, typed, words):
    with pytest.raises(G4VError) as info:
        resolve_adapter(typed, [adapters_root])
    message = str(info.value)
    assert words in message and "\n" not in message and len(message) < 300
    assert str(adapters_root) not in message


def test_the_lora_tab_refuses_a_long_typed_name_in_one_line(hf_engine):
    """The tab's dropdown takes typed values; the name reaches the same check."""
    from g4v.lora.side_by_side import lora_side_by_side

    with pytest.raises(G4VError, match=r"^adapter name is too long \(5000 characters; the limit is 255\)$"):
        list(lora_side_by_side(hf_engine, "x" * 5000, "Hi"))


# ── which base an adapter was made for ─────────────────────────────────────────────────────────


def test_adapters_say_which_base_they_belong_to():
    from g4v.lora.choices import describe_adapter
    from g4v.paths import TRAINED_MODEL_DIR

    demo = describe_adapter(ADAPTER_NAME, model=str(BUNDLED_MODEL_DIR))
    assert demo.base == "assets/granite4-vision-tiny" and demo.matches
    assert "made for assets/granite4-vision-tiny" in demo.label
    assert not describe_adapter(ADAPTER_NAME, model=str(TRAINED_MODEL_DIR)).matches
    assert describe_adapter("tiny-trained-french", model="assets/granite4-vision-tiny-trained").matches
    assert not describe_adapter("tiny-trained-french", model="ibm-granite/granite-vision-4.1-4b").matches


def test_matching_adapters_come_first():
    from g4v.lora.choices import adapter_choices, preselected_adapter

    trained, tiny = "assets/granite4-vision-tiny-trained", "assets/granite4-vision-tiny"
    assert adapter_choices(model=trained)[0] == "tiny-trained-french"
    assert adapter_choices(model=tiny)[0] == ADAPTER_NAME
    assert sorted(adapter_choices(model=trained)) == sorted(adapter_choices()) == sorted(list_adapters())
    assert preselected_adapter(model=trained) == "tiny-trained-french"
    assert preselected_adapter(model=tiny) == ADAPTER_NAME
    assert preselected_adapter(model="ibm-granite/granite-vision-4.1-4b") is None


def test_bases_compare_as_folders_or_hub_ids(tmp_path, monkeypatch):
    from g4v.lora.folders import same_base
    from g4v.paths import REPO_ROOT

    monkeypatch.chdir(tmp_path)
    assert same_base("assets/granite4-vision-tiny", str(BUNDLED_MODEL_DIR))
    assert same_base(str(BUNDLED_MODEL_DIR), str(REPO_ROOT / "assets" / ".." / "assets" / "granite4-vision-tiny"))
    assert same_base("ibm-granite/granite-vision-4.1-4b", "ibm-granite/granite-vision-4.1-4b")
    assert not same_base("ibm-granite/granite-vision-4.1-4b", "ibm-granite/granite-vision-3.3-2b")
    assert not same_base("assets/granite4-vision-tiny", "assets/granite4-vision-tiny-trained")
    assert not same_base(None, str(BUNDLED_MODEL_DIR))
    (tmp_path / "link").symlink_to(BUNDLED_MODEL_DIR)
    assert same_base("assets/granite4-vision-tiny", "link")  # the model path is as the user typed it


@pytest.mark.parametrize("there, not_there", [
    ("../../../../etc/passwd", "../../../../etc/no-such-file"),  # the red team's probe
    ("/etc/passwd", "/etc/no-such-file"),
    ("app.py", "no-such-file.py"),  # the server's working folder
    ("../../README.md", "../../NO-SUCH.md"),  # from the adapter folder, the repository's own file
])
def test_the_answer_tells_nothing_about_which_server_paths_exist(there, not_there):
    """A path outside the adapter folders that exists and one that does not get the same words
    (before: "outside the adapter folders" for one, "unknown adapter" for the other)."""
    from pathlib import Path

    from g4v.lora.folders import resolve_adapter
    from g4v.paths import ASSETS_DIR, REPO_ROOT

    assert any((base / there).exists() for base in (ASSETS_DIR / "adapters", REPO_ROOT, Path("/")))
    answers = []
    for typed in (there, not_there):
        with pytest.raises(G4VError) as refused:
            resolve_adapter(typed)
        answers.append(str(refused.value).replace(repr(typed), "NAME"))
    assert answers[0] == answers[1], answers
