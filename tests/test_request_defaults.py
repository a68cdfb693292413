"""Each request kind's defaults are the same in its command, its library function and its tab: read
from each (argparse's parsed default and ``--help``, the function's signature, the tab's widgets),
compared with its settings dataclass (``SamplingSettings``, ``LoraDiffSettings``,
``PortDiffSettings``, ``InspectSettings``, ``AttributionSettings``)."""

import dataclasses
import inspect

import pytest

from g4v.attribution.settings import AttributionSettings
from g4v.cli import build_parser
from g4v.conversation import SamplingSettings
from g4v.inspect.settings import InspectSettings
from g4v.lora.settings import LoraDiffSettings
from g4v.port.settings import PortDiffSettings
from g4v.settings.flags import flag_of, settings_from_args
from tests.cli import run_cli


def parsed_default(*argv) -> int:
    return build_parser().parse_args(list(argv)).max_new_tokens


def signature_default(function) -> int:
    return inspect.signature(function).parameters["max_new_tokens"].default


def test_commands_and_functions_agree():
    from g4v.inspect.ablation import compare_scaled
    from g4v.inspect.run import run_inspection
    from g4v.port.run import run_port_diff

    assert parsed_default("chat", "p") == SamplingSettings().max_new_tokens == 256
    assert parsed_default("inspect", "--image", "i", "--prompt", "p", "--out", "o") \
        == signature_default(run_inspection) == signature_default(compare_scaled) == 16
    assert parsed_default("lora-diff", "--adapter", "a", "--image", "i", "--prompt", "p") \
        == LoraDiffSettings().sampling().max_new_tokens == 48  # lora_token_diff takes LoraDiffSettings
    assert parsed_default("port-diff", "--image", "i", "--prompt", "p") == signature_default(run_port_diff) == 16


# ── each request kind's settings dataclass: its command's flags and its tab's widgets start there ──

#: (command, its settings class, the flags it requires besides them, fields without a flag)
REQUEST_KINDS = [
    ("chat", SamplingSettings, ["p"], ()),
    ("lora-diff", LoraDiffSettings, ["--image", "i", "--prompt", "p"], ()),
    ("port-diff", PortDiffSettings, ["--image", "i", "--prompt", "p"], ()),
    ("inspect", InspectSettings, ["--image", "i", "--prompt", "p", "--out", "o"], ()),
    ("attribute", AttributionSettings, ["--image", "i", "--prompt", "p", "--out", "o"], ("fractions",)),
]


def field_default(field: dataclasses.Field):
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def words(text: str) -> str:
    """``text`` with argparse's line wrapping undone."""
    return " ".join(text.split())


def shown_default(field: dataclasses.Field) -> str | None:
    """What ``--help`` should say a field's default is; None where it says nothing (no default, or a
    switch, whose default is its absence)."""
    default = field_default(field)
    if default is None or isinstance(default, bool):
        return None
    return "none" if default in ((), []) else str(default)


@pytest.mark.parametrize("command, cls, required, unflagged", REQUEST_KINDS, ids=[kind[0] for kind in REQUEST_KINDS])
def test_help_shows_each_field_with_its_dataclass_default(command, cls, required, unflagged):
    """``COMMAND --help`` (in process, as ``python -m g4v`` runs it) starts with a description line,
    lists one flag per field with its help, its choices and the dataclass's default; with no flag
    given, the parsed value of every field is the dataclass's default and the settings built from
    them equal ``cls()``."""
    done = run_cli(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n\n")[1].strip() and not done.stdout.split("\n\n")[1].startswith("options")
    shown = words(done.stdout)
    fields = [field for field in dataclasses.fields(cls) if field.name not in unflagged]
    for field in fields:
        assert flag_of(field) in shown, field.name
        assert words(field.metadata["help"]) in shown, field.name
        if "choices" in field.metadata:
            assert "{" + ",".join(field.metadata["choices"]) + "}" in shown, field.name
        if shown_default(field) is not None:
            assert words(field.metadata["help"]) + f" (default: {shown_default(field)})" in shown, field.name
    args = build_parser().parse_args([command, *required])
    assert {f.name: getattr(args, f.name) for f in fields} == {f.name: list(field_default(f))
                                                               if isinstance(field_default(f), tuple) else field_default(f)
                                                               for f in fields}
    assert settings_from_args(cls, args, exclude=unflagged) == cls()


def test_flags_given_reach_the_settings():
    """Every field set from its flag, a value unlike its default (the list flags repeatable)."""
    parser = build_parser()
    given = parser.parse_args(["inspect", "--image", "i", "--prompt", "p", "--out", "o", "--ablate", "deepstack0", "3",
                               "--ablate", "spatial_TL", "--scale", "deepstack1=0.5", "--full", "--max-new-tokens", "0"])
    assert settings_from_args(InspectSettings, given) == InspectSettings(
        ablate=["deepstack0", "3", "spatial_TL"], scale=["deepstack1=0.5"], full=True, max_new_tokens=0)
    given = parser.parse_args(["lora-diff", "--image", "i", "--prompt", "p", "--adapter", "a", "--left", "base", "--right", "vision",
                               "--max-new-tokens", "5"])
    assert settings_from_args(LoraDiffSettings, given) == LoraDiffSettings("a", "base", "vision", 5)
    given = parser.parse_args(["port-diff", "--image", "i", "--prompt", "p", "--max-new-tokens", "2", "--atol", "0.5",
                               "--rtol", "0", "--vision-lora", "off", "--vllm-vision-lora", "merged",
                               "--vllm-serving", "{}"])
    assert settings_from_args(PortDiffSettings, given) == PortDiffSettings(2, 0.5, 0.0, "off", "merged", "{}")
    given = parser.parse_args(["chat", "--max-new-tokens", "7", "--temperature", "0.5", "--top-p", "0.9",
                               "--seed", "3", "p"])
    assert settings_from_args(SamplingSettings, given) == SamplingSettings(7, 0.5, 0.9, 3)
    given = parser.parse_args(["attribute", "--image", "i", "--prompt", "p", "--out", "o", "--target", " red",
                               "--against", " blue", " green", "--against", " grey", "--method", "ig",
                               "--steps", "4", "--deletion-level", "deepstack1", "--deletion-ranking", "signed",
                               "--seeds", "2", "--no-lens", "--max-new-tokens", "5"])
    assert settings_from_args(AttributionSettings, given, exclude=("fractions",)) == AttributionSettings(
        target=" red", against=(" blue", " green", " grey"), method="ig", steps=4, deletion_level="deepstack1",
        deletion_ranking="signed", seeds=2, lens=False, max_new_tokens=5)
    given = parser.parse_args(["attribute", "--image", "i", "--prompt", "p", "--out", "o", "--token", "all"])
    assert settings_from_args(AttributionSettings, given, exclude=("fractions",)).token is None


def widget_values(build) -> dict:
    """``{elem_id or label: value}`` of the input widgets ``build()`` renders into a page."""
    import gradio as gr

    with gr.Blocks() as page:
        build()
    return {getattr(block, "elem_id", None) or getattr(block, "label", None): getattr(block, "value", None)
            for block in page.blocks.values()}


def test_tabs_start_at_the_settings_defaults(hf_engine):
    import gradio as gr

    from g4v.loading import load_config
    from g4v.paths import ASSETS_DIR, BUNDLED_MODEL_DIR
    from webapp.attribution import attribution_tab
    from webapp.chat import chat_tab
    from webapp.common import sampling_settings
    from webapp.deepstack import deepstack_tab
    from webapp.lora import lora_tab
    from webapp.port import port_tab

    sampling, lora, port, inspect_ = SamplingSettings(), LoraDiffSettings(), PortDiffSettings(), InspectSettings()
    chat = widget_values(lambda: chat_tab(None, gr.State(), []))
    assert (chat["Max new tokens"], chat["Temperature (0 = greedy)"], chat["Top-p"]) \
        == (sampling.max_new_tokens, sampling.temperature, sampling.top_p)
    assert sampling_settings(8, seed=chat["Seed (-1 = random)"]).seed is sampling.seed  # the box reads back as None
    tab = widget_values(lambda: lora_tab(hf_engine, str(BUNDLED_MODEL_DIR), ASSETS_DIR / "adapters", gr.State()))
    assert (tab["lora-left"], tab["lora-right"], tab["Max new tokens"], tab["Temperature (0 = greedy)"]) \
        == (lora.left, lora.right, lora.max_new_tokens, sampling.temperature)
    tab = widget_values(lambda: port_tab(str(BUNDLED_MODEL_DIR), gr.State()))
    assert (tab["port-vision-lora"], tab["port-vllm-vision-lora"]) == (port.vision_lora, port.vllm_vision_lora)
    tab = widget_values(lambda: deepstack_tab(None, load_config(BUNDLED_MODEL_DIR), gr.State(), None))
    assert (tab["Ablate (zero) these levels"], tab["Scale levels"], tab["Keep full tensors in the export"]) \
        == (inspect_.ablate, ", ".join(inspect_.scale), inspect_.full)
    attribution = AttributionSettings()
    tab = widget_values(lambda: attribution_tab(None, None, gr.State(), None))
    assert (tab["attribution-token"], tab["Method"], tab["attribution-against"]) \
        == (str(attribution.token), attribution.method, ", ".join(attribution.against))
    assert tab["Deletion test at one level only"] == "" and attribution.deletion_level is None  # "" reads as None


def test_the_deletion_level_picker_names_its_empty_choice():
    """Its default (every level) shows as a word, not as a blank entry."""
    import gradio as gr

    from webapp.attribution import attribution_tab

    with gr.Blocks() as page:
        attribution_tab(None, None, gr.State(), None)
    picker, = [block for block in page.blocks.values() if getattr(block, "label", "") == "Deletion test at one level only"]
    assert picker.choices[0] == ("(all levels)", "") and picker.value == ""
