"""The port inspector's vision LoRA audit (:mod:`g4v.port.lora_audit`) on the layout checkpoint,
without vLLM: which serving arguments make the two sides different models, one line each. The
comparison under each of them, with vLLM really started, is tests/vllm/test_port_diff_vision_lora.py."""

import re

import pytest

from g4v.checkpoint.vision_lora import find_vision_lora
from g4v.errors import G4VError
from g4v.paths import TRAINED_MODEL_DIR, VLORA_MODEL_DIR
from g4v.port import lora_audit

LORA = find_vision_lora(str(VLORA_MODEL_DIR))
RECIPE = {"enable_lora": True, "max_lora_rank": 16, "default_mm_loras": {"image": str(VLORA_MODEL_DIR)}}


def test_the_recipe_serves_the_lora_to_image_requests():
    assert LORA.rank == 16  # the layout checkpoint's adapter (adapter_config.json)
    assert lora_audit.recipe(LORA, "native") == RECIPE
    assert lora_audit.recipe(LORA, "merged") == lora_audit.recipe(LORA, "off") == {}
    for transformers in ("native", "merged"):
        for vllm, serving in (("native", RECIPE), ("merged", {})):
            assert lora_audit.findings(LORA, transformers, vllm, serving) == []
    assert lora_audit.findings(LORA, "off", "off", {}) == []  # the base against the base: one model


@pytest.mark.parametrize("transformers, vllm, serving, start", [
    ("off", "native", RECIPE, "transformers does not apply the checkpoint's vision LoRA (vision-lora=off)"),
    ("native", "off", {}, "vLLM does not apply the checkpoint's vision LoRA (vision-lora=off)"),
    ("native", "native", {}, "vLLM does not apply the checkpoint's vision LoRA (enable_lora is off)"),
    ("merged", "native", {"enable_lora": True, "max_lora_rank": 16},
     "vLLM does not apply the checkpoint's vision LoRA (default_mm_loras has no image entry"),
    ("native", "native", {"hf_overrides": {"adapter_path": str(VLORA_MODEL_DIR)}},
     "hf_overrides adapter_path is read by no code in vLLM 0.32's granite4_vision"),
    ("native", "native", {**RECIPE, "max_lora_rank": 8}, "max_lora_rank 8 is below the vision LoRA's rank 16"),
    ("native", "native", {"max_lora_rank": 4}, "max_lora_rank 4 is below the vision LoRA's rank 16: once enable_lora"),
])
def test_each_mistake_is_one_line_with_what_to_do(transformers, vllm, serving, start):
    found = lora_audit.findings(LORA, transformers, vllm, serving)
    assert any(line.startswith(start) for line in found), found
    assert all("\n" not in line and ": " in line for line in found)
    assert lora_audit.summary(LORA, transformers, vllm, serving).ok is False


def test_a_rank_vllm_refuses_is_not_started_with_the_lora():
    assert lora_audit.runnable(LORA, {**RECIPE, "max_lora_rank": 8})["default_mm_loras"] is None
    assert lora_audit.runnable(LORA, RECIPE) == RECIPE


def test_adapter_path_is_flagged_on_a_merged_checkpoint_too():
    lora = find_vision_lora(str(TRAINED_MODEL_DIR))
    assert lora is None
    [line] = lora_audit.findings(lora, "off", "off", {"hf_overrides": {"adapter_path": "x"}})
    assert line.startswith("hf_overrides adapter_path")


@pytest.mark.parametrize("text, words", [
    ("[1]", "JSON object of vLLM's LoRA arguments"), ("{", "must be a JSON object"),
    ('{"lora": 1}', "'lora' is not one of"), ('{"enable_lora": 1}', "enable_lora must be true or false"),
])
def test_bad_serving_text_is_one_line(text, words):
    with pytest.raises(G4VError, match=words):
        lora_audit.parse_serving(text)


# ── The vLLM port tab's vision LoRA options (issue 32): checked and audited before vLLM starts ──

FOLDER = VLORA_MODEL_DIR.name  # how the tab names the checkpoint's folder (never its server path)


@pytest.fixture(scope="module")
def checkpoint():
    from webapp.port import PortCheckpoint

    return PortCheckpoint.of(str(VLORA_MODEL_DIR))


@pytest.mark.parametrize("transformers, vllm, serving, start", [
    ("native", "off", "", "vLLM does not apply the checkpoint's vision LoRA (vision-lora=off)"),
    ("native", "native", '{"enable_lora": true, "max_lora_rank": 16}',
     "vLLM does not apply the checkpoint's vision LoRA (default_mm_loras has no image entry"),
    ("native", "native", f'{{"hf_overrides": {{"adapter_path": "{FOLDER}"}}}}',
     "hf_overrides adapter_path is read by no code in vLLM 0.32's granite4_vision"),
    ("native", "native", f'{{"enable_lora": true, "max_lora_rank": 8, "default_mm_loras": {{"image": "{FOLDER}"}}}}',
     "max_lora_rank 8 is below the vision LoRA's rank 16"),
    ("off", "native", "", "transformers does not apply the checkpoint's vision LoRA (vision-lora=off)"),
])
def test_the_port_tab_lists_each_misconfiguration_as_a_line(checkpoint, transformers, vllm, serving, start):
    """The tab's audit, from the config alone: each of the three misconfigurations (and the LoRA
    off on one side) is a line of its own, as the audit of the same settings written with the
    server's folder says (the folder's name in place of its path); the defaults have no finding."""
    from webapp.common import unescape_markdown
    from webapp.port import audit_note

    note = unescape_markdown(audit_note(checkpoint, transformers, vllm, serving))  # its lines as the page shows them
    lines = [line.removeprefix("- ") for line in note.splitlines() if line.startswith("- ")]
    assert any(line.startswith(start) for line in lines), note
    used = lora_audit.parse_serving(serving.replace(f'"{FOLDER}"', f'"{LORA.folder}"') or None) \
        or lora_audit.recipe(LORA, vllm)
    assert lines == [line.replace(str(LORA.folder), FOLDER) for line in lora_audit.findings(LORA, transformers, vllm, used)]
    assert str(VLORA_MODEL_DIR.parent) not in note  # no server path in the page
    assert "--vision-lora" not in note  # the tab's own options are dropdowns, not g4v's command-line flags
    default = audit_note(checkpoint, "native", "native", "")
    assert default.startswith("Vision LoRA: rank 16, 70 modules") and "- no finding" in default


@pytest.mark.parametrize("serving, words", [
    ('{"default_mm_loras": {"image": "/etc"}}', f"may only name this checkpoint's folder, '{FOLDER}'"),
    ('{"default_mm_loras": {"image": "../granite4-vision-tiny"}}', "may only name this checkpoint's folder"),
    ('{"hf_overrides": {"num_hidden_layers": 1}}', "hf_overrides takes only adapter_path here"),
    ('{"lora": 1}', "vLLM LoRA arguments: 'lora' is not one of"),
    ("{", "vLLM LoRA arguments must be a JSON object"),
])
def test_the_port_tab_refuses_outside_folders_and_bad_json_in_one_line(checkpoint, serving, words):
    """A visitor's LoRA arguments name no folder but the checkpoint's (vLLM would load it) and no
    config override; the refusal names the box, not a CLI flag, in one line, before vLLM starts."""
    import gradio as gr

    from webapp.port import PortBoxes, audit_note, make_port_diff

    assert audit_note(checkpoint, "native", "native", serving).startswith("**Not usable**: ")
    with pytest.raises(gr.Error) as err:
        boxes = PortBoxes(verdict=gr.Markdown(), table=gr.Dataframe(), picture=gr.Image(), details=gr.JSON())
        make_port_diff(str(VLORA_MODEL_DIR), boxes, checkpoint)("x.png", "Hi", "native", "native", serving)
    assert words in err.value.message and "\n" not in err.value.message and "--vllm" not in err.value.message


def test_the_audit_shows_every_refusal_and_every_finding_at_once(checkpoint):
    """An unsafe folder and a too small rank in one set of arguments: the refusal of the folder and
    the findings of the rest (the rank, adapter_path read by nothing, the LoRA not switched on),
    not the refusal alone; every refused folder is named, each once."""
    from webapp.common import unescape_markdown
    from webapp.port import audit_note

    serving = '{"max_lora_rank": 4, "hf_overrides": {"adapter_path": "/etc"}}'
    note = unescape_markdown(audit_note(checkpoint, "native", "native", serving))  # as the page shows it
    head, *rest = note.splitlines()
    assert head == (f"**Not usable**: vLLM LoRA arguments: adapter_path may only name this checkpoint's folder, "
                    f"'{FOLDER}'")
    lines = [line.removeprefix("- ") for line in rest if line.startswith("- ")]
    starts = ["hf_overrides adapter_path is read by no code", "max_lora_rank 4 is below the vision LoRA's rank 16",
              "vLLM does not apply the checkpoint's vision LoRA (enable_lora is off)"]
    assert len(lines) == 3 and all(any(line.startswith(start) for line in lines) for start in starts), note
    assert "/etc" not in "\n".join(lines) and str(VLORA_MODEL_DIR.parent) not in note
    # the same arguments with the checkpoint's own folder: the same findings, no refusal
    fine = unescape_markdown(audit_note(checkpoint, "native", "native", serving.replace("/etc", FOLDER)))
    assert "Not usable" not in fine and [line[2:] for line in fine.splitlines() if line.startswith("- ")] == lines
    confined, refused = lora_audit.check_serving(
        {"default_mm_loras": {"image": "/etc", "video": "../x"}, "hf_overrides": {"adapter_path": "/etc", "n": 1}},
        VLORA_MODEL_DIR)
    assert refused == ["default_mm_loras' 'image' entry may only name this checkpoint's folder, "
                       f"'{FOLDER}'", f"default_mm_loras' 'video' entry may only name this checkpoint's folder, '{FOLDER}'",
                       "hf_overrides takes only adapter_path here, not n",
                       f"adapter_path may only name this checkpoint's folder, '{FOLDER}'"]
    assert confined["default_mm_loras"] == {}  # no refused folder reaches vLLM
    with pytest.raises(G4VError, match="; ") as err:  # the run path: all of them, in one line
        lora_audit.confine_serving({"default_mm_loras": {"image": "/etc"}, "hf_overrides": {"adapter_path": "/etc"}},
                                   VLORA_MODEL_DIR)
    assert "\n" not in str(err.value)


def test_the_port_tab_runs_port_diff_with_its_options(checkpoint, tmp_path):
    """The options reach ``port-diff`` as its own flags (read back by the CLI's own parser), the
    checkpoint's folder name given to vLLM as the folder; the endpoint takes the three options."""
    import argparse
    import json

    import gradio as gr

    from dataclasses import replace

    from g4v.commands.port_diff import add_parser
    from g4v.settings.flags import settings_from_args
    from g4v.port.in_vllm_env import port_diff_command
    from g4v.port.settings import PortDiffSettings
    from webapp.port import lora_settings, port_tab

    text = f'{{"enable_lora": true, "max_lora_rank": 8, "default_mm_loras": {{"image": "{FOLDER}"}}}}'
    settings = lora_settings(checkpoint, "merged", "native", text)
    request = replace(settings.request(), max_new_tokens=4, atol=1e-6)
    command = port_diff_command("python", "x.png", "Hi", str(VLORA_MODEL_DIR), tmp_path / "p.png", request)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(command[3:])
    assert (args.vision_lora, args.vllm_vision_lora, args.max_new_tokens, args.atol) == ("merged", "native", 4, 1e-6)
    assert settings_from_args(PortDiffSettings, args) == request  # every field back as the tab set it
    assert lora_audit.parse_serving(args.vllm_serving) == {**json.loads(text), "default_mm_loras": {"image": str(LORA.folder)}}
    defaults = parser.parse_args(port_diff_command("python", "x.png", "Hi", "m", tmp_path / "p.png")[3:])
    assert settings_from_args(PortDiffSettings, defaults) == PortDiffSettings()  # CLI defaults

    with gr.Blocks() as demo:
        port_tab(str(VLORA_MODEL_DIR), gr.State())
    ids = {block._id: getattr(block, "elem_id", None) for block in demo.blocks.values()}
    [endpoint] = [d for d in demo.config["dependencies"] if d.get("api_name") == "port_diff"]
    assert [ids[i] for i in endpoint["inputs"]][2:] == ["port-vision-lora", "port-vllm-vision-lora", "port-vllm-serving"]


@pytest.mark.parametrize("serving, words", [
    ("[" * 100_000 + "]" * 100_000, "is too long: 200,000 characters (vLLM's LoRA arguments take at most 4,096)"),
    ("[" * 2_000 + "]" * 2_000, "is nested too deeply: vLLM's LoRA arguments are a flat JSON object"),
])
def test_deeply_nested_or_huge_serving_text_is_one_line(checkpoint, serving, words):
    """The red team's brackets gave the page a RecursionError's text (json's parser recurses)."""
    from webapp.common import unescape_markdown
    from webapp.port import audit_note

    assert unescape_markdown(audit_note(checkpoint, "native", "native", serving)) == \
        f"**Not usable**: vLLM LoRA arguments {words}"
    with pytest.raises(G4VError, match=re.escape(words)):
        lora_audit.parse_serving(serving)
