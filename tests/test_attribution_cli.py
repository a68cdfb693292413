"""``python -m g4v attribute`` and ``bench attribute`` as a user runs them: the files it writes, and
one line for bad input (checked before the model loads)."""

import json

import pytest
from safetensors.torch import load_file

from g4v.cli import main
from g4v.paths import BUNDLED_MODEL_DIR
from tests.conftest import make_image


def _cli(capsys, *args) -> tuple[int, str, str]:
    """``python -m g4v ARGS`` in this process (the CLI's own entry point): status, stdout, stderr
    (a bad flag is argparse's ``SystemExit``, as the process would exit)."""
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    path = tmp_path_factory.mktemp("attribute") / "picture.png"
    make_image(160, 120, seed=5).save(path)
    return path


@pytest.mark.slow  # about 10 s on a quiet 2-core machine
def test_attribute_writes_json_pngs_and_tensors_that_agree(picture, tmp_path, capsys):
    from g4v.attribution.run import FIGURE_FILES

    out = tmp_path / "out"
    code, stdout, stderr = _cli(capsys, "attribute", "--model", str(BUNDLED_MODEL_DIR), "--dtype", "float32", "--image", str(picture),
                "--prompt", "What is it?", "--target", " red square", "--token", "all", "--seeds", "2",
                "--out", str(out))
    assert code == 0, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["answer"]["target"] is None and summary["answer"]["teacher_forced"]
    assert "".join(summary["answer"]["tokens"]) == " red square"
    for name in FIGURE_FILES.values():
        assert (out / name).stat().st_size > 1000
    tensors = load_file(str(out / "attribution.safetensors"))
    assert tensors["scores"].shape == (8, summary["num_image_tokens"])
    totals = tensors["scores"].sum(1).tolist()
    assert totals == pytest.approx(list(summary["attribution"]["level_totals"].values()), rel=1e-5, abs=1e-7)
    assert tensors["deletion.random"].shape == (2, len(summary["deletion"]["fractions"]))
    assert "explained: the whole answer ' red square' (log-probability " in stdout
    assert summary["attribution"]["measure"] == "log-probability"
    assert sorted(summary["files"].values()) == sorted(p.name for p in out.iterdir())


@pytest.mark.slow  # about 7 s on a quiet 2-core machine
def test_a_contrast_is_a_log_odds_and_no_lens_lists_no_lens_files(picture, tmp_path, capsys):
    """Issue 31 item 9: with --against the explained number is a log-odds, in every label; with
    --no-lens summary.json lists only the files written (the tab's report: test_readable_words)."""
    out = tmp_path / "out"
    code, stdout, stderr = _cli(capsys, "attribute", "--model", str(BUNDLED_MODEL_DIR), "--dtype", "float32",
                                "--image", str(picture), "--prompt", "What colour is it?", "--target", " red",
                                "--against", " blue", " green", "--seeds", "1", "--no-lens", "--out", str(out))
    assert code == 0, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["files"].values()) == sorted(p.name for p in out.iterdir())
    assert "lens" not in summary["files"] and "lens_levels" not in summary["files"]
    assert summary["attribution"]["measure"] == "log-odds"
    value = summary["attribution"]["target_value"]
    assert value == pytest.approx(summary["deletion"]["attributed"][0], abs=1e-5)  # nothing removed yet
    assert f"(log-odds {value:.4g})" in stdout and "log-prob" not in stdout


@pytest.mark.parametrize("args, code, words", [
    (["--image", "missing.png"], 1, "error: "),
    (["--prompt", "  "], 1, "error: the prompt is empty"),
    # bad flags: argparse's line, naming the flag (exit 2)
    (["--token", "first"], 2, "error: argument --token: must be a whole number or 'all'"),
    (["--against", "blue", "--token", "1"], 2, "error: argument --token: not allowed with argument --against"),
])
def test_attribute_bad_input_is_one_line(picture, tmp_path, capsys, args, code, words):
    base = {"--image": str(picture), "--prompt": "What is it?", "--out": str(tmp_path / "o")}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    got, _, stderr = _cli(capsys, "attribute", *[x for pair in base.items() for x in pair])
    lines = stderr.strip().splitlines()
    assert got == code and len(lines) == 1 and words in lines[0], stderr
    assert not (tmp_path / "o").exists()  # refused before anything was written
