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
from g4v.commands.settings_flags import flag_of
from g4v.conversation import SamplingSettings
from g4v.engines.vllm_engine import VLLMSettings
from g4v.errors import G4VError, check_fields
from g4v.evaluate.run import EvalConfig
from g4v.inspect.settings import InspectSettings
from g4v.lora.settings import LoraDiffSettings
from g4v.port.settings import PortDiffSettings
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


RE_SHARE = re.compile(r"must be a number (between 0 and 1|above 0 and up to 1)( \(0\.02 = 2 points\))?, "
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
