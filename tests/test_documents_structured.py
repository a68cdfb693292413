"""Task presets, structured answers and their metrics (g4v.documents): prompts equal the documented
tags, hostile HTML comes out inert, malformed answers come back as-is with their parse error, and
the metrics give the numbers worked out by hand in each test."""

import json

import pytest

from g4v.documents import examples, metrics, presets, tables
from g4v.documents.structured import read_answer
from g4v.errors import G4VError

# ── presets ─────────────────────────────────────────────────────────────────────────────────────

#: The task tags as the model card of ibm-granite/granite-4.0-3b-vision lists them in its
#: "Supported Tasks" table (and granite-vision-4.1-4b's card repeats), typed here from the card.
DOCUMENTED_TAGS = {"chart2csv": "<chart2csv>", "chart2code": "<chart2code>", "chart2summary": "<chart2summary>",
                   "tables_json": "<tables_json>", "tables_html": "<tables_html>", "tables_otsl": "<tables_otsl>"}


@pytest.mark.parametrize("key", list(DOCUMENTED_TAGS))
def test_each_task_preset_sends_the_tag_of_the_granite_4_vision_model_card(key):
    """Source: https://huggingface.co/ibm-granite/granite-4.0-3b-vision, section "Supported Tasks"."""
    assert presets.build_prompt(key) == DOCUMENTED_TAGS[key]
    preset = presets.get_preset(key)
    assert preset.documented and "granite-4.0-3b-vision" in preset.source and "Supported Tasks" in preset.source


def test_the_key_value_prompt_is_marked_as_ours_and_carries_the_schema():
    """The card's KVP instructions could not be found: the preset says so instead of citing them."""
    preset = presets.get_preset("kvp")
    assert not preset.documented and preset.needs_schema
    schema = {"type": "object", "properties": {"total": {"type": "number"}}}
    prompt = presets.build_prompt("kvp", schema_text=json.dumps(schema))
    assert prompt == presets.KVP_PROMPT_TEMPLATE.format(schema=json.dumps(schema))
    assert json.loads(prompt[prompt.index("{"):]) == schema


#: VAREX's extraction system prompt, typed from its README ("Run extraction"; the schema goes where
#: the blank lines are, ``json.dumps(schema, indent=2)``): issue 31, item 15.
VAREX_BEFORE = "Extract structured data from this document.\nReturn a JSON object matching this schema:\n\n"
VAREX_AFTER = ("\n\nReturn null for fields you cannot find.\nReturn ONLY valid JSON.\n"
               "Return an instance of the JSON with extracted values, not the schema itself.")


def test_the_varex_preset_sends_varexs_documented_wording():
    preset = presets.get_preset("kvp_varex")
    assert preset.documented and preset.needs_schema and "VAREX" in preset.source and "2603.15118" in preset.source
    schema = {"type": "object", "properties": {"total": {"type": "number"}}}
    prompt = presets.build_prompt("kvp_varex", schema_text=json.dumps(schema))
    assert prompt == VAREX_BEFORE + '{\n  "type": "object",\n  "properties": {\n    "total": {\n      "type": "number"\n' \
                                    '    }\n  }\n}' + VAREX_AFTER


def test_a_question_is_sent_as_typed():
    assert presets.build_prompt("qa", question="What is the total?") == "What is the total?"


@pytest.mark.parametrize("call, words", [
    (lambda: presets.get_preset("chart2pdf"), ["unknown task 'chart2pdf'", "chart2csv"]),
    (lambda: presets.build_prompt("kvp"), ["needs a JSON schema"]),
    (lambda: presets.build_prompt("kvp", schema_text="{not json"), ["not valid JSON", "line 1, column 2"]),
    (lambda: presets.build_prompt("kvp", schema_text="[1, 2]"), ["must be a JSON object, not list"]),
    (lambda: presets.build_prompt("kvp", schema_text='{"type": "objekt"}'), ["not a valid JSON Schema at type"]),
    (lambda: presets.build_prompt("kvp", schema_text='{"properties": {"a": {"minimum": "x"}}}'),
     ["not a valid JSON Schema at properties/a/minimum"]),
    (lambda: presets.build_prompt("qa", question="  "), ["needs the question"]),
    (lambda: presets.build_prompt("kvp", schema_text='{"$schema": 5}'), ["$schema must be a string"]),
    (lambda: presets.build_prompt("kvp", schema_text='{"a":' * 3000 + "1" + "}" * 3000), ["nested too deeply"]),
    (lambda: presets.build_prompt("kvp", schema_text='{"not":' * 900 + "{}" + "}" * 900), ["nested too deeply"]),
])
def test_bad_task_input_is_one_line(call, words):
    with pytest.raises(G4VError) as caught:
        call()
    for word in words:
        assert word in str(caught.value), str(caught.value)


# ── hostile HTML ────────────────────────────────────────────────────────────────────────────────

HOSTILE = [
    "<table><tr><td>1<script>alert(1)</script></td></tr></table>",
    '<table><tr><td onclick="alert(1)" onmouseover="alert(2)">1</td></tr></table>',
    '<table><tr><td><a href="javascript:alert(1)">1</a></td></tr></table>',
    '<table><tr><td><img src="http://evil.example/track.png" onerror="alert(1)">1</td></tr></table>',
    "<style>@import url(http://evil.example/x.css);</style><table><tr><td>1</td></tr></table>",
    '<table style="background:url(http://evil.example/bg.png)"><tr><td>1</td></tr></table>',
    '<iframe src="http://evil.example/"></iframe><table><tr><td>1</td></tr></table>',
    '<svg onload="alert(1)"><script>alert(2)</script></svg><table><tr><td>1</td></tr></table>',
    '<table><tr><td><object data="http://evil.example/x.swf"></object>1</td></tr></table>',
    '<table background="http://evil.example/bg.png"><tr><td>1<!-- <script>alert(1)</script> --></td></tr></table>',
    '<table><tr><td><form action="http://evil.example/"><input name=q></form>1</td></tr></table>',
    '<table><tr><td><math><mi xlink:href="javascript:alert(1)">x</mi></math>1</td></tr></table>',
    '<table><tr><td><base href="http://evil.example/"><link rel=stylesheet href="http://e/x.css">1</td></tr></table>',
]
FORBIDDEN = ["<script", "onclick", "onmouseover", "onerror", "onload", "javascript:", "<img", "<a ", "<style",
             "style=", "<iframe", "<svg", "<object", "background", "http://", "<!--", "<form", "<input", "<math",
             "<base", "<link", "@import", "alert"]


@pytest.mark.parametrize("markup", HOSTILE)
def test_hostile_html_tables_keep_their_cell_and_lose_everything_active(markup):
    result = read_answer("html", markup)
    assert result.error is None, result.error
    assert result.rows == [["1"]]
    lowered = result.html.lower()
    assert [word for word in FORBIDDEN if word in lowered] == []


def test_spans_survive_sanitising_and_fill_the_grid():
    result = read_answer("html", '<table><tr><th colspan="2">A</th></tr><tr><td rowspan="2">x</td><td>y</td></tr>'
                                 '<tr><td>z</td></tr></table>')
    assert 'colspan="2"' in result.html and 'rowspan="2"' in result.html
    assert result.rows == [["A", ""], ["x", "y"], ["", "z"]]


# ── other formats, and malformed answers ────────────────────────────────────────────────────────


def test_otsl_merges_become_spans():
    """Row 1: a header spanning two columns; rows 2-3: a cell spanning two rows (ucel below it)."""
    result = read_answer("otsl", "<otsl><ched>A<lcel><nl><fcel>x<fcel>y<nl><ucel><fcel>z<nl></otsl>")
    assert result.html == ('<table><tr><th colspan="2">A</th></tr><tr><td rowspan="2">x</td><td>y</td></tr>'
                           "<tr><td>z</td></tr></table>")
    assert result.rows == [["A", ""], ["x", "y"], ["", "z"]]


def test_otsl_with_closing_tags_and_escaped_text():
    result = read_answer("otsl", "<ched>Name</ched><ched>Value</ched><nl><fcel>a<b</fcel><fcel>42</fcel><nl>")
    assert result.rows == [["Name", "Value"], ["a<b", "42"]] and "a&lt;b" in result.html


def test_the_example_csv_reads_back_as_its_rows():
    result = read_answer("csv", "```csv\n" + examples.chart_csv() + "\n```")
    assert result.ok and result.rows == [list(row) for row in examples.CHART_ROWS]


MALFORMED = [
    ("csv", "", "the answer is empty"),
    ("csv", "The chart shows sales rising.", "no comma-separated columns"),
    ("csv", "a,b\n1,2,3", "row 2 has 3 cells, the header has 2"),
    ("csv", '"', "no cell has any text"),
    ("csv", ",,\n,", "no cell has any text"),
    ("html", "Here is the table: none", "no <table>"),
    ("html", "<table></table>", "no cells"),
    ("html", '<table><tr><td colspan="100000">x</td></tr></table>', "outside 1-200"),
    ("html", '<table><tr><td colspan="two">x</td></tr></table>', "not a number"),
    # refused at the second cell (200 x 400), not after 300 such cells filled 12 million grid places
    ("html", "<table><tr>" + '<td rowspan="200" colspan="200">x</td>' * 300 + "</tr></table>", "too large: 200 x 400"),
    ("otsl", "just text", "no OTSL cells"),
    ("otsl", "<fcel>a<fcel>b<nl><fcel>c<nl>", "OTSL row 2 has 1 cells, row 1 has 2"),
    ("otsl", "<lcel>a<nl>", "merges with nothing"),
    ("otsl", "<ucel>a<nl>", "merges with nothing"),
    ("json", '{"total": 12', "not JSON"),
    ("json", "", "the answer is empty"),
    ("json", "[" * 100_000 + "]" * 100_000, ""),
]


@pytest.mark.parametrize("kind, answer, words", MALFORMED)
def test_malformed_answers_come_back_as_is_with_the_parse_error(kind, answer, words):
    result = read_answer(kind, answer)
    assert result.error and words in result.error and "\n" not in result.error
    assert result.rows == []
    assert result.html.startswith("<pre") and "<" not in result.html[result.html.index(">") + 1:-len("</pre>")]


def test_json_problems_name_the_field_what_was_expected_and_what_came():
    schema = {"type": "object", "required": ["total", "date"], "additionalProperties": False,
              "properties": {"total": {"type": "number"}, "date": {"type": "string"},
                             "items": {"type": "array", "items": {"type": "object",
                                                                  "properties": {"price": {"type": "number",
                                                                                           "minimum": 0}}}}}}
    answer = '```json\n{"total": "12", "items": [{"price": 3}, {"price": -1}], "extra": 1}\n```'
    result = read_answer("json", answer, schema)
    assert result.error is None and result.data["total"] == "12"
    assert [problem.line() for problem in result.problems] == [
        '$: expected no other fields, got "extra"',
        "$.date: expected a required field, got nothing",
        '$.items[1].price: expected minimum 0, got -1',
        '$.total: expected type "number", got "12"',
    ]


def test_problem_lines_name_keys_with_quotes_and_brackets_whole():
    schema = {"type": "object", "required": ["it's (net)", 'say "[a]"', "a"], "additionalProperties": False,
              "properties": {"it's (net)": {}, 'say "[a]"': {}, "a": {}}}
    result = read_answer("json", '{"a": 1, "x (y)": 2, "z\'s [\\"q\\"]": 3}', schema)
    assert [problem.line() for problem in result.problems] == [
        '$: expected no other fields, got "x (y)", "z\'s [\\"q\\"]"',
        "$.it's (net): expected a required field, got nothing",
        '$.say "[a]": expected a required field, got nothing',
    ]


def test_a_draft_3_required_field_is_one_problem_line():
    schema = {"$schema": "http://json-schema.org/draft-03/schema#", "properties": {"a": {"required": True}}}
    assert [problem.line() for problem in read_answer("json", "{}", schema).problems] == [
        "$.a: expected a required field, got nothing"]


@pytest.mark.parametrize("ref", ["http://127.0.0.1:9/schema.json", "file:///etc/hostname", "#/$defs/missing"])
def test_a_schema_ref_outside_the_schema_is_named_and_never_fetched(ref, monkeypatch):
    import urllib.request

    fetched = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda *args, **kwargs: fetched.append(args) or 1 / 0)
    schema = presets.parse_schema(json.dumps({"type": "object", "properties": {"total": {"$ref": ref}}}))
    result = read_answer("json", '{"total": 12}', schema)
    assert fetched == []
    assert result.error and "$ref" in result.error and "cannot be resolved" in result.error, result.error


def test_a_schema_ref_inside_the_schema_is_followed():
    schema = presets.parse_schema(json.dumps({"type": "object", "properties": {"total": {"$ref": "#/$defs/n"}},
                                              "$defs": {"n": {"type": "number"}}}))
    result = read_answer("json", '{"total": "12"}', schema)
    assert result.error is None and [p.line() for p in result.problems] == ['$.total: expected type "number", got "12"']


def test_code_is_highlighted_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\nprint('<b>')"
    result = read_answer("code", f"```python\n{code}\n```")
    assert not marker.exists()
    assert result.error is None and "<span" in result.html and "&lt;b&gt;" in result.html
    assert "'<b>'" not in result.html  # the model's markup stays text


def test_text_answers_are_escaped():
    result = read_answer("text", "<script>alert(1)</script>")
    assert "<script" not in result.html and "&lt;script&gt;" in result.html


# ── metrics, against numbers worked out by hand ─────────────────────────────────────────────────


def test_teds_of_identical_tables_is_one_and_of_no_table_zero():
    truth = examples.table_html()
    assert metrics.teds(truth, truth) == 1.0
    assert metrics.teds("no table here", truth) == 0.0


def test_teds_with_a_missing_row():
    """Truth 1 table + 4 rows + 12 cells = 17 nodes; the answer has only the header row (5 nodes):
    3 rows of 1 + 3 nodes are deleted, distance 12, TEDS = 1 - 12/17."""
    answer = "<table><tr><td>Item</td><td>Price</td><td>Stock</td></tr></table>"
    assert metrics.teds(answer, examples.table_html()) == pytest.approx(1 - 12 / 17)


def test_teds_with_one_wrong_character_and_one_wrong_span():
    """Text "ab" vs "ac": one edit in two characters costs 0.5 of 3 nodes -> 1 - 0.5/3. A cell whose
    colspan differs costs a whole rename: 1 of 3 nodes -> 1 - 1/3; TEDS-S ignores the text only."""
    assert metrics.teds("<table><tr><td>ab</td></tr></table>",
                        "<table><tr><td>ac</td></tr></table>") == pytest.approx(1 - 0.5 / 3)
    assert metrics.teds('<table><tr><td colspan="2">ab</td></tr></table>',
                        "<table><tr><td>ab</td></tr></table>") == pytest.approx(1 - 1 / 3)
    assert metrics.teds("<table><tr><td>ab</td></tr></table>", "<table><tr><td>zz</td></tr></table>",
                        structure_only=True) == 1.0


def test_teds_reads_otsl_through_its_html():
    otsl = read_answer("otsl", "<fcel>Item<fcel>Price<nl><fcel>Pen<fcel>1<nl>").html
    assert metrics.teds(otsl, "<table><tr><th>Item</th><th>Price</th></tr><tr><td>Pen</td><td>1</td></tr></table>") == 1.0


def test_normalised_edit_distance_by_hand():
    assert metrics.normalised_edit_distance("kitten", "sitting") == pytest.approx(3 / 7)
    assert metrics.normalised_edit_distance("", "abc") == 1.0


def test_csv_cell_accuracy_by_hand():
    truth = "Quarter,Units\nQ1,120\nQ2,95"
    assert metrics.csv_cell_accuracy(truth, truth) == 1.0
    assert metrics.csv_cell_accuracy("Quarter,Units\nQ1,120\nQ2,96", truth) == pytest.approx(5 / 6)
    assert metrics.csv_cell_accuracy("quarter , units\nQ1,120", truth) == pytest.approx(4 / 6)  # a row missing
    assert metrics.csv_cell_accuracy("Quarter,Units\nQ1,1,200", "Quarter,Units\nQ1,1200") == 0.0  # 3 columns: not CSV
    assert metrics.csv_cell_accuracy('Quarter,Units\nQ1,"1,200"', "Quarter,Units\nQ1,1200") == 1.0
    assert metrics.csv_cell_accuracy("Quarter,Units\nQ1,121", "Quarter,Units\nQ1,120", numeric_tolerance=0.01) == 1.0
    assert metrics.csv_cell_accuracy("It went up.", truth) == 0.0


def test_csv_cells_reading_nan_or_inf_compare_as_text():
    truth = "name,value\nNan,inf\nnan,1"
    assert metrics.csv_cell_accuracy(truth, truth) == 1.0
    assert metrics.csv_cell_accuracy("name,value\nNan,-inf\nnan,1", truth) == 5 / 6


def test_key_value_exact_match_per_field():
    truth = {"total": 12.5, "vendor": "ACME", "items": [{"name": "pen", "qty": 2}]}
    score = metrics.key_value_match('{"total": 12.5, "vendor": " ACME ", "items": [{"name": "pen", "qty": "2"}]}',
                                    truth)
    assert score.fields == {"$.total": True, "$.vendor": True, "$.items[0].name": True, "$.items[0].qty": False}
    assert score.accuracy == 0.75
    broken = metrics.key_value_match("{total: 12.5}", truth)
    assert broken.accuracy == 0.0 and broken.error.startswith("not JSON")


# ── the example document ────────────────────────────────────────────────────────────────────────


def test_the_example_report_is_regenerated_as_it_is_committed(tmp_path):
    """Regenerating the report draws the committed pages: the same text and, rendered as users get
    them, the same pixels. Not the same bytes: how matplotlib's PDF writer subsets the embedded font
    changes with the installed fontTools, which a fresh machine may hold in a newer version."""
    import numpy as np
    import pypdfium2

    from g4v.documents.pdf import render_pages

    fresh = examples.write_report(tmp_path / "report.pdf")
    stale = "assets/examples/report.pdf is stale: run python -m g4v.documents.examples"

    def texts(path):
        document = pypdfium2.PdfDocument(str(path))
        try:
            return [page.get_textpage().get_text_range() for page in document]
        finally:
            document.close()

    assert texts(fresh) == texts(examples.REPORT_PDF), stale
    pages = list(range(1, len(examples.REPORT_PAGE_PNGS) + 1))
    for new_page, old_page in zip(render_pages(fresh, pages, dpi=examples.PNG_DPI),
                                  render_pages(examples.REPORT_PDF, pages, dpi=examples.PNG_DPI)):
        new_pixels = np.asarray(new_page.convert("L"), dtype=np.int16)
        old_pixels = np.asarray(old_page.convert("L"), dtype=np.int16)
        assert new_pixels.shape == old_pixels.shape, stale
        # Anti-aliasing may move a glyph edge by a grey level or two; a changed label moves far more.
        assert np.abs(new_pixels - old_pixels).mean() < 0.5, stale


def test_the_example_answers_score_perfectly_against_themselves():
    """The constants a dataset run would use as the right answers read back as themselves."""
    assert read_answer("html", examples.table_html()).rows == [list(row) for row in examples.TABLE_ROWS]
    assert metrics.teds(tables.rows_html([list(r) for r in examples.TABLE_ROWS]), examples.table_html()) == 1.0


# ── the schema's regular expressions ────────────────────────────────────────────────────────────

#: ``(a|a)*`` backtracks 2**n ways over n a's before a mismatch: under ``re`` (the library's engine),
#: 40 of them would not finish in a lifetime and would hold the server's thread and its GIL.
BACKTRACKING = "^(a|a)*$"
STUCK = "a" * 40 + "!"


@pytest.mark.parametrize("schema, answer", [
    ({"type": "object", "properties": {"name": {"type": "string", "pattern": BACKTRACKING}}}, {"name": STUCK}),
    ({"type": "object", "patternProperties": {BACKTRACKING: {"type": "string"}}}, {STUCK: "x"}),
    ({"type": "object", "properties": {"id": {}}, "patternProperties": {BACKTRACKING: {}},
      "additionalProperties": False}, {STUCK: 1}),
    ({"type": "array", "items": {"type": "object", "propertyNames": {"pattern": BACKTRACKING}}}, [{STUCK: 1}]),
], ids=["pattern", "patternProperties", "additionalProperties", "propertyNames"])
def test_a_backtracking_schema_pattern_is_stopped_and_named(schema, answer):
    result = read_answer("json", json.dumps(answer), presets.parse_schema(json.dumps(schema)))
    assert result.error and BACKTRACKING in result.error and "not checked" in result.error, result.error
    assert result.data == answer  # the answer itself is still shown


def test_a_schema_whose_patterns_the_library_would_match_untimed_is_refused_in_one_line():
    """For ``unevaluatedProperties`` jsonschema matches ``patternProperties`` itself, with ``re``."""
    from g4v.documents.structured import schema_problems

    schema = {"type": "object", "allOf": [{"patternProperties": {BACKTRACKING: {}}}], "unevaluatedProperties": False}
    with pytest.raises(G4VError, match="unevaluatedProperties together with patternProperties"):
        presets.parse_schema(json.dumps(schema))
    with pytest.raises(ValueError, match="unevaluatedProperties together with patternProperties"):
        schema_problems({STUCK: 1}, schema)
    assert presets.parse_schema(json.dumps({"unevaluatedProperties": False, "properties": {"a": {}}}))


def fan_out(depth: int, width: int = 8) -> dict:
    """A schema whose ``$ref``s fan out: ``width ** depth`` evaluations of one short pattern."""
    defs = {"d0": {"type": "string", "pattern": "^a"}}
    defs.update({f"d{level}": {"allOf": [{"$ref": f"#/$defs/d{level - 1}"}] * width} for level in range(1, depth + 1)})
    return {"$defs": defs, "$ref": f"#/$defs/d{depth}"}


@pytest.mark.parametrize("schema, answer", [
    ({"type": "array", "items": {"pattern": "^(a|a)*$"}}, ["a" * 17 + "b"] * 1000),  # each search well short of 0.5 s
    (fan_out(7), "abc"),  # 8 ** 7 evaluations
], ids=["many searches", "$ref fan-out"])
def test_a_check_that_asks_for_too_much_work_is_stopped_as_a_whole(schema, answer):
    from g4v.documents.structured import CHECK_SECONDS

    result = read_answer("json", json.dumps(answer), presets.parse_schema(json.dumps(schema)))
    assert result.error and f"took over {CHECK_SECONDS} s, so it was stopped" in result.error, result.error


@pytest.mark.parametrize("schema, words", [
    ({"properties": {"a": {"pattern": "a{99999999999}"}}}, "a pattern that cannot be compiled"),
], ids=["huge repeat"])
def test_a_schema_pattern_that_cannot_be_compiled_is_refused_in_one_line(schema, words):
    with pytest.raises(G4VError, match=words):
        presets.parse_schema(json.dumps(schema))


def test_keyword_names_used_as_property_names_or_values_are_not_refused():
    schema = {"properties": {"patternProperties": {"type": "string"}, "kind": {"enum": ["patternProperties"]}},
              "unevaluatedProperties": False}
    result = read_answer("json", '{"patternProperties": "x", "kind": "patternProperties", "extra": 1}',
                         presets.parse_schema(json.dumps(schema)))
    assert result.error is None and [p.path for p in result.problems] == ["$"]  # "extra" is unevaluated


SCHEMA_CASES = [
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"}}},
     [{"code": "AB-12"}, {"code": "ab-12"}, {"code": 7}, {"code": "XAB-1"}]),
    ({"type": "object", "patternProperties": {"^n_": {"type": "number"}, "^s_": {"type": "string"}},
      "additionalProperties": False},
     [{"n_a": 1, "s_b": "x"}, {"n_a": "1"}, {"other": 1, "more": 2}, {}]),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"a": {}},
      "patternProperties": {"^x": {"minimum": 3}}, "additionalProperties": {"type": "boolean"}},
     [{"a": 1, "x1": 4, "b": True}, {"x1": 2, "b": "no"}, {"c": False}]),
    ({"type": "object", "additionalProperties": False, "properties": {"p": {"type": "array",
      "items": {"type": "string", "pattern": "[0-9]"}}}},
     [{"p": ["a1", "b"]}, {"q": 1}, {"p": []}]),
]


@pytest.mark.parametrize("schema, answers", SCHEMA_CASES)
def test_time_limited_keywords_find_what_the_library_finds(schema, answers):
    """The rewritten ``pattern``, ``patternProperties`` and ``additionalProperties`` report the same
    problems, at the same places, as the jsonschema library's own validator."""
    from jsonschema import validators

    from g4v.documents.structured import schema_problems

    library = validators.validator_for(schema)(schema)
    for answer in answers:
        expected = sorted(("$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path),
                           e.validator) for e in library.iter_errors(answer))
        found = sorted((p.path, p.expected.split()[0] if p.expected != "no other fields" else "additionalProperties")
                       for p in schema_problems(answer, schema))
        assert found == expected, answer


#: 25 characters that Python's ``re`` compiles at once, and the ``regex`` package (the time-limited
#: matcher) expands into 1000 ** 3 letters when it compiles them: 17 GB, before any time limit.
EXPANDING = "((a{1000}){1000}){1000}"
EXPANDING_SCHEMAS = {
    "pattern": {"type": "object", "properties": {"name": {"type": "string", "pattern": EXPANDING}}},
    "patternProperties": {"type": "object", "patternProperties": {EXPANDING: {}}},
    "additionalProperties": {"type": "object", "properties": {"id": {}}, "patternProperties": {EXPANDING: {}},
                             "additionalProperties": False},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": EXPANDING}},
}

#: Run in a child under a 1.5 GiB address-space limit (so the unfixed code ends in MemoryError there,
#: not in the test machine's swap): each schema through parse_schema, then checked directly.
UNDER_A_MEMORY_LIMIT = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2 ** 29, 3 * 2 ** 29))
from g4v.documents import presets
from g4v.documents.structured import read_answer
from g4v.errors import G4VError
out = {}
for name, schema in json.loads(sys.argv[1]).items():
    try:
        presets.parse_schema(json.dumps(schema))
        refused = None
    except G4VError as err:
        refused = str(err)
    out[name] = [refused, read_answer("json", '{"id": 1, "name": "aaa", "aaa": 2}', schema).error]
print(json.dumps(out))
"""


def test_a_schema_pattern_that_expands_when_compiled_is_one_line_under_a_memory_limit():
    import subprocess
    import sys

    from g4v.paths import REPO_ROOT

    run = subprocess.run([sys.executable, "-c", UNDER_A_MEMORY_LIMIT, json.dumps(EXPANDING_SCHEMAS)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    expected = (f"the schema's pattern '{EXPANDING}' repeats too much to be compiled: its counted repetitions "
                f"come to {1000 ** 3:,} (the limit is 100,000)")
    assert json.loads(run.stdout) == {name: [expected, expected] for name in EXPANDING_SCHEMAS}


@pytest.mark.parametrize("pattern, good, bad", [
    ("^[a-z]{1,5}$", "abc", "abcdefg"), (r"\d{4}-\d{2}", "2024-05", "24-5"),
    ("^(ab){2,3}$", "abab", "ab"), ("^x{50000}$", "x" * 50000, "x"),
])
def test_ordinary_counted_patterns_are_still_accepted_and_checked(pattern, good, bad):
    schema = presets.parse_schema(json.dumps({"type": "object", "properties": {"v": {"pattern": pattern}}}))
    assert read_answer("json", json.dumps({"v": good}), schema).problems == []
    assert [p.path for p in read_answer("json", json.dumps({"v": bad}), schema).problems] == ["$.v"]


def test_teds_variant_rules_each_pinned_by_hand():
    """Issue 31, item 14: where our TEDS departs from the paper's (Zhong et al. 2020: the edit
    distance over the HTML trees as written, ``1 - EditDist / max(|Ta|, |Tb|)``), one tiny example
    each, worked out by hand; the paper's value beside ours (docs/evaluate.md, "TEDS")."""
    one_row = "<table><tr><td>a</td></tr></table>"  # table, tr, td: 3 nodes
    two_rows = "<table><tr><td>a</td></tr><tr><td>b</td></tr></table>"  # 5 nodes
    # th counts as td (paper: renaming th -> td costs 1 of 3 nodes, 1 - 1/3).
    assert metrics.teds("<table><tr><th>a</th></tr></table>", one_row) == 1.0
    # thead and tbody are not nodes (paper: 2 nodes more, 7 against 5: 1 - 2/7).
    wrapped = "<table><thead><tr><td>a</td></tr></thead><tbody><tr><td>b</td></tr></tbody></table>"
    assert metrics.teds(wrapped, two_rows) == 1.0
    # A row without cells is dropped (paper: one tr more, 4 against 3: 1 - 1/4).
    assert metrics.teds("<table><tr></tr><tr><td>a</td></tr></table>", one_row) == 1.0
    # Two tables in one answer are read as one, rows in order (the reference code reads the first
    # table only: 3 against 5 nodes, 1 - 2/5).
    assert metrics.teds("<table><tr><td>a</td></tr></table> and <table><tr><td>b</td></tr></table>",
                        two_rows) == 1.0
    # Everything else is the paper's rule: a wrong cell text, "a" vs "b", costs 1 of 5 nodes.
    assert metrics.teds("<table><tr><td>a</td></tr><tr><td>a</td></tr></table>", two_rows) == pytest.approx(1 - 1 / 5)


#: The red team's answer: a JSON array of 12,000 distinct objects (about 157 KB), which jsonschema
#: compared pairwise against ``uniqueItems`` (objects do not sort): 160 s, holding the panel.
MANY_OBJECTS = [{"row": n, "ok": True} for n in range(12_000)]


def test_unique_items_over_12000_objects_is_checked_well_within_the_deadline():
    import time

    from g4v.documents.structured import schema_problems

    schema = {"type": "array", "uniqueItems": True}
    started = time.monotonic()
    assert schema_problems(MANY_OBJECTS, schema) == []
    # the same objects with one repeated (its keys in another order, its number written as a float)
    problems = schema_problems([*MANY_OBJECTS, {"ok": True, "row": 11_999.0}], schema)
    assert time.monotonic() - started < 5.0
    assert [(p.path, p.expected) for p in problems] == [("$", "uniqueItems true")]


@pytest.mark.parametrize("items", [
    [1, 1.0], [True, 1], [False, 0], [None, False], [[1, 2], [2, 1]], [[1, [True]], [1, [1]]],
    [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [{"a": [1]}, {"a": [1.0]}], ["1", 1], [{"a": None}, {"a": False}],
    [[], {}], [{"a": 1}, {"a": 1, "b": 2}], ["x", "x"], [0.5, 0.5], [],
])
def test_unique_items_finds_what_the_library_finds(items):
    """The linear-time ``uniqueItems`` agrees with the library's pairwise one (its reference), on
    the edges of JSON Schema's equality: numbers by value, booleans not numbers, keys unordered."""
    from jsonschema import validators

    from g4v.documents.structured import schema_problems

    schema = {"uniqueItems": True}
    expected = [e.validator for e in validators.validator_for(schema)(schema).iter_errors(items)]
    assert [p.expected.split()[0] for p in schema_problems(items, schema)] == expected
