"""``python -m g4v chat``: answers on stdout; each bad input is one line on stderr and exit 1."""

import subprocess
import sys

import pytest

from g4v.paths import EXAMPLES_DIR, REPO_ROOT
from tests.conftest import make_image

EXAMPLE = EXAMPLES_DIR / "shapes-wide.png"


def g4v(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "g4v", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(result, *words):
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_chat_streams_an_answer_about_images(tmp_path):
    second = tmp_path / "tall.png"
    make_image(120, 360).save(second)
    result = g4v("chat", "--image", str(EXAMPLE), "--image", str(second), "--max-new-tokens", "8", "Which is larger?")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_chat_text_only_with_seeded_sampling():
    args = ("chat", "--max-new-tokens", "8", "--temperature", "1.0", "--seed", "3", "Hello")
    first, second = g4v(*args), g4v(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout


@pytest.fixture
def bad_files(tmp_path):
    text = tmp_path / "notes.png"
    text.write_text("this is not a picture")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(EXAMPLE.read_bytes()[:200])
    return {"text": text, "truncated": truncated, "folder": tmp_path}


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", ["image not found", "nope.png"]),
        ("text", ["not an image", "notes.png"]),
        ("truncated", ["corrupt or truncated", "truncated.png"]),
        ("folder", ["not a file"]),
        ("empty-prompt", ["prompt is empty"]),
        ("unknown-model", ["model folder not found", "no-such-model"]),
        ("not-a-model", ["no config.json"]),
        ("bad-temperature", ["temperature"]),
    ],
)
def test_bad_input_gives_one_line(bad_files, tmp_path, case, words):
    args = {
        "missing": ["--image", str(tmp_path / "nope.png"), "hi"],
        "text": ["--image", str(bad_files["text"]), "hi"],
        "truncated": ["--image", str(bad_files["truncated"]), "hi"],
        "folder": ["--image", str(bad_files["folder"]), "hi"],
        "empty-prompt": ["--image", str(EXAMPLE), "  "],
        "unknown-model": ["--model", str(tmp_path / "no-such-model"), "hi"],
        "not-a-model": ["--model", str(tmp_path), "hi"],
        "bad-temperature": ["--temperature", "-2", "hi"],
    }[case]
    assert_one_line_error(g4v("chat", *args), *words)


def test_bad_flags_give_one_line():
    assert_one_line_error(g4v("chat", "--max-new-tokens", "many", "hi"), "--max-new-tokens")
    assert_one_line_error(g4v("chat"), "prompt")
