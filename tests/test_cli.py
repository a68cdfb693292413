"""``python -m g4v chat``: answers on stdout; each bad input is one line on stderr and exit 1."""

import subprocess
import sys

import pytest

from g4v.paths import EXAMPLES_DIR, REPO_ROOT
from tests.cli import run_cli
from tests.conftest import make_image

EXAMPLE = EXAMPLES_DIR / "shapes-wide.png"


def g4v(*args):
    return run_cli(*args)


def g4v_process(*args, timeout=180):
    """A real ``python -m g4v``: kept for the few tests that prove the entry point itself works."""
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


@pytest.mark.slow  # starts python -m g4v or python itself
def test_chat_streams_an_answer_about_images(tmp_path):
    """The entry point itself: a new ``python -m g4v`` streams the greedy answer that the engine
    on the default checkpoint gives in this process."""
    from g4v.conversation import Message, SamplingSettings
    from g4v.engines.hf import TransformersEngine
    from g4v.images import open_image
    from g4v.paths import default_model

    second = tmp_path / "tall.png"
    make_image(120, 360).save(second)
    result = g4v_process("chat", "--image", str(EXAMPLE), "--image", str(second), "--max-new-tokens", "8", "Which is larger?")
    assert result.returncode == 0, result.stderr
    messages = [Message("user", "Which is larger?", [open_image(str(EXAMPLE)), open_image(str(second))])]
    engine = TransformersEngine(default_model(), device="cpu", dtype="float32")
    assert result.stdout == engine.generate(messages, SamplingSettings(max_new_tokens=8)).text + "\n"


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
        ("mistyped-bundled-model", ["model folder not found", "granite4-vision-tiny-document"]),
        ("task-without-image", ["--task chart2csv", "--image"]),
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
        # A folder under assets/ (one slash, like a hub id), one letter short: not sent to the hub.
        "mistyped-bundled-model": ["--model", "assets/granite4-vision-tiny-document", "hi"],
        "task-without-image": ["--task", "chart2csv"],
        "not-a-model": ["--model", str(tmp_path), "hi"],
        "bad-temperature": ["--temperature", "-2", "hi"],
    }[case]
    assert_one_line_error(g4v("chat", *args), *words)


def test_bad_flags_give_one_line():
    assert_one_line_error(g4v_process("chat", "--max-new-tokens", "many", "hi"), "--max-new-tokens")
    assert_one_line_error(g4v("chat"), "prompt")


# ── limits shared with the app, and text that is not text ──────────────────────────────────────


def test_chat_refuses_more_images_than_the_app_allows():
    from g4v.conversation import MAX_IMAGES_PER_MESSAGE

    images = ["--image", str(EXAMPLE)] * (MAX_IMAGES_PER_MESSAGE + 1)
    assert_one_line_error(g4v("chat", *images, "hi"), f"too many images: {MAX_IMAGES_PER_MESSAGE + 1}",
                          f"the limit is {MAX_IMAGES_PER_MESSAGE}")


def test_chat_refuses_more_new_tokens_than_the_app_allows():
    from g4v.conversation import MAX_NEW_TOKENS

    result = g4v("chat", "--max-new-tokens", str(MAX_NEW_TOKENS + 1), "hi")
    assert_one_line_error(result, f"argument --max-new-tokens: must be a whole number from 1 to {MAX_NEW_TOKENS}, got {MAX_NEW_TOKENS + 1}")
    assert result.returncode == 2


#: Bytes that are not UTF-8, as Python hands them to the program (argv decoded with surrogateescape).
NOT_UTF8 = b"\xff\xfe".decode("utf-8", "surrogateescape")
LONG_NAME = "a" * 5000


@pytest.mark.parametrize("args, words", [
    (["chat", NOT_UTF8], ["the prompt is not valid UTF-8 text (byte 0xff at character 1)"]),
    (["chat", "--adapter", NOT_UTF8, "hi"], ["--adapter", "not valid UTF-8"]),
    (["inspect", "--image", str(EXAMPLE), "--out", "{tmp}/out", "--prompt", NOT_UTF8], ["the prompt is not valid UTF-8 text (byte 0xff at character 1)"]),
    (["lora-diff", "--adapter", "demo-lora", "--image", str(EXAMPLE), "--prompt", NOT_UTF8], ["the prompt is not valid UTF-8 text (byte 0xff at character 1)"]),
    (["lora-diff", "--adapter", NOT_UTF8, "--image", str(EXAMPLE), "--prompt", "hi"], ["--adapter", "not valid UTF-8"]),
    (["merge-lora", "--adapter", NOT_UTF8, "--out", "{tmp}/merged"], ["--adapter", "not valid UTF-8"]),
    (["chat", "--adapter", LONG_NAME, "hi"], ["adapter name is too long (5000 characters; the limit is 255)"]),
    (["lora-diff", "--adapter", LONG_NAME, "--image", str(EXAMPLE), "--prompt", "hi"], ["adapter name is too long"]),
    (["merge-lora", "--adapter", LONG_NAME, "--out", "{tmp}/merged"], ["adapter name is too long"]),
])
def test_text_flags_that_are_not_usable_give_one_line(tmp_path, args, words):
    """Checked before any model loads (a model load writes its own progress lines to stderr)."""
    result = g4v(*[arg.format(tmp=tmp_path) for arg in args])
    assert_one_line_error(result, *words)
    assert result.returncode == 1 and LONG_NAME not in result.stderr and "/assets/" not in result.stderr


# ── chat with an adapter ───────────────────────────────────────────────────────────────────────


def test_chat_streams_the_adapters_answer(hf_engine):
    from g4v.conversation import Message, SamplingSettings
    from g4v.images import open_image
    from g4v.lora.activation import activate_adapter
    from g4v.paths import BUNDLED_MODEL_DIR

    result = g4v("chat", "--model", str(BUNDLED_MODEL_DIR), "--device", "cpu", "--dtype", "float32",
                 "--adapter", "demo-lora", "--image", str(EXAMPLE), "--max-new-tokens", "12", "What is it?")
    assert result.returncode == 0, result.stderr
    messages = [Message("user", "What is it?", [open_image(str(EXAMPLE))])]
    settings = SamplingSettings(max_new_tokens=12)
    name = activate_adapter(hf_engine, "demo-lora").name
    assert result.stdout == hf_engine.generate(messages, settings, adapter=name).text + "\n"
    assert result.stdout != hf_engine.generate(messages, settings).text + "\n"


def test_chat_reads_adapters_from_the_adapters_dir(tmp_path):
    import shutil

    from g4v.paths import ASSETS_DIR, BUNDLED_MODEL_DIR

    shutil.copytree(ASSETS_DIR / "adapters" / "demo-lora", tmp_path / "team" / "mine")
    common = ("chat", "--model", str(BUNDLED_MODEL_DIR), "--device", "cpu", "--dtype", "float32",
              "--max-new-tokens", "6", "hi")
    ours = g4v(*common[:-1], "--adapter", "team/mine", "--adapters-dir", str(tmp_path), "hi")
    bundled = g4v(*common[:-1], "--adapter", "demo-lora", "hi")
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == bundled.stdout
    assert_one_line_error(g4v(*common[:-1], "--adapter", "demo-lora", "--adapters-dir", str(tmp_path), "hi"),
                          "unknown adapter 'demo-lora'")


#: Imported only when a command runs: ``--help`` (each command's too) builds without them.
HEAVY = ("torch", "transformers", "gradio", "vllm")
HELP_WITHOUT_HEAVY = f"""
import sys
for name in {HEAVY!r}:
    sys.modules[name] = None  # an import of it fails
from g4v.cli import COMMANDS, main
for argv in [[], *([name.replace("_", "-")] for name in COMMANDS), ["bench", "eval"], ["circuits", "knockout"]]:
    try:
        main([*argv, "--help"])
    except SystemExit as done:
        assert done.code == 0, argv
print("ok")
"""


def test_help_imports_no_heavy_library():
    """``python -m g4v --help`` took 9 s importing torch and transformers for every command module.
    A fresh interpreter (this test process has them imported already) with them made unimportable
    prints every command's help."""
    done = subprocess.run([sys.executable, "-c", HELP_WITHOUT_HEAVY], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_a_truncated_photo_is_named_without_the_decoders_words(tmp_path):
    """A JPEG cut short read "trunc.jpg is corrupt or truncated (image file is truncated (1 bytes
    not processed))": the part in brackets was Pillow's own. Now the line names the file and the
    problem only, in the app and the CLI alike."""
    from g4v.errors import G4VError
    from g4v.images import open_image

    whole = tmp_path / "whole.jpg"
    make_image(320, 240, seed=4).save(whole, quality=90)
    cut = tmp_path / "trunc.jpg"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert open_image(whole).size == (320, 240)
    with pytest.raises(G4VError) as refused:
        open_image(cut)
    assert str(refused.value) == "trunc.jpg is corrupt or truncated"
