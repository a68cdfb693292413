"""The Deepstack tab: what each of the 8 injections carries into the language model, and what
changes when levels are zeroed or scaled."""

import gradio as gr

from g4v.model.levels import describe_levels
from g4v.inspect.run import run_inspection
from g4v.inspect.settings import InspectSettings
from webapp.common import (MODEL_QUEUE, image_input, last_chat_image_button, markdown_code, refuse_non_pictures, shows_errors,
                           use_last_chat_image, without_error_badges)
from webapp.documents import document_picker
from webapp.sessions import SessionStores, session_key

LEVEL_COLUMNS = ["level", "kind", "vision layer", "LLM layer", "injected norm", "residual before", "residual after"]
#: The tab's starting choices: ``inspect``'s defaults, written once in InspectSettings.
DEFAULTS = InspectSettings()


def ablation_report(summary: dict) -> str:
    top = ", ".join(f"{markdown_code(t['text'])} {t['prob']:.3f}" for t in summary["next_token_top5"])
    lines = [f"**Next token (top 5):** {top}", f"**Greedy continuation:** {markdown_code(summary['continuation'])}"]
    if summary.get("unchanged_levels"):
        lines.append(f"**Unchanged (factor 1, no second run):** {', '.join(summary['unchanged_levels'])}")
    ablation = summary.get("ablation")
    if ablation:
        after = ", ".join(f"{markdown_code(t['text'])} {t['prob']:.3f}" for t in ablation["top5_after"])
        changed = {name: f for name, f in ablation["scales"].items() if f != 1.0}
        lines += [
            f"**Changed levels:** {', '.join(f'{n} x{f:g}' for n, f in changed.items())}",
            f"**KL(before || after) of the next token:** {ablation['kl_divergence']:.4g}",
            f"**Top 5 after:** {after}",
            f"**Greedy continuation after:** {markdown_code(ablation['continuation_after'])}",
        ]
    return "\n\n".join(lines)


def make_inspect(engine, sessions: SessionStores, gpu_task):
    @gpu_task
    @shows_errors
    def inspect(image_path, prompt, ablate, scales_text, full, request: gr.Request):
        """Capture the 8 injections for one image and prompt; ablate or scale levels if asked. The
        export goes to the visitor's own store."""
        settings = InspectSettings(ablate=list(ablate or ()), full=bool(full),
                                   scale=[part.strip() for part in (scales_text or "").split(",") if part.strip()])
        scales = settings.scales()
        with sessions.using(session_key(request)) as visitor:
            result = run_inspection(engine, image_path, prompt, ablate=settings.ablate, scale=scales,
                                    full=settings.full, max_new_tokens=settings.max_new_tokens,
                                    exports=visitor.stores["inspect"])
        rows = [[lv["name"], lv["kind"], lv["vision_layer"], lv["llm_layer"], round(lv["injected_norm_mean"], 3),
                 round(lv["residual_norm_before_mean"], 3), round(lv["residual_norm_after_mean"], 3)]
                for lv in result.summary["levels"]]
        figures = result.figures
        return (rows, figures["norms"], figures["trajectory"], figures["heatmaps_tile"], figures["heatmaps_base"],
                ablation_report(result.summary), str(result.export_zip))

    return inspect


def deepstack_tab(engine, config, last_chat_image: gr.State, sessions: SessionStores, concurrency: int = 1,
                  gpu_task=lambda fn: fn) -> tuple[gr.Image, gr.Textbox]:
    """Render the tab; returns its image and prompt inputs, which other tabs fill (the Evaluate
    tab's "Open in Deepstack")."""
    gr.Markdown("What each of the 8 injections carries into the language model, where, and what "
                "changes when a level is zeroed or scaled.")
    level_names = [level.name for level in describe_levels(config)] if config is not None else []
    with gr.Row():
        image = image_input(label="Image", height=240, elem_id="deepstack-image")
        refuse_non_pictures(image)
        with gr.Column():
            from_chat = last_chat_image_button("deepstack-from-chat")
            document_picker(image, elem_id="deepstack-doc")
            prompt = gr.Textbox(label="Prompt", value="What colour is the shape?", elem_id="deepstack-prompt")
            ablate = gr.CheckboxGroup(level_names, value=DEFAULTS.ablate, label="Ablate (zero) these levels")
            scales = gr.Textbox(value=", ".join(DEFAULTS.scale), label="Scale levels",
                                placeholder="e.g. deepstack0=0.5, spatial_TL=2")
            full = gr.Checkbox(value=DEFAULTS.full, label="Keep full tensors in the export")
            run = gr.Button("Inspect", variant="primary", elem_id="deepstack-run")
    table = gr.Dataframe(headers=LEVEL_COLUMNS, label="Levels", interactive=False)
    report = gr.Markdown()
    # One picture a row, at the page's width, without Gradio's label over it: each carries its title.
    norms = gr.Image(label="Injected vs residual norms", show_label=False, format="png", elem_id="deepstack-norms")
    trajectory = gr.Image(label="Residual norm through the layers", show_label=False, format="png")
    heat_tiles = gr.Image(label="Injected norm over the image (tiles)", show_label=False, format="png")
    heat_base = gr.Image(label="Injected norm over the image (base view)", show_label=False, format="png")
    export = gr.File(label="Export (summary.json, PNGs, capture.safetensors)")

    use_last_chat_image(from_chat, last_chat_image, image)
    outputs = [table, norms, trajectory, heat_tiles, heat_base, report, export]
    without_error_badges(run.click(make_inspect(engine, sessions, gpu_task), [image, prompt, ablate, scales, full],
                                   outputs, api_name="inspect", concurrency_id=MODEL_QUEUE,
                                   concurrency_limit=concurrency), outputs)
    return image, prompt
