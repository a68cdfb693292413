"""The Evaluate tab's token-budget sweep and "Open in ..." buttons, called in-process as Gradio
calls them, on the bundled checkpoint: each returns its values by box, every box it names once,
and the ``/evaluate_budget`` endpoint keeps its outputs' order (API clients read them by position)."""

from dataclasses import asdict

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from g4v.evaluate import BUNDLED_DATASET, Columns, EvalConfig, open_dataset
from g4v.evaluate.budget import run_budget_sweep
from g4v.paths import BUNDLED_MODEL_DIR
from webapp.common import escape_markdown
from webapp.evaluate import EvalWorkspace, dataset_line, guessed_columns
from webapp.evaluate_budget import budget_section, curve_markdown
from webapp.evaluate_choices import BUNDLED, arm_choices, dataset_label
from webapp.evaluate_open import OpenInChat, OpenInDeepstack, OpenInLora, OpenTargets, open_handlers
from webapp.sessions import SessionStores


@pytest.fixture
def workspace(tmp_path):
    (tmp_path / "sessions").mkdir()
    sessions = SessionStores(tmp_path / "sessions", {"uploads": 2, "runs": 2, "files": 4})
    yield EvalWorkspace(sessions)
    sessions.close()


def test_the_sweep_fills_its_boxes_by_name_in_the_endpoints_order(hf_engine, workspace, tmp_path):
    choices = arm_choices(hf_engine, str(BUNDLED_MODEL_DIR))
    reuse = {choices[0].spec.engine_key(): hf_engine}
    with gr.Blocks() as page:
        inputs = [gr.Dropdown(), gr.Dropdown(), gr.File(), *(gr.Textbox() for _ in range(5)), gr.Number(), gr.Number(),
                  gr.Number()]
        budget_section(workspace, choices, reuse, None, inputs)
    [event] = [function for function in page.fns.values() if function.api_name == "evaluate_budget"]
    assert [type(box) for box in event.outputs] == [gr.Markdown, gr.Image, gr.JSON]
    assert [box.elem_id for box in event.outputs[:2]] == ["eval-budget-status", "eval-budget-plot"]
    shown = event.fn("app", BUNDLED, None, "", "", "", "", "", 1, -1, 2, "100", ["random"], request=None)
    assert list(shown) == event.outputs  # every box, once, in the endpoint's order
    status, plot, curve = (shown[box] for box in event.outputs)
    config = EvalConfig(a=choices[0].spec, b=choices[0].spec, data=str(BUNDLED_DATASET), limit=1, max_new_tokens=2)
    expected = run_budget_sweep(config, tmp_path / "again", "100", "random", reuse=reuse).to_dict()
    assert [point["n"] for point in curve["points"]] == [point["n"] for point in expected["points"]] == [1]
    assert status == curve_markdown(curve) and isinstance(plot, Image.Image)


@pytest.fixture
def targets():
    with gr.Blocks():
        tabs = gr.Tabs()
        return OpenTargets(OpenInChat(gr.MultimodalTextbox(), tabs), OpenInDeepstack(gr.Image(), gr.Textbox(), tabs),
                           OpenInLora(gr.Image(), gr.Textbox(), gr.Dropdown(["demo"]), tabs))


@pytest.mark.parametrize("adapters", [[None, "demo"], [None, None]])
def test_each_open_button_fills_its_boxes_by_name(workspace, targets, adapters):
    """Row 1 of the bundled dataset: its prompt, and its picture as saved for the other tab (the
    same pixels); LoRA's adapter box only when the run had an adapter."""
    run = {"source": str(BUNDLED_DATASET), "columns": asdict(Columns()), "adapters": adapters}
    sample = open_dataset(str(BUNDLED_DATASET)).sample(1)
    picture = np.asarray(sample.images[0].convert("RGB"))
    open_chat, open_deepstack, open_lora = open_handlers(workspace, targets)

    chat = open_chat(run, 1)
    assert list(chat) == targets.chat.components() and chat[targets.chat.tabs].selected == "chat"
    assert chat[targets.chat.message]["text"] == sample.prompt
    deepstack = open_deepstack(run, "1")
    assert list(deepstack) == targets.deepstack.components()
    assert deepstack[targets.deepstack.prompt] == sample.prompt and deepstack[targets.deepstack.tabs].selected == "deepstack"
    lora = open_lora(run, 1)
    wanted = targets.lora.components() if adapters[1] else [box for box in targets.lora.components()
                                                            if box is not targets.lora.adapter]
    assert list(lora) == wanted
    if adapters[1]:
        assert lora[targets.lora.adapter]["value"] == "demo"
    for path in (chat[targets.chat.message]["files"][0], deepstack[targets.deepstack.image], lora[targets.lora.image]):
        assert np.array_equal(np.asarray(Image.open(path).convert("RGB")), picture)


def test_the_line_under_a_dataset_counts_its_rows_and_names_a_column_not_guessed(tmp_path):
    """A one-row folder whose picture column is 'picture': "1 row", and where to name the column;
    the bundled dataset: its row count as ``open_dataset`` reads it, nothing to name. (The line is
    Markdown: the label and the column names come escaped.)"""
    folder = tmp_path / "data" / "one"
    folder.mkdir(parents=True)
    Image.new("RGB", (8, 8), "red").save(folder / "a.png")
    (folder / "metadata.csv").write_text("picture,question\na.png,What colour?\n")
    (tmp_path / "sessions").mkdir()
    sessions = SessionStores(tmp_path / "sessions", {"uploads": 1, "runs": 1, "files": 1})
    workspace = EvalWorkspace(sessions, [tmp_path / "data"])
    try:
        one = guessed_columns("data1:one", None, workspace, strict=True)
        assert dataset_line(dataset_label("data1:one"), one) == (
            "1 row in data folder\\: one. No image column guessed (columns: picture\\, question): "
            "type its name in the box 'image column' (Column mapping).")
        bundled = guessed_columns(BUNDLED, None, workspace, strict=True)
        rows = len(open_dataset(str(BUNDLED_DATASET), None, [BUNDLED_DATASET.parent]))
        assert rows > 1 and dataset_line(dataset_label(BUNDLED), bundled) == (
            f"{rows:,} rows in {escape_markdown(f'bundled: {BUNDLED_DATASET.name}')}.")
    finally:
        sessions.close()
