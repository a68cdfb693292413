"""The Hugging Face Spaces contract: valid front matter, and the app starts the way Spaces starts it."""

import re

import gradio
import yaml
from gradio_client import Client

from g4v.paths import REPO_ROOT
from tests.conftest import running_app


def front_matter() -> dict:
    text = (REPO_ROOT / "README.md").read_text()
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert match, "README.md must start with Spaces front matter between --- lines"
    return yaml.safe_load(match.group(1))


def test_front_matter_is_valid_for_a_gradio_space():
    meta = front_matter()
    assert meta["sdk"] == "gradio"
    assert (REPO_ROOT / meta["app_file"]).is_file()
    assert meta["sdk_version"] == gradio.__version__  # pinned to what the tests ran
    assert meta["suggested_hardware"]
    assert meta["title"] and meta["colorFrom"] and meta["colorTo"]


def test_requirements_pin_the_sdk_stack():
    requirements = (REPO_ROOT / "requirements.txt").read_text()
    assert f"gradio=={front_matter()['sdk_version']}" in requirements
    for package in ("torch", "transformers", "peft"):
        assert re.search(rf"^{package}==", requirements, re.M), package


def test_app_starts_as_spaces_starts_it():
    """Spaces runs ``python APP_FILE`` with its settings in the environment (the server name is kept
    on loopback here; Spaces itself passes 0.0.0.0)."""
    meta = front_matter()
    env = {"SYSTEM": "spaces", "SPACE_ID": "g4v/test", "GRADIO_SERVER_NAME": "127.0.0.1"}
    with running_app(env=env, app_file=meta["app_file"]) as url:
        answer = Client(url, verbose=False).predict({"text": "Hello", "files": []}, 4, 0.0, 1.0, 0, api_name="/chat")
    from g4v.conversation import Message, SamplingSettings
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import default_model

    engine = TransformersEngine(default_model(), device="cpu", dtype="float32")  # what a Space serves
    assert answer == engine.generate([Message("user", "Hello")], SamplingSettings(max_new_tokens=4)).text
