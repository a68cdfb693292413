"""Every tab's API endpoint, through gradio_client against the launched app."""

import json

import pytest
from gradio_client import Client, handle_file
from PIL import Image

from g4v.paths import EXAMPLES_DIR
from g4v.tiling import load_tiling_config, plan_tiling
from g4v.paths import BUNDLED_MODEL_DIR

EXAMPLE = EXAMPLES_DIR / "three-shapes-square.png"


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def test_tiling_endpoint_matches_the_plan(client):
    overlay, table, first_token, token_view, info = client.predict(handle_file(str(EXAMPLE)), api_name="/tiling")
    plan = plan_tiling(Image.open(EXAMPLE).size[::-1], load_tiling_config(BUNDLED_MODEL_DIR))
    rows = {row[0]: row[2] for row in table["data"]}
    assert rows["total"] == plan.num_image_tokens
    assert rows["base view"] == plan.base_tokens and rows["newlines"] == plan.newline_tokens
    assert Image.open(overlay).size[0] > Image.open(EXAMPLE).size[0]
    assert first_token == plan.base_tokens and f"Token **{first_token}**" in info
    assert Image.open(token_view).size == Image.open(EXAMPLE).size


def test_tiling_token_endpoint_selects_a_token(client):
    client.predict(handle_file(str(EXAMPLE)), api_name="/tiling")
    _, info = client.predict(handle_file(str(EXAMPLE)), 3, api_name="/tiling_token")
    assert "Token **3**" in info and "base" in info
    with pytest.raises(Exception, match="out of range"):
        client.predict(handle_file(str(EXAMPLE)), 10**6, api_name="/tiling_token")
