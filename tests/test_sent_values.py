"""What a client sends is checked before Gradio reads it (:func:`webapp.intake.check_sent_values`):
each refusal is one line naming the value as the page labels it and as the API names it, where
Gradio's own words were several lines of its internals. On a real ``gr.Blocks`` event; the served
app's refusals are in test_app_bad_input.py."""

import math

import gradio as gr
import pytest

from webapp.intake import check_sent_values


@pytest.fixture(scope="module")
def event():
    """An event whose handler takes a message box, a state, a slider and three number boxes."""
    def handler(message, history, max_new_tokens, limit, margin, answer):
        return message

    with gr.Blocks() as page:
        box = gr.MultimodalTextbox(show_label=False)
        state = gr.State([])
        tokens = gr.Slider(1, 1024, label="Max new tokens")
        rows = gr.Number(label="Rows (empty: all)", minimum=1)
        margin = gr.Number(label="Equivalence margin", maximum=1)
        answer = gr.Number(label="Answer tokens", precision=None)  # no bound: Gradio passes on what was sent
        gr.Button().click(handler, [box, state, tokens, rows, margin, answer], box)
    return next(iter(page.fns.values()))


MESSAGE = {"text": "Hi", "files": []}


@pytest.mark.parametrize("values, words", [
    ([MESSAGE, None, 0, 2, 0.5, 1], "max_new_tokens must be from 1 to 1024, got 0"),
    ([MESSAGE, None, "abc", 2, 0.5, 1], "max_new_tokens must be a number, got 'abc'"),
    ([MESSAGE, None, True, 2, 0.5, 1], "max_new_tokens must be a number, got True"),
    ([MESSAGE, None, 8, -3, 0.5, 1], "Rows (limit) must be at least 1, got -3"),
    ([MESSAGE, None, 8, 2, 10**400, 1], f"Equivalence margin (margin) must be at most 1, got {str(10**400)[:37]}..."),
    (["hello", None, 8, 2, 0.5, 1], 'message is not in the form this input takes {"text": ..., "files": [...]}'),
    ([{"text": "Hi", "files": "abc"}, None, 8, 2, 0.5, 1], "message is not in the form"),
    ([{"text": "Hi", "files": [{"path": "x", "meta": "y"}]}, None, 8, 2, 0.5, 1], "message is not in the form"),
    ([MESSAGE], "too few values: this takes message, max_new_tokens, limit, margin, answer"),
])
def test_a_bad_value_is_one_line_naming_it(event, values, words):
    with pytest.raises(gr.Error) as refused:
        check_sent_values(event, values)
    assert refused.value.message.startswith(words) and "\n" not in refused.value.message, refused.value.message


def test_values_a_handler_reads_itself_pass(event):
    """An empty number box (None) and NaN reach the handler, which names them in its own words; so
    do values in range, whatever the state's place holds (Gradio keeps the state itself), and
    anything sent to a number box Gradio does not compare (its handler reads "12" as typed)."""
    for values in ([MESSAGE, None, 8, None, 0.5, None], [MESSAGE, "anything", math.nan, 1, math.nan, "12"],
                   [None, None, 1024, 10**6, -5, [1]]):
        check_sent_values(event, values)
