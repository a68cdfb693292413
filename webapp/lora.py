"""The LoRA tab: base model and adapter answers side by side, and where they part token by token."""

import threading

import gradio as gr

from g4v.lora.side_by_side import (adapter_folder_help, base_warning, describe_adapters, lora_side_by_side,
                                   preselected_adapter)
from g4v.lora.token_diff import lora_token_diff
from webapp.common import (MODEL_QUEUE, image_input, sampling_settings, shows_errors, use_last_chat_image,
                            without_error_badges)
from webapp.documents import document_picker


def make_handlers(engine, adapters_dir, gpu_task):
    @gpu_task
    @shows_errors
    def side_by_side(adapter, image_path, prompt, max_new_tokens, temperature, seed):
        """Base and adapter answers, streamed together with the same settings and seed."""
        settings = sampling_settings(max_new_tokens, temperature, seed=seed)
        yield from lora_side_by_side(engine, adapter or "", prompt, [image_path] if image_path else [], settings,
                                     adapters_dir=adapters_dir, cancel=threading.Event())

    @gpu_task
    @shows_errors
    def token_diff(adapter, image_path, prompt, max_new_tokens):
        """Greedy answers with and without the adapter, scored token by token under both."""
        settings = sampling_settings(max_new_tokens)
        view = lora_token_diff(engine, adapter or "", prompt, [image_path] if image_path else [],
                               settings.max_new_tokens, adapters_dir=adapters_dir)
        return view.html, view.figure, view.data

    return side_by_side, token_diff


def lora_tab(engine, model: str, adapters_dir, last_chat_image: gr.State, concurrency: int = 1,
             gpu_task=lambda fn: fn) -> tuple[gr.Dropdown, gr.Image, gr.Textbox]:
    """Render the tab; returns its adapter, image and prompt inputs, which other tabs fill (the
    Evaluate tab's "Open in LoRA")."""
    gr.Markdown("Base model and adapter answers side by side, and where they differ token by token. "
                + adapter_folder_help(adapters_dir))
    with gr.Row():
        options = describe_adapters(adapters_dir, model)  # adapters made for this model first
        adapter = gr.Dropdown([(option.label, option.name) for option in options],
                              value=preselected_adapter(adapters_dir, model), label="Adapter",
                              allow_custom_value=True, elem_id="lora-adapter")
        image = image_input(label="Image (optional)", height=200, elem_id="lora-image")
        with gr.Column():
            from_chat = gr.Button("Use the last chat image", elem_id="lora-from-chat")
            document_picker(image, elem_id="lora-doc")
            max_new_tokens = gr.Slider(1, 256, value=48, step=1, label="Max new tokens")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            seed = gr.Number(value=0, label="Seed")  # checked by sampling_settings
    warning = gr.Markdown(base_warning(adapter.value, adapters_dir, model), elem_id="lora-base-warning")
    prompt = gr.Textbox(label="Prompt", value="What colour is the shape?", elem_id="lora-prompt")
    with gr.Row():
        run = gr.Button("Run side by side", variant="primary")
        diff_run = gr.Button("Token-level difference")
        stop = gr.Button("Stop")
    with gr.Row():
        base_answer = gr.Textbox(label="Base model", lines=4, interactive=False, elem_id="lora-base-answer")
        adapter_answer = gr.Textbox(label="With adapter", lines=4, interactive=False)
    diff_html = gr.HTML()
    diff_plot = gr.Plot(label="Log-probabilities and KL per token")
    diff_json = gr.JSON(label="Numbers", visible=False)

    side_by_side, token_diff = make_handlers(engine, adapters_dir, gpu_task)
    use_last_chat_image(from_chat, last_chat_image, image)
    adapter.change(lambda name: base_warning(name, adapters_dir, model), adapter, warning, api_visibility="private",
                   queue=False, show_progress="hidden")  # a mismatch runs, with this line in view
    model_bound = {"concurrency_id": MODEL_QUEUE, "concurrency_limit": concurrency}
    running = run.click(side_by_side, [adapter, image, prompt, max_new_tokens, temperature, seed],
                        [base_answer, adapter_answer], api_name="lora_side_by_side", **model_bound)
    diffing = diff_run.click(token_diff, [adapter, image, prompt, max_new_tokens], [diff_html, diff_plot, diff_json],
                             api_name="lora_diff", **model_bound)
    without_error_badges(running, [base_answer, adapter_answer])
    without_error_badges(diffing, [diff_html, diff_plot, diff_json])
    stop.click(None, cancels=[running, diffing], api_visibility="private")
    return adapter, image, prompt
