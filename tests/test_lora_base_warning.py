"""An adapter made for another base model runs, with one warning line (issue 31, item 10): in the CLI
twins on stderr (here in process), and in the LoRA tab (tests/test_browser_ux.py)."""

import json

import pytest

from g4v.cli import main
from g4v.paths import ASSETS_DIR, BUNDLED_MODEL_DIR, TRAINED_MODEL_DIR
from g4v.lora.choices import base_warning

ADAPTERS = ASSETS_DIR / "adapters"
#: The bundled adapters and the base each one's config names (read here, not from the code under test).
BASES = {name: json.loads((ADAPTERS / name / "adapter_config.json").read_text())["base_model_name_or_path"]
         for name in ("demo-lora", "tiny-trained-french")}


def test_the_warning_names_the_base_the_adapter_was_made_for():
    assert BASES["demo-lora"].endswith(BUNDLED_MODEL_DIR.name)  # the fixture this test relies on
    assert BASES["tiny-trained-french"].endswith(TRAINED_MODEL_DIR.name)
    assert base_warning("demo-lora", None, str(BUNDLED_MODEL_DIR)) == ""
    assert base_warning("tiny-trained-french", None, str(TRAINED_MODEL_DIR)) == ""
    line = base_warning("tiny-trained-french", None, str(BUNDLED_MODEL_DIR))
    assert line.startswith("warning: adapter tiny-trained-french was made for " + BASES["tiny-trained-french"])
    assert str(BUNDLED_MODEL_DIR) not in line and "\n" not in line  # no server path in what the app shows
    assert base_warning("no-such-adapter", None, str(BUNDLED_MODEL_DIR)) == ""  # using it says why


@pytest.mark.parametrize("adapter, warned", [("tiny-trained-french", True), ("demo-lora", False)])
def test_the_chat_twin_warns_on_stderr_and_still_answers(adapter, warned, capsys):
    code = main(["chat", "--model", str(BUNDLED_MODEL_DIR), "--device", "cpu", "--dtype", "float32",
                 "--adapter", adapter, "--max-new-tokens", "2", "hi"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip()
    assert (f"warning: adapter {adapter} was made for {BASES[adapter]}" in err) == warned, err


def adapter_box_info(engine, model: str, adapters_dir) -> str | None:
    """The LoRA tab's Adapter dropdown as built for ``engine`` (the page shows its ``info`` under the label)."""
    import gradio as gr

    from webapp.lora import lora_tab

    with gr.Blocks():
        lora_tab(engine, model, adapters_dir, gr.State())
        box = next(block for block in gr.context.Context.root_block.blocks.values()
                   if getattr(block, "elem_id", None) == "lora-adapter")
    return box.value, box.info


def test_a_blank_adapter_box_says_why_on_the_vision_lora_checkpoint(tmp_path):
    """On the vision-LoRA checkpoint the bundled adapters are all made for other bases, so the box
    starts blank: its note says so, and that the vision LoRA is chosen in the model pickers; an
    empty folder says it is empty. On the bundled checkpoint the box starts on demo-lora, no note."""
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import VLORA_MODEL_DIR

    vlora = TransformersEngine(str(VLORA_MODEL_DIR), device="cpu", dtype="float32")
    value, info = adapter_box_info(vlora, str(VLORA_MODEL_DIR), None)
    assert value is None and info.startswith(f"no adapter in the adapter folder is made for this model ({len(BASES)} made")
    assert info.endswith("the vision LoRA is chosen in the model pickers below (base language model | vision model)")
    empty = tmp_path / "adapters"
    empty.mkdir()
    assert adapter_box_info(vlora, str(VLORA_MODEL_DIR), empty)[1].startswith("no adapters in the adapter folder; the vision LoRA")
    plain = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")
    assert adapter_box_info(plain, str(BUNDLED_MODEL_DIR), None) == ("demo-lora", None)
    assert adapter_box_info(plain, str(BUNDLED_MODEL_DIR), empty) == (None, "no adapters in the adapter folder")
