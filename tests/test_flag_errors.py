"""Bad flag values are refused in one style by every command: argparse's one line, naming the flag
the user typed (``argument --max-new-tokens: ...``), exit status 2. The range checks are the
settings dataclasses' own (``metadata["check"]``), which the UI and the API run too, naming the field."""

import argparse
import dataclasses
import re

import pytest

from g4v.attribution.settings import AttributionSettings
from g4v.circuits.common import CircuitSettings
from g4v.cli import build_parser
from g4v.conversation import SamplingSettings
from g4v.engines.vllm_settings import VLLMSettings
from g4v.errors import G4VError, check_fields
from g4v.evaluate.run import EvalConfig
from g4v.inspect.settings import InspectSettings
from g4v.lora.settings import LoraDiffSettings
from g4v.port.settings import PortDiffSettings
from g4v.settings.flags import flag_of
from tests.cli import run_cli


def commands(parser: argparse.ArgumentParser, prefix=()):
    """``(argv prefix, parser)`` for every command and sub-command (``circuits knockout``, ``bench eval``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if getattr(sub, "add_flags", None):  # a bench target adds its flags when chosen
                    sub.add_flags(sub)
                    sub.add_flags = None
                yield (*prefix, name), sub
                yield from commands(sub, (*prefix, name))


def reads(kind, text: str) -> bool:
    try:
        kind(text)
        return True
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False


def numeric_flags():
    """Every flag, in every command, whose type reads a number (0.5, 1 or 100, whichever is in its
    range) and refuses "x"."""
    found = []
    for argv, parser in commands(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.type is not None and any(reads(action.type, n) for n in ("0.5", "1", "100")) \
                    and not reads(action.type, "x"):
                found.append((argv, action.option_strings[-1]))
    return found


NUMERIC = numeric_flags()


def test_the_walk_finds_the_commands_numeric_flags():
    flags = {(" ".join(argv), flag) for argv, flag in NUMERIC}
    assert {("chat", "--max-new-tokens"), ("chat", "--tensor-parallel-size"), ("attribute", "--steps"),
            ("eval", "--limit"), ("tiling", "--dpi"), ("circuits knockout", "--window"),
            ("bench eval", "--max-new-tokens"), ("port-diff", "--atol")} <= flags


def refusal(*argv):
    result = run_cli(*argv)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("argv, flag", NUMERIC, ids=[" ".join(argv) + " " + flag for argv, flag in NUMERIC])
def test_a_value_that_is_no_number_is_one_line_naming_the_flag(argv, flag):
    assert f"error: argument {flag}: " in refusal(*argv, flag, "x")


#: (command, settings class): the commands whose flags are a settings class's fields.
SETTINGS = [("chat", SamplingSettings), ("chat", VLLMSettings), ("lora-diff", LoraDiffSettings),
            ("port-diff", PortDiffSettings), ("inspect", InspectSettings), ("attribute", AttributionSettings),
            ("eval", EvalConfig), ("circuits knockout", CircuitSettings)]
CHECKED = [(command, field) for command, cls in SETTINGS for field in dataclasses.fields(cls) if "check" in field.metadata]
BAD = -1_000_000  # outside every checked field's range


@pytest.mark.parametrize("command, field", CHECKED, ids=[f"{command} {field.name}" for command, field in CHECKED])
def test_an_out_of_range_value_is_refused_by_the_flag_with_the_settings_own_words(command, field):
    """The flag refuses what the dataclass refuses, with its words, but naming the flag."""
    typed = float(BAD) if "float" in str(field.type) else BAD  # the value as the flag reads it
    with pytest.raises(ValueError) as raised:
        field.metadata["check"](typed)
    line = refusal(*command.split(), f"{flag_of(field)}={BAD}")
    assert line.endswith(f"error: argument {flag_of(field)}: {raised.value}"), line


def test_the_dataclass_check_names_the_field():
    """The UI's and the API's path: the same check, through the dataclass, names the field."""
    with pytest.raises(G4VError, match=r"^max_new_tokens must be a whole number from 1 to 1024, got 0$"):
        SamplingSettings(max_new_tokens=0).validated()
    with pytest.raises(G4VError, match=r"^seeds must be a whole number from 1 to 50, got 0$"):
        AttributionSettings(seeds=0).checked()
    with pytest.raises(G4VError, match=r"^tensor_parallel_size must be a whole number >= 1, got 0$"):
        check_fields(VLLMSettings(tensor_parallel_size=0))


RE_WHOLE = re.compile(r"must be a whole number (from \d+ to \d+|>= \d+), got (-1000000|2\.5)")
WHOLE = [(command, field) for command, field in CHECKED if field.type in (int, "int", int | None, "int | None")]


def test_every_whole_number_setting_is_refused_in_one_wording():
    """Whole-number settings share one check (``g4v.errors.whole_number``): a fraction and a value
    below the range get the same sentence in every command, with the range it allows."""
    assert len(WHOLE) >= 12, [field.name for _, field in WHOLE]
    for _, field in WHOLE:
        for bad in (BAD, 2.5):
            with pytest.raises(ValueError) as raised:
                field.metadata["check"](bad)
            assert RE_WHOLE.fullmatch(str(raised.value)), (field.name, str(raised.value))


RE_SHARE = re.compile(r"must be a number (between 0 and 1|above 0 and up to 1|of at least 0\.001 and below 1)"
                      r"( \(0\.02 = 2 points\))?, "
                      r"got (-1000000\.0|1\.5|True|'0\.5')")


def refuses(check, value) -> bool:
    try:
        check(value)
    except ValueError:
        return True
    return False


#: The float settings that cannot be 1.5 (temperature can): shares of something.
SHARES = [(command, field) for command, field in CHECKED if "float" in str(field.type) and refuses(field.metadata["check"], 1.5)]


def test_every_share_setting_is_refused_in_one_wording():
    """Settings that are a share of something (Evaluate's margin and discordance, vLLM's memory,
    top-p) share one check (``g4v.errors.share``); vLLM's memory and top-p allow all of it (1)."""
    assert {field.name for _, field in SHARES} == {"margin", "discordance", "gpu_memory_utilization", "top_p"}
    for _, field in SHARES:
        check = field.metadata["check"]
        for bad in (float(BAD), 1.5, True, "0.5"):
            with pytest.raises(ValueError) as raised:
                check(bad)
            assert RE_SHARE.fullmatch(str(raised.value)), (field.name, str(raised.value))
        check(0.5)
        if field.name in ("gpu_memory_utilization", "top_p"):
            check(1.0)
        else:
            with pytest.raises(ValueError):
                check(1.0)


@pytest.mark.parametrize("argv, line", [
    (("bench", "engines", "--backends", "hf", "--chats", "0"), "error: --chats must be a whole number >= 1, got 0"),
    (("bench", "inspect", "--repeats", "0"), "error: --repeats must be a whole number >= 1, got 0"),
])
def test_a_benchs_own_counts_are_refused_in_the_same_words(argv, line):
    result = run_cli(*argv)
    assert result.returncode == 1 and result.stderr.strip() == line


# ── numbers as typed: odd Unicode, signs, huge exponents (issue 49, U1 and U2) ─────────────────────


def odd_numbers(seed: int = 49, count: int = 40) -> list[str]:
    """Texts that Unicode, ``str.isdigit``, ``int`` or ``float`` may take for numbers but that are no
    number written with the digits 0-9 (or, for the last ones, no finite one): the red team's ``²``,
    other scripts' digits, look-alike signs, a separator, huge exponents; then ``count`` more made at
    random (a seeded generator) from every Unicode digit, number and sign character."""
    import random
    import sys
    import unicodedata

    rng = random.Random(seed)
    pool = [chr(c) for c in range(0x80, sys.maxunicode + 1) if unicodedata.category(chr(c)) in ("Nd", "No", "Nl")]
    signs = ["\u2212", "\uff0b", "\uff0d", "\u207a", "\u207b", "\u2012", "\ufe63"]
    fixed = ["²", "³", "¹⁰", "٣", "١٢", "１", "１２", "𝟙", "Ⅷ", "½", "1_0", "\u22121", "1e999", "-1e999", "1e99999",
             "9" * 60, "nan", "inf", "0x10", "1,5", "1.5.1", "", " "]
    made = []
    while len(made) < count:
        text = "".join(rng.choice(["1", "2", "0", rng.choice(pool)]) for _ in range(rng.randint(1, 5)))
        text = (rng.choice(signs) if rng.random() < 0.3 else "") + text
        if not text.isascii():
            made.append(text)
    return fixed + made


ODD = odd_numbers()


@pytest.mark.parametrize("argv, flag", NUMERIC, ids=[" ".join(argv) + " " + flag for argv, flag in NUMERIC])
def test_every_numeric_flag_refuses_odd_unicode_and_huge_numbers(argv, flag):
    """Each numeric flag's reader refuses every odd text (before, ``int`` read "٣" as 3 and "²"
    passed a digit check and then raised), with its own one line; whole-number flags refuse
    fractions and floats too."""
    parser = dict(commands(build_parser()))[tuple(argv)]
    [action] = [a for a in parser._actions if flag in a.option_strings]
    for text in ODD:
        assert not reads(action.type, text), (flag, text)
    for text in ("1", "0.5", "2.5", "1e2"):
        if reads(action.type, text):  # what a flag reads is a plain ASCII number
            value = action.type(text)
            assert value == (int(text) if text == "1" else float(text)), (flag, text, value)
    line = refusal(*argv, flag, ODD[0])
    assert f"error: argument {flag}: " in line and "²" in line


#: Command lines whose text settings hold numbers (layers, levels, kept percentages, an arm's keep=):
#: each odd number in them is one line, exit 1 or 2, never a traceback.
TEXT_NUMBERS = [
    ("circuits", "attention", "--image", "IMAGE", "--prompt", "hi", "--layers", "{}"),
    ("circuits", "attention", "--image", "IMAGE", "--prompt", "hi", "--layers", "2-{}"),
    ("circuits", "patch", "--image", "IMAGE", "--other", "IMAGE", "--prompt", "hi", "--levels", "{}"),
    ("eval", "--a", "hf:keep={}", "--b", "same", "--data", "DATA", "--out", "OUT"),
    ("eval", "--a", "hf", "--keep-sweep", "100,{}", "--data", "DATA", "--out", "OUT"),
    ("inspect", "--image", "IMAGE", "--prompt", "hi", "--scale", "{}=2"),
    ("attribute", "--image", "IMAGE", "--prompt", "hi", "--token", "{}"),
]


@pytest.mark.parametrize("argv", TEXT_NUMBERS, ids=[" ".join(argv[:2]) + " " + argv[-2] for argv in TEXT_NUMBERS])
def test_numbers_inside_text_settings_refuse_odd_unicode_in_one_line(argv, tmp_path):
    from g4v.evaluate import BUNDLED_DATASET
    from g4v.paths import EXAMPLES_DIR

    places = {"IMAGE": str(EXAMPLES_DIR / "shapes-tall.png"), "DATA": str(BUNDLED_DATASET), "OUT": str(tmp_path)}
    for text in ["²", "٣", "１", "\u22121", "1e999", *ODD[-5:]]:
        typed = [places.get(part, part.replace("{}", text)) for part in argv]
        result = run_cli(*typed)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode in (1, 2) and len(lines) == 1 and "Traceback" not in result.stderr, (typed, result.stderr)
        assert not (tmp_path / "run.json").exists()  # refused before any run


def test_each_number_box_of_the_app_refuses_odd_unicode_in_one_line():
    """The app's readers of typed numbers (and the API's, which sends any value): every odd text
    is one G4VError (a toast), never a number and never another exception."""
    from g4v.circuits.common import parse_layers
    from g4v.circuits.patching import chosen_levels
    from g4v.evaluate.budget import parse_keeps
    from g4v.model.levels import find_level, level_scales, parse_scale_specs
    from g4v.paths import BUNDLED_MODEL_DIR
    from g4v.loading import load_config
    from g4v.model.levels import describe_levels
    from webapp.attribution import token_choice
    from webapp.common import optional_whole, sampling_settings
    from webapp.evaluate_equivalence import checked_share, plan_text
    from webapp.evaluate_tables import whole_or_none

    levels = describe_levels(load_config(BUNDLED_MODEL_DIR))
    boxes = {
        "circuits token / window": lambda text: optional_whole(text, "token"),
        "circuits layers": lambda text: parse_layers(text, 4),
        "circuits levels": lambda text: chosen_levels(levels, text),
        "deepstack level": lambda text: find_level(levels, text),
        "deepstack scales": lambda text: level_scales(levels, (), parse_scale_specs([f"deepstack0={text}"])),
        "budget kept list": lambda text: parse_keeps(f"100,{text}"),
        "attribution token": lambda text: token_choice(f"{text}: 'red'"),
        "evaluate rows": lambda text: whole_or_none(text, "Rows", smallest=1, means_none=0, none_reads="all"),
        "evaluate margin": lambda text: checked_share(text, "Equivalence margin"),
        "sampling": lambda text: sampling_settings(text),
    }
    for name, box in boxes.items():
        for text in ODD:
            if name in ("circuits token / window", "evaluate rows") and not text.strip():
                continue  # an empty box means "none" there
            if name in ("circuits levels", "budget kept list") and text == "1,5":
                continue  # a list there: levels 1 and 5, kept 1% and 5%
            with pytest.raises(G4VError) as refused:
                box(text)
            assert "\n" not in str(refused.value), (name, text)
    assert plan_text(100, 0, 0.1, "²") == plan_text(100, 0, 0.1, 1e-300) == ""  # the plan line waits for a valid margin


def test_a_margin_too_small_to_compute_is_refused_in_one_line(tmp_path):
    """``--margin 1e-300`` printed an OverflowError traceback (the rows needed overflow a float)."""
    from g4v.evaluate import BUNDLED_DATASET
    from g4v.evaluate.run import MIN_MARGIN

    line = refusal("eval", "--a", "hf", "--b", "same", "--data", str(BUNDLED_DATASET), "--out", str(tmp_path),
                   "--margin", "1e-300")
    assert line.endswith(f"argument --margin: must be a number of at least {MIN_MARGIN:g} and below 1 "
                         "(0.02 = 2 points), got 1e-300")
    with pytest.raises(G4VError, match="margin must be a number of at least 0.001"):
        check_fields(EvalConfig(a=None, b=None, data="", margin=1e-300))  # the dataclass's own check, as the API's


def output_flags():
    """Every flag, in every command, that names a folder or a file the command writes."""
    from g4v.commands.common import output_file, output_folder

    return [(argv, action.option_strings[-1], action.type) for argv, parser in commands(build_parser())
            for action in parser._actions if action.type in (output_folder, output_file)]


OUTPUTS = output_flags()


def test_the_walk_finds_every_output_flag():
    found = {(" ".join(argv), flag) for argv, flag, _ in OUTPUTS}
    assert {("circuits attention", "--out"), ("circuits knockout", "--out"), ("inspect", "--out"), ("attribute", "--out"),
            ("eval", "--out"), ("tiling", "--png"), ("lora-diff", "--png"), ("lora-diff", "--plot"),
            ("port-diff", "--png"), ("bench engines", "--markdown")} <= found


@pytest.mark.parametrize("argv, flag, kind", OUTPUTS, ids=[" ".join(argv) + " " + flag for argv, flag, _ in OUTPUTS])
def test_an_output_that_cannot_be_written_is_one_line_naming_the_flag(argv, flag, kind, tmp_path):
    """``--out /proc/self`` was a FileNotFoundError traceback once the work was done; now every
    output flag is checked as it is read, before any model loads."""
    from g4v.commands.common import output_folder

    a_file = tmp_path / "taken.txt"
    a_file.write_text("x")
    bad = ["/proc/self", str(a_file)] if kind is output_folder else ["/proc/self/out.png", str(tmp_path)]
    for path in bad:
        line = refusal(*argv, f"{flag}={path}")
        assert f"error: argument {flag}: " in line and repr(path) in line, line
