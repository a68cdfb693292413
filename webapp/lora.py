"""The LoRA tab: base model and adapter answers side by side, and where they part token by token."""

import threading
from dataclasses import dataclass

import gradio as gr

from g4v.conversation import SamplingSettings
from g4v.lora.choices import (adapter_folder_help, adapter_note, base_warning, describe_adapters,
                              preselected_adapter)
from g4v.lora.models import model_choices
from g4v.lora.settings import LoraDiffSettings
from g4v.lora.side_by_side import lora_side_by_side
from g4v.lora.token_diff import lora_token_diff
from webapp.common import MODEL_QUEUE, OutputBoxes, escape_markdown, sampling_settings, shows_errors
from webapp.pictures import picture_row
from webapp.runs import empties_on, without_error_badges

#: The tab's starting choices: the command's defaults (``lora-diff``), written once in LoraDiffSettings.
DEFAULTS = LoraDiffSettings()


@dataclass
class AnswerBoxes(OutputBoxes):
    """The two answers, in ``/lora_side_by_side``'s order."""

    left: gr.Textbox
    right: gr.Textbox


@dataclass
class DiffBoxes(OutputBoxes):
    """The token diff's results, in ``/lora_diff``'s order (the answers too, so they never show an
    earlier input's answers beside the diff)."""

    html: gr.HTML
    plot: gr.Plot
    numbers: gr.JSON
    left_answer: gr.Textbox
    right_answer: gr.Textbox


@dataclass
class PickerBoxes(OutputBoxes):
    """What follows the adapter's kind and the user's choice of models: both pickers and the
    names of both answer boxes."""

    left: gr.Dropdown
    right: gr.Dropdown
    left_answer: gr.Textbox
    right_answer: gr.Textbox


def make_handlers(engine, adapters_dir, gpu_task, answers: AnswerBoxes, diffs: DiffBoxes):
    @gpu_task
    @shows_errors
    def side_by_side(adapter, image_path, prompt, max_new_tokens, temperature, seed, left=DEFAULTS.left,
                     right=DEFAULTS.right):
        """The two chosen models' answers, streamed together with the same settings and seed."""
        settings = sampling_settings(max_new_tokens, temperature, seed=seed)
        for left_text, right_text in lora_side_by_side(engine, adapter or "", prompt, [image_path] if image_path else [],
                                                       settings, adapters_dir=adapters_dir, cancel=threading.Event(),
                                                       left=left, right=right):
            yield {answers.left: left_text, answers.right: right_text}

    @gpu_task
    @shows_errors
    def token_diff(adapter, image_path, prompt, max_new_tokens, left=DEFAULTS.left, right=DEFAULTS.right):
        """Greedy answers of the two chosen models, scored token by token under both; the answer
        boxes get those answers too, so they never show an earlier input's answers beside the diff."""
        settings = LoraDiffSettings(adapter=adapter or None, left=left, right=right,
                                    max_new_tokens=sampling_settings(max_new_tokens).max_new_tokens)
        view = lora_token_diff(engine, prompt, [image_path] if image_path else [], settings, adapters_dir=adapters_dir)
        return {diffs.html: view.html, diffs.plot: view.figure, diffs.numbers: view.diff.to_dict(),
                diffs.left_answer: view.diff.base.text, diffs.right_answer: view.diff.tuned.text}

    return side_by_side, token_diff


def warning_line(name, adapters_dir, model) -> str:
    """The line under the pickers when the adapter was made for another base: text as written (the
    adapter's folder name and its config's base are the adapter's own words, never markup)."""
    return escape_markdown(base_warning(name, adapters_dir, model))


def _pickers(engine, adapters_dir, boxes: PickerBoxes, adapter, left, right) -> dict:
    """Both model pickers and both answer boxes named for ``adapter``'s kind (a choice the new
    list lacks falls back to the default)."""
    choices = model_choices(engine, adapter, adapters_dir)
    labels = dict((which, label) for label, which in choices)
    left = left if left in labels else DEFAULTS.left
    right = right if right in labels else DEFAULTS.right
    return {boxes.left: gr.Dropdown(choices=choices, value=left), boxes.right: gr.Dropdown(choices=choices, value=right),
            boxes.left_answer: gr.Textbox(label=labels[left]), boxes.right_answer: gr.Textbox(label=labels[right])}


def lora_tab(engine, model: str, adapters_dir, last_chat_image: gr.State, concurrency: int = 1,
             gpu_task=lambda fn: fn) -> tuple[gr.Dropdown, gr.Image, gr.Textbox]:
    """Render the tab; returns its adapter, image and prompt inputs, which other tabs fill (the
    Evaluate tab's "Open in LoRA")."""
    gr.Markdown("Two models' answers side by side, and where they differ token by token: on a checkpoint with a "
                "vision LoRA the base language model, the vision model (what Chat runs) and your adapter as its "
                "kind runs (on top of the vision LoRA, or in its place); otherwise the model and the adapter. "
                + escape_markdown(adapter_folder_help(adapters_dir)))
    options = describe_adapters(adapters_dir, model)  # adapters made for this model first
    # a row of its own: an entry names its base ("... (made for assets/granite4-vision-tiny-trained)"),
    # cut off in a third of the page
    adapter = gr.Dropdown([(option.label, option.name) for option in options],
                          value=preselected_adapter(adapters_dir, model), label="Adapter",
                          info=adapter_note(options, engine.vision_lora is not None) or None,
                          allow_custom_value=True, elem_id="lora-adapter")
    with picture_row("lora", last_chat_image, label="Image (optional)", height=200) as row:
        max_new_tokens = gr.Slider(1, 256, value=DEFAULTS.max_new_tokens, step=1, label="Max new tokens")
        temperature = gr.Slider(0.0, 2.0, value=SamplingSettings.temperature, step=0.05,
                                label="Temperature (0 = greedy)")
        # A fixed seed, not SamplingSettings' fresh one: with sampling on, both columns draw with
        # the same seed, so where they part is the models' doing, and a rerun repeats.
        seed = gr.Number(value=0, label="Seed")  # checked by sampling_settings
    image = row.image
    choices = model_choices(engine, adapter.value, adapters_dir)
    with gr.Row():
        left = gr.Dropdown(choices, value=DEFAULTS.left, label="Left model", elem_id="lora-left")
        right = gr.Dropdown(choices, value=DEFAULTS.right, label="Right model", elem_id="lora-right")
    warning = gr.Markdown(warning_line(adapter.value, adapters_dir, model), elem_id="lora-base-warning")
    prompt = gr.Textbox(label="Prompt", value="What colour is the shape?", elem_id="lora-prompt")
    with gr.Row():
        run = gr.Button("Run side by side", variant="primary")
        diff_run = gr.Button("Token-level difference")
        stop = gr.Button("Stop")
    with gr.Row():
        labels = dict((which, label) for label, which in choices)
        base_answer = gr.Textbox(label=labels[DEFAULTS.left], lines=4, interactive=False, elem_id="lora-left-answer")
        adapter_answer = gr.Textbox(label=labels[DEFAULTS.right], lines=4, interactive=False,
                                    elem_id="lora-right-answer")
    diff_html = gr.HTML(elem_id="lora-diff")
    diff_plot = gr.Plot(label="Log-probabilities and KL per token")
    diff_json = gr.JSON(label="Numbers", visible=False)

    answers = AnswerBoxes(left=base_answer, right=adapter_answer)
    diffs = DiffBoxes(html=diff_html, plot=diff_plot, numbers=diff_json, left_answer=base_answer,
                      right_answer=adapter_answer)
    pickers = PickerBoxes(left=left, right=right, left_answer=base_answer, right_answer=adapter_answer)
    side_by_side, token_diff = make_handlers(engine, adapters_dir, gpu_task, answers, diffs)
    adapter.change(lambda name: warning_line(name, adapters_dir, model), adapter, warning, api_visibility="private",
                   queue=False, show_progress="hidden")  # a mismatch runs, with this line in view
    # names and answer boxes follow the adapter's kind (whoever sets it) and the user's choices
    picked = [adapter, left, right]
    for event in (adapter.change, left.input, right.input):
        event(lambda *values: _pickers(engine, adapters_dir, pickers, *values), picked, pickers.components(),
              api_visibility="private", queue=False, show_progress="hidden")
    model_bound = {"concurrency_id": MODEL_QUEUE, "concurrency_limit": concurrency}
    running = run.click(side_by_side, [adapter, image, prompt, max_new_tokens, temperature, seed, left, right],
                        answers.components(), api_name="lora_side_by_side", **model_bound)
    diffing = diff_run.click(token_diff, [adapter, image, prompt, max_new_tokens, left, right], diffs.components(),
                             api_name="lora_diff", **model_bound)
    without_error_badges(running, answers.components())
    without_error_badges(diffing, diffs.components())
    # another picture (uploaded, from Chat, a PDF page, "Open in LoRA"): the answers and the diff
    # were the old picture's, so they go rather than stand unmarked beside the new one
    empties_on(image.change, [base_answer, adapter_answer, diff_html, diff_plot])
    stop.click(None, cancels=[running, diffing], api_visibility="private")
    return adapter, image, prompt
