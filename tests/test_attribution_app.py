"""The Attribution tab's endpoint through gradio_client against the launched app (the shared
``app_url`` app on the bundled checkpoint): the same numbers as the library run, a chosen answer
token, and one line for bad input."""

import json

import pytest
from gradio_client import Client, handle_file

from g4v.attribution.run import AttributionSettings, run_attribution
from g4v.paths import EXAMPLES_DIR

EXAMPLE = EXAMPLES_DIR / "shapes-tall.png"
PROMPT = "What colour is the shape?"


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def test_attribute_endpoint_equals_the_library_run_and_picks_a_token(client, hf_engine, tmp_path):
    token, report, tiles, base, deletion, lens, lens_levels, files = client.predict(
        handle_file(str(EXAMPLE)), PROMPT, " red circle", "1", "gradxinput", "", api_name="/attribute")
    summary = json.loads(open(next(f for f in files if f.endswith("summary.json"))).read())
    expected = run_attribution(hf_engine, str(EXAMPLE), PROMPT, AttributionSettings(target=" red circle", token=1, lens=False),
                               out_dir=tmp_path).to_dict()
    assert summary["answer"] == expected["answer"] and summary["answer"]["target"] == 1
    assert summary["attribution"]["level_totals"] == pytest.approx(expected["attribution"]["level_totals"], rel=1e-4,
                                                                   abs=1e-7)
    assert token["value"] == "1: ' circle'" and [c[0] for c in token["choices"]] == [
        "0: ' red'", "1: ' circle'", "the whole answer"]  # the answer's tokens, to pick from
    assert "Deletion test" in report
    assert all(picture for picture in (tiles, base, deletion, lens, lens_levels))


def test_attribute_endpoint_refuses_bad_input_in_one_line(client):
    with pytest.raises(Exception, match="prompt is empty"):
        client.predict(handle_file(str(EXAMPLE)), "   ", "", "0", "gradxinput", "", api_name="/attribute")
    with pytest.raises(Exception, match="does not exist"):
        client.predict(handle_file(str(EXAMPLE)), PROMPT, " red", "7: 'x'", "gradxinput", "", api_name="/attribute")


def test_attribute_endpoint_contrasts_with_other_answers(client, hf_engine, tmp_path):
    """"Explain against": the whole answer's log-odds against the listed answers, as the library's
    ``against`` computes them; too many answers to contrast with are one line."""
    *_, files = client.predict(handle_file(str(EXAMPLE)), PROMPT, "red", "0", "gradxinput", "",
                               " green ,blue,", api_name="/attribute")
    summary = json.loads(open(next(f for f in files if f.endswith("summary.json"))).read())
    expected = run_attribution(hf_engine, str(EXAMPLE), PROMPT, AttributionSettings(target="red", against=("green", "blue"),
                               lens=False), out_dir=tmp_path).to_dict()
    assert summary["answer"]["against"] == ["green", "blue"] == expected["answer"]["against"]
    assert summary["attribution"]["level_totals"] == pytest.approx(expected["attribution"]["level_totals"], rel=1e-4,
                                                                   abs=1e-7)
    with pytest.raises(Exception, match="at most 16 answers to contrast with, got 17"):
        client.predict(handle_file(str(EXAMPLE)), PROMPT, "red", "0", "gradxinput", "",
                       ",".join(f"c{i}" for i in range(17)), api_name="/attribute")
