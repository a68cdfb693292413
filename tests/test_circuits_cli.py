"""``python -m g4v circuits attention|knockout``, in process: JSON output and one clear line for
each bad input."""

import json

import pytest

from g4v.circuits.attention import image_attention
from g4v.circuits.common import CircuitSettings
from g4v.paths import EXAMPLES_DIR, TRAINED_MODEL_DIR
from tests.cli import run_cli

IMAGE = str(EXAMPLES_DIR / "shapes-square.png")
PROMPT = "What colour is the circle?"
BASE = ["--model", str(TRAINED_MODEL_DIR), "--device", "cpu", "--dtype", "float32", "--image", IMAGE]


def test_attention_json_is_the_library_result():
    from g4v.engines.hf import TransformersEngine

    result = run_cli("circuits", "attention", *BASE, "--prompt", PROMPT, "--layers", "1-3", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    engine = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    try:
        expected = image_attention(engine, IMAGE, PROMPT, CircuitSettings(layers="1-3")).to_dict()
    finally:
        engine.close()
    assert summary["layers"] == [1, 2, 3]
    assert summary["image_share"] == pytest.approx(expected["image_share"], abs=1e-6)
    assert summary["image_tokens"] == expected["image_tokens"]
    # every head's weight on every image token, as the help and the docs promise (it was left out)
    per_head = summary["attention_per_head"]
    assert [len(per_head), len(per_head[0]), len(per_head[0][0])] == [3, summary["num_heads"], summary["num_image_tokens"]]
    for layer, heads in enumerate(per_head):
        assert [sum(column) / len(heads) for column in zip(*heads)] == pytest.approx(summary["mean_attention"][layer],
                                                                                      abs=1e-6)
        assert [sum(row) for row in heads] == pytest.approx(summary["image_share_per_head"][layer], abs=1e-5)
    for got, want in zip(per_head, expected["attention_per_head"], strict=True):
        for got_head, want_head in zip(got, want, strict=True):
            assert got_head == pytest.approx(want_head, abs=1e-6)


def test_reverse_json_is_the_library_result():
    from g4v.circuits.reverse import region_attention
    from g4v.engines.hf import TransformersEngine

    flags = ["--box", "0,0,64,60", "--layers", "7-9", "--max-new-tokens", "2"]
    result = run_cli("circuits", "reverse", *BASE, "--prompt", PROMPT, *flags, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    engine = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    try:
        expected = region_attention(engine, IMAGE, PROMPT, CircuitSettings(layers="7-9", max_new_tokens=2,
                                                                           box="0,0,64,60")).to_dict()
    finally:
        engine.close()
    assert summary["region"] == [0, 0, 64, 60] and summary["layers"] == [7, 8, 9]
    assert summary["region_tokens"] == expected["region_tokens"]
    assert summary["text_tokens"] == expected["text_tokens"]
    for got, want in zip(summary["attention"], expected["attention"], strict=True):
        assert got == pytest.approx(want, abs=1e-6)


def test_knockout_table():
    result = run_cli("circuits", "knockout", *BASE, "--prompt", PROMPT, "--window", "0", "--max-new-tokens", "3")
    assert result.returncode == 0, result.stderr
    assert "first answer token" in result.stdout and "log-probability" in result.stdout
    # window 0 (layers 0-7) leaves 're' the top first token, -0.079 -> -0.094 (docs/circuits.md's
    # table): the table says why blocking the answer's reading can change so little
    from g4v.circuits.knockout import WHY_LITTLE_CHANGES

    assert "top token after: 're'" in result.stdout and WHY_LITTLE_CHANGES in result.stdout.splitlines()


BAD = [
    (["attention", "--layers", "5-2"], "empty"),
    (["attention", "--layers", "0-10"], "out of range"),
    (["knockout", "--layers", "0-99999999999999999999"], "out of range"),
    (["attention", "--layers", "two"], "layers are written"),
    (["attention", "--layers", "-3"], "layers are written"),
    (["attention", "--token", "100000"], "past the prompt"),
    (["attention", "--token", "-100000"], "past the prompt"),
    (["knockout", "--window", "1000"], "larger than"),
    (["knockout", "--window", "1", "--layers", "2-3"], "not both"),
    (["knockout", "--max-new-tokens", "1000000000"], "too long"),
    (["reverse"], "needs a region"),
    (["reverse", "--box", "0,0,5000,10"], "reaches past the picture"),
    (["reverse", "--box", "10,10,5,20"], "empty"),
    (["reverse", "--box", "0,0,10,10", "--layers", "0-10"], "out of range"),
]


@pytest.mark.parametrize("flags,words", BAD, ids=[" ".join(flags) for flags, _ in BAD])
def test_bad_input_is_one_line(flags, words):
    verb, *rest = flags
    result = run_cli("circuits", verb, *BASE, "--prompt", PROMPT, *rest)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert lines[-1].startswith("error:") and words in lines[-1], result.stderr
    assert all(line.startswith("Loading weights") for line in lines[:-1]), result.stderr  # the only other line
    assert "Traceback" not in result.stderr and "/work" not in result.stderr


#: The picture a new user met the old wording with (239 x 127 px).
WIDE = str(EXAMPLES_DIR / "shapes-wide.png")
PAST_EDGE = [("0,0,200,200", "reaches past the picture"), ("0,0,99999,99999", "reaches past the picture"),
             ("-5,10,50,60", "reaches past the picture"), ("239,0,300,50", "is outside the picture"),
             ("0,127,10,200", "is outside the picture")]


@pytest.mark.parametrize("box,said", PAST_EDGE, ids=[box for box, _ in PAST_EDGE])
def test_a_region_past_the_pictures_edge_is_one_exact_line(box, said):
    """A region that overlaps the picture but reaches past its edge is refused as reaching past it
    (it was said to be outside the picture), one that misses it as outside it; both name the
    picture's size, as patching's boxes do, and before any model loads."""
    result = run_cli("circuits", "reverse", "--model", str(TRAINED_MODEL_DIR), "--image", WIDE, "--prompt", PROMPT,
                     f"--box={box}")  # = : argparse reads a lone "-5,..." as a flag
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: the region {box} {said}, which is 239 x 127 px (width x height)"]


def test_attention_out_writes_json_and_pictures(tmp_path):
    from PIL import Image

    from g4v.commands.circuits import ATTENTION_FILES
    from viz.figures import MAX_PICTURE_SIDE

    result = run_cli("circuits", "attention", *BASE, "--prompt", PROMPT, "--out", tmp_path / "att")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == sorted(ATTENTION_FILES)
    summary = json.loads((tmp_path / "att" / "attention.json").read_text())
    assert len(summary["mean_attention"]) == len(summary["layers"]) == 10
    for name in ATTENTION_FILES:
        if name.endswith(".png"):
            with Image.open(tmp_path / "att" / name) as picture:
                assert max(picture.size) <= MAX_PICTURE_SIDE


def test_reverse_out_writes_json_and_picture(tmp_path):
    from PIL import Image

    from g4v.circuits.exports import FILES
    from viz.figures import MAX_PICTURE_SIDE

    result = run_cli("circuits", "reverse", *BASE, "--prompt", PROMPT, "--box", "10,10,60,60", "--max-new-tokens", "2",
                     "--out", tmp_path / "rev")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "rev").iterdir()) == sorted(FILES["reverse"])
    summary = json.loads((tmp_path / "rev" / "reverse.json").read_text())
    assert summary["region"] == [10, 10, 60, 60] and len(summary["attention"]) == 10
    assert "mean attention" in result.stdout  # the table is printed too
    with Image.open(tmp_path / "rev" / "reverse.png") as picture:
        assert max(picture.size) <= MAX_PICTURE_SIDE


#: A flag of each verb given a value argparse itself refuses (a type it cannot convert, a missing
#: required flag, an unknown verb): argparse's own error, before anything loads.
ARGPARSE_BAD = [(["knockout", "--window", "abc"],
                 "circuits knockout: error: argument --window: must be a whole number written with the digits 0-9, got 'abc'"),
                (["knockout", "--window", "-1"], "circuits knockout: error: argument --window: must be a whole number >= 0, got -1"),
                (["attention", "--token", "abc"], "circuits attention: error: argument --token"),
                (["reverse", "--max-new-tokens", "abc"], "circuits reverse: error: argument --max-new-tokens"),
                (["patch", "--max-new-tokens", "1"], "circuits patch: error: the following arguments are required"),
                (["twist"], "circuits: error: argument verb: invalid choice: 'twist'"),
                ([], "circuits: error: the following arguments are required: verb")]


@pytest.mark.parametrize("flags,words", ARGPARSE_BAD, ids=[" ".join(flags) or "no verb" for flags, _ in ARGPARSE_BAD])
def test_argparse_refusals_of_every_verb_are_one_line(flags, words):
    """Every verb's argparse error is one ``python -m g4v circuits VERB: error: ...`` line with status
    2, without argparse's usage block: the verbs' parsers are g4v.cli.OneLineParser, as the top
    level's (argparse gives a nested parser its parent's class; circuits.py names it too)."""
    result = run_cli("circuits", *flags)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()] and "usage" not in result.stderr, result.stderr
    assert result.stderr.startswith("python -m g4v ") and words in result.stderr, result.stderr
