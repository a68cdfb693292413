"""Every tab's API endpoint, through gradio_client against the launched app."""

import json

import pytest
from gradio_client import Client, handle_file
from PIL import Image

from g4v.paths import EXAMPLES_DIR
from g4v.loading import load_config
from g4v.tiling import plan_tiling
from g4v.paths import BUNDLED_MODEL_DIR

EXAMPLE = EXAMPLES_DIR / "shapes-tall.png"


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def test_tiling_endpoint_matches_the_plan(client):
    overlay, table, first_token, token_view, info = client.predict(handle_file(str(EXAMPLE)), api_name="/tiling")
    plan = plan_tiling(Image.open(EXAMPLE).size[::-1], load_config(BUNDLED_MODEL_DIR))
    rows = {row[0]: row[2] for row in table["data"]}
    assert rows["total"] == plan.num_image_tokens
    assert rows["base view"] == plan.base_tokens and rows["newlines"] == plan.newline_tokens
    assert Image.open(overlay).size[0] > Image.open(EXAMPLE).size[0]
    height, width = plan.image_size  # the token shown first covers the picture's centre
    centre = [t.index for t in plan.tokens if t.kind == "tile" and t.box[0] <= width / 2 < t.box[2]
              and t.box[1] <= height / 2 < t.box[3]]
    assert [first_token] == centre[:1] and f"Token **{first_token}**" in info
    assert Image.open(token_view).size == Image.open(EXAMPLE).size


def test_tiling_token_endpoint_selects_a_token(client):
    client.predict(handle_file(str(EXAMPLE)), api_name="/tiling")
    _, info, overlay = client.predict(handle_file(str(EXAMPLE)), 3, api_name="/tiling_token")
    assert "Token **3**" in info and "base" in info
    assert Image.open(overlay).size[0] > Image.open(EXAMPLE).size[0]  # the overlay, the token framed on it
    with pytest.raises(Exception, match="out of range"):
        client.predict(handle_file(str(EXAMPLE)), 10**6, api_name="/tiling_token")


def test_lora_side_by_side_endpoint_equals_separate_runs(client, hf_engine):
    from g4v.conversation import Message, SamplingSettings
    from g4v.lora.activation import activate_adapter

    base, adapted = client.predict("demo-lora", handle_file(str(EXAMPLE)), "What colour is it?", 10, 0.0, 0,
                                   api_name="/lora_side_by_side")
    messages = [Message("user", "What colour is it?", [Image.open(EXAMPLE).convert("RGB")])]
    settings = SamplingSettings(max_new_tokens=10)
    name = activate_adapter(hf_engine, "demo-lora").name
    assert base == hf_engine.generate(messages, settings).text
    assert adapted == hf_engine.generate(messages, settings, adapter=name).text
    assert base != adapted


def test_lora_diff_endpoint_equals_the_library_run(client, hf_engine):
    from g4v.conversation import Message, SamplingSettings
    from g4v.lora.activation import activate_adapter
    from g4v.lora.token_diff import lora_diff
    from tests.test_golden_cli import assert_same

    html, plot, data, left, right = client.predict("demo-lora", handle_file(str(EXAMPLE)), "What colour is it?", 8,
                                                   api_name="/lora_diff")
    messages = [Message("user", "What colour is it?", [Image.open(EXAMPLE).convert("RGB")])]
    name = activate_adapter(hf_engine, "demo-lora").name
    expected = lora_diff(hf_engine, messages, name, SamplingSettings(max_new_tokens=8)).to_dict()
    assert_same(data, expected)
    assert data["base_text"] != data["adapter_text"] and plot is not None
    assert (left, right) == (expected["base_text"], expected["adapter_text"])  # the answer boxes show the diff's answers
    assert all(token["text"] in html for token in data["base_tokens"] if token["text"].strip().isalnum())


@pytest.mark.parametrize("adapter, words", [("no-such-adapter", "adapter"), ("/etc", "outside"),
                                             ("../granite4-vision-tiny-trained", "outside")])
def test_lora_refuses_unknown_and_outside_adapters(app_url, client, hf_engine, adapter, words):
    from g4v.conversation import Message, SamplingSettings
    from g4v.paths import REPO_ROOT

    with pytest.raises(Exception) as err:
        client.predict(adapter, None, "Hi", 4, 0.0, 0, api_name="/lora_side_by_side")
    message = str(err.value)
    assert words in message and "\n" not in message.strip()
    assert str(REPO_ROOT) not in message and "/tmp" not in message  # no server paths
    # and the app keeps serving: the base column is the model's own answer
    base, _ = Client(app_url, verbose=False).predict("demo-lora", None, "Hi", 4, 0.0, 0, api_name="/lora_side_by_side")
    assert base == hf_engine.generate([Message("user", "Hi")], SamplingSettings(max_new_tokens=4)).text


def test_deepstack_endpoint_reports_eight_levels_and_an_ablation(client):
    table, norms, trajectory, heat_tiles, heat_base, report, export = client.predict(
        handle_file(str(EXAMPLE)), "What colour is it?", ["deepstack0", "spatial_TL"], "deepstack1=0.5", False,
        api_name="/inspect",
    )
    rows = table["data"]
    assert len(rows) == 8
    assert sorted(row[3] for row in rows) == sorted([3, 2, 1, 0, 4, 5, 6, 7])  # LLM layers of the bundled map
    for picture in (norms, trajectory, heat_tiles, heat_base):
        assert Image.open(picture).size[0] > 100
    assert "KL" in report and "deepstack0 x0" in report
    import zipfile

    names = zipfile.ZipFile(export).namelist()
    assert "summary.json" in names and "capture.safetensors" in names
    summary = json.loads(zipfile.ZipFile(export).read("summary.json"))
    assert summary["ablation"]["ablated"] == ["deepstack0", "spatial_TL"]


def test_deepstack_refuses_unknown_levels(client):
    with pytest.raises(Exception, match="level"):
        client.predict(handle_file(str(EXAMPLE)), "Hi", [], "nosuchlevel=2", False, api_name="/inspect")


def test_port_diff_endpoint_compares_vllm_with_transformers(client):
    """Runs the real comparison in the vLLM environment (``make test`` builds it first)."""
    from g4v.engines import vllm_python

    assert vllm_python() is not None, "the vLLM environment is missing: scripts/setup_vllm_cpu_env.sh"
    verdict, table, picture, summary = client.predict(handle_file(str(EXAMPLE)), "What colour is it?",
                                                      api_name="/port_diff")
    assert "Agrees" in verdict, verdict
    assert table["headers"][4:] == ["share of tolerance used", "verdict"]
    assert len(table["data"]) == 8 and all(row[5] == "ok" and float(row[4]) <= 1.0 for row in table["data"])
    levels = {level["name"]: level for level in summary["levels"]}
    assert [float(row[2]) for row in table["data"]] == pytest.approx(
        [levels[row[0]]["max_abs_diff"] for row in table["data"]], rel=5e-3)  # three significant digits
    assert "/" not in summary["model"]  # the folder's name, not the server's path
    assert Image.open(picture).size[0] > 100
    assert summary["next_token"]["top5_overlap"] == 5


def test_circuits_endpoints_answer_as_the_library_does(client, hf_engine):
    """/circuits_attention through gradio_client: its attention.json is the library's result; a bad
    region sent to /circuits_reverse is one line."""
    from g4v.circuits.attention import image_attention
    from g4v.circuits.common import CircuitSettings

    report, share, tiles, base, files = client.predict(handle_file(str(EXAMPLE)), "What colour is it?", "2-3", "",
                                                       api_name="/circuits_attention")
    summary = json.loads(open(next(f for f in files if f.endswith("attention.json"))).read())
    expected = image_attention(hf_engine, str(EXAMPLE), "What colour is it?", CircuitSettings(layers="2-3")).to_dict()
    assert summary["image_tokens"] == expected["image_tokens"]
    assert summary["image_share"] == pytest.approx(expected["image_share"], abs=1e-6)
    assert "image share" in report and Image.open(share).size[0] > 100
    with pytest.raises(Exception) as err:
        client.predict(handle_file(str(EXAMPLE)), "Hi", "all", "0,0,99999,5", 2, api_name="/circuits_reverse")
    assert "reaches past the picture" in str(err.value) and "\n" not in str(err.value).strip()
