"""An adapter made for another base model runs, with one warning line (issue 31, item 10): in the CLI
twins on stderr (here in process), and in the LoRA tab (tests/test_browser_ux.py). ``lora-diff``
without ``--adapter`` runs on the adapter the tab preselects, as its help says."""

import json

import pytest
from tests.conftest import make_image

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


@pytest.mark.parametrize("model", [TRAINED_MODEL_DIR, BUNDLED_MODEL_DIR])
def test_lora_diff_without_adapter_compares_the_adapter_the_tab_preselects(model, tmp_path, capsys):
    """``lora-diff --help`` says its default is the model Chat runs vs it with the adapter the LoRA
    tab preselects: without ``--adapter`` it runs on that adapter (the tab's own dropdown value, and
    the one bundled adapter whose config names this base), and says which on stderr."""
    from g4v.engines.hf import TransformersEngine

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "the model Chat runs vs the same with the adapter the LoRA tab preselects" in " ".join(
        capsys.readouterr().out.split())
    made_for = [name for name, base in BASES.items() if base.endswith("/" + model.name)]
    tab_value = adapter_box_info(TransformersEngine(str(model), device="cpu", dtype="float32"), str(model), None)[0]
    assert made_for == [tab_value]
    picture = tmp_path / "picture.png"
    make_image(64, 48).save(picture)
    code = main(["lora-diff", "--model", str(model), "--device", "cpu", "--dtype", "float32", "--image", str(picture),
                 "--prompt", "hi", "--max-new-tokens", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"adapter: {tab_value} (the first made for this model; --adapter chooses another)" in err
    data = json.loads(out)
    assert (data["adapter"], data["left"], data["right"]) == (tab_value, "model", f"model + {tab_value}")
    assert "warning:" not in err


def test_lora_diff_without_adapter_and_none_made_for_the_model_is_one_line(tmp_path, capsys):
    """No adapter made for the model (the vision-LoRA checkpoint's folder; an empty folder): one line
    asking for ``--adapter``, before any model loads; base against vision needs none."""
    from g4v.paths import VLORA_MODEL_DIR

    picture = tmp_path / "picture.png"
    make_image(64, 48).save(picture)
    empty = tmp_path / "adapters"
    empty.mkdir()
    line = ("error: --adapter is needed to compare the adapter: no adapter in the adapter folders is made for this "
            "model (or choose --left and --right among base, vision)")
    for model, folder in ((VLORA_MODEL_DIR, None), (BUNDLED_MODEL_DIR, empty)):
        flags = ["--adapters-dir", str(folder)] if folder else []
        code = main(["lora-diff", "--model", str(model), "--image", str(picture), "--prompt", "hi", *flags])
        assert (code, capsys.readouterr().err.strip()) == (1, line)
