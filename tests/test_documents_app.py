"""The app's document handlers (webapp.documents) called as Gradio calls them: the picker renders the
pages the model will see, a preset fills the box, and the structured panel shows the newest answer
sanitised, as a table, or as-is with its parse error. The browser test drives the same in Chromium."""

import gradio as gr
import pytest
from PIL import Image

from g4v.documents.examples import REPORT_PDF
from g4v.documents.pdf import render_pages
from g4v.documents.presets import build_prompt
from g4v.errors import G4VError
from webapp import documents


def history_with(answer: str) -> list:
    return [{"role": "user", "content": "<tables_html>"}, {"role": "assistant", "content": answer}]


def test_picked_pages_are_lossless_pngs_of_the_rendered_pages():
    files = documents.page_files(str(REPORT_PDF), "2,1", 72, limit=4)
    assert len(files) == 2 and all(f.endswith(".png") for f in files)
    expected = render_pages(REPORT_PDF, [2, 1], 72)
    for path, image in zip(files, expected):
        assert list(Image.open(path).convert("RGB").getdata()) == list(image.getdata())


def test_the_picker_refuses_in_one_line():
    with pytest.raises(G4VError) as caught:
        documents.page_files(str(REPORT_PDF), "1-2", 72, limit=1)
    assert "too many pages: 2 chosen" in str(caught.value)
    with pytest.raises(G4VError) as caught:
        documents.page_files(None, "1", 72, limit=1)
    assert "upload a PDF first" in str(caught.value)


def test_thumbnails_for_an_upload():
    thumbnails, page = documents.show_thumbnails(str(REPORT_PDF))
    assert page == "1" and [label for _, label in thumbnails] == ["page 1", "page 2"]


def test_a_preset_fills_the_box_and_keeps_the_attachments():
    box = {"text": "", "files": ["/tmp/page.png"]}
    value, schema = documents.fill_prompt("chart2csv", "", box)
    assert value == {"text": "<chart2csv>", "files": ["/tmp/page.png"]} and schema["visible"] is False
    value, schema = documents.fill_prompt("kvp", documents.EXAMPLE_SCHEMA, box)
    assert value["text"] == build_prompt("kvp", schema_text=documents.EXAMPLE_SCHEMA)
    assert schema["visible"] is True
    with pytest.raises(gr.Error) as caught:  # a broken schema is one line, and the box stays as it was
        documents.fill_prompt("kvp", "{", box)
    assert "not valid JSON" in str(caught.value)


def test_a_preset_replaces_only_a_presets_own_text():
    """Typed text stays whatever the preset; a tag or a key-value prompt (any schema) is replaced,
    and a free or document question empties it."""
    files = ["/tmp/page.png"]
    kvp = build_prompt("kvp", schema_text='{"type": "object"}')
    for typed in ("How many bars?", "<chart2csv> and more", kvp[:-1] + " please"):
        assert documents.fill_prompt("tables_html", "", {"text": typed, "files": files})[0] == gr.update()
    for previous in ("<chart2csv>", kvp, "  <tables_otsl>\n"):
        box = {"text": previous, "files": files}
        assert documents.fill_prompt("tables_html", "", box)[0] == {"text": "<tables_html>", "files": files}
        assert documents.fill_prompt("", "", box)[0] == {"text": "", "files": files}
        assert documents.fill_prompt("qa", "", box)[0] == {"text": "", "files": files}


def test_the_structured_panel_renders_a_hostile_table_safely():
    answer = '<table><tr><th>Item</th><th onclick="x()">Price</th></tr><tr><td>Pen<script>a()</script></td>' \
             '<td><img src="http://e/x.png">1</td></tr></table>'
    html, table, notes = documents.structured_view("tables_html", "", history_with(answer))
    assert "<script" not in html and "onclick" not in html and "<img" not in html and "<table" in html
    assert table["headers"] == ["Item", "Price"] and table["value"] == [["Pen", "1"]] and table["visible"]
    assert notes == "Read as HTML."


def test_the_structured_panel_shows_a_malformed_answer_with_its_error():
    html, table, notes = documents.structured_view("chart2csv", "", history_with("Sales went <b>up</b>."))
    assert "Could not read the answer as CSV:** `not CSV: the first line has no comma-separated columns`" in notes
    assert "&lt;b&gt;up&lt;/b&gt;" in html and table["visible"] is False


def test_the_structured_panel_is_empty_before_the_first_answer_and_reads_an_empty_one():
    """A new or cleared chat has nothing to read; an answer that is empty is an error to show."""
    for history in ([], None, [{"role": "user", "content": "<chart2csv>"}]):
        assert documents.structured_view("chart2csv", "", history) == ("", {"__type__": "update", "value": None,
                                                                           "visible": False}, "")
    _, _, notes = documents.structured_view("chart2csv", "", history_with(""))
    assert notes == "**Could not read the answer as CSV:** `the answer is empty`"


def test_the_structured_panel_lists_schema_problems():
    history = history_with('{"total": "12"}')
    schema = '{"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total", "date"]}'
    _, _, notes = documents.structured_view("kvp", schema, history)
    assert "- `$.date`: expected `a required field`, got `nothing`" in notes
    assert '- `$.total`: expected `type "number"`, got `"12"`' in notes


def test_a_csv_answer_is_shown_once_in_the_grid():
    """The CSV's rows fill the table; an HTML copy of the same rows above it would show them twice."""
    html, table, notes = documents.structured_view("chart2csv", "", history_with("label,value\nred,1\nblue,5"))
    assert html == "" and table["visible"] and table["headers"] == ["label", "value"]
    assert table["value"] == [["red", "1"], ["blue", "5"]] and notes == "Read as CSV."
    html, table, _ = documents.structured_view("chart2csv", "", history_with("no table here"))
    assert "no table here" in html and not table["visible"]  # a malformed answer is still shown as-is
