"""The Deepstack tab: what each of the 8 injections carries into the language model, and what
changes when levels are zeroed or scaled."""

from dataclasses import dataclass

import gradio as gr

from g4v.model.levels import describe_levels
from g4v.inspect.run import InspectionResult, run_inspection
from g4v.inspect.settings import InspectSettings
from webapp.common import MODEL_QUEUE, OutputBoxes, markdown_code, shows_errors
from webapp.pictures import picture_row
from webapp.runs import busy_while_running, live_progress, previous_run_mark, run_keeping_previous
from webapp.sessions import SessionStores, session_key

INSPECT, INSPECTING = "Inspect", "Inspecting…"  # the button, and what it says while a run works
LEVEL_COLUMNS = ["level", "kind", "vision layer", "LLM layer", "injected norm", "residual before", "residual after"]
#: The tab's starting choices: ``inspect``'s defaults, written once in InspectSettings.
DEFAULTS = InspectSettings()
RUN_HINT = ("An inspection runs the model once (twice with levels zeroed or scaled) and draws four pictures: "
            "a few seconds for the demo checkpoint on a CPU; the bar shows each stage and the time left.")


def ablation_report(result: InspectionResult) -> str:
    top = ", ".join(f"{markdown_code(t.text)} {t.prob:.3f}" for t in result.outcome.top5)
    lines = [f"**Next token (top 5):** {top}", f"**Greedy continuation:** {markdown_code(result.outcome.continuation)}"]
    if result.unchanged_levels:
        lines.append(f"**Unchanged (factor 1, no second run):** {', '.join(result.unchanged_levels)}")
    ablation = result.ablation
    if ablation:
        after = ", ".join(f"{markdown_code(t.text)} {t.prob:.3f}" for t in ablation.after.top5)
        changed = {name: f for name, f in ablation.scales.items() if f != 1.0}
        lines += [
            f"**Changed levels:** {', '.join(f'{n} x{f:g}' for n, f in changed.items())}",
            f"**KL(before || after) of the next token:** {ablation.kl_divergence:.4g}",
            f"**Top 5 after:** {after}",
            f"**Greedy continuation after:** {markdown_code(ablation.after.continuation)}",
        ]
    return "\n\n".join(lines)


def level_table(result: InspectionResult) -> list[list]:
    """One row of :data:`LEVEL_COLUMNS` per level."""
    return [[cap.level.name, cap.level.kind, cap.level.vision_layer, cap.level.llm_layer,
             round(cap.injected_norm_mean, 3), round(cap.residual_norm_before_image, 3),
             round(cap.residual_norm_after_image, 3)] for cap in result.capture.levels]


@dataclass
class InspectBoxes(OutputBoxes):
    """The inspection's results, in ``/inspect``'s order."""

    table: gr.Dataframe
    norms: gr.Image
    trajectory: gr.Image
    heat_tiles: gr.Image
    heat_base: gr.Image
    report: gr.Markdown  # above the results: a refused or outdated run's mark goes here
    export: gr.File


def make_inspect(engine, sessions: SessionStores, gpu_task, boxes: InspectBoxes):
    @gpu_task
    @shows_errors
    def inspect(image_path, prompt, ablate, scales_text, full, request: gr.Request, progress=gr.Progress()):
        """Deepstack: capture the 8 injections (4 deepstack, 4 spatial levels) of the vision features
        into the language model for one picture and prompt; zero (ablate) or scale levels if asked.
        The export goes to the visitor's own store (through MCP, one store for every agent).

        Args:
            image_path: the picture: a URL, or a data: URL for an upload.
            prompt: the question asked about the picture.
            ablate: the levels to zero, by name (deepstack0-3, spatial_TL, spatial_TR, spatial_BL, spatial_BR).
            scales_text: levels to scale, as "level=factor" separated by commas (deepstack0=0.5, spatial_TL=2).
            full: keep the full tensors in the export (larger).

        Returns:
            table: one row per level: level, kind, vision layer, LLM layer, injected norm, residual norms before and after
            picture: injected against residual norms per level
            picture: the residual norm through the layers
            picture: the injected norm over the picture's tiles
            picture: the injected norm over the base view
            report: the next token's top 5 and the greedy continuation (Markdown), with what ablation changed
            export: a zip (summary.json, the pictures, capture.safetensors)
        """
        settings = InspectSettings(ablate=list(ablate or ()), full=bool(full),
                                   scale=[part.strip() for part in (scales_text or "").split(",") if part.strip()])
        scales = settings.scales()
        with sessions.using(session_key(request)) as visitor, live_progress(progress) as tell:
            result = run_inspection(engine, image_path, prompt, ablate=settings.ablate, scale=scales,
                                    full=settings.full, max_new_tokens=settings.max_new_tokens,
                                    exports=visitor.stores["inspect"], progress=tell)
        figures = result.figures
        return {boxes.table: level_table(result), boxes.norms: figures["norms"],
                boxes.trajectory: figures["trajectory"], boxes.heat_tiles: figures["heatmaps_tile"],
                boxes.heat_base: figures["heatmaps_base"], boxes.report: ablation_report(result),
                boxes.export: str(result.export_zip)}

    return inspect


def deepstack_tab(engine, config, last_chat_image: gr.State, sessions: SessionStores, concurrency: int = 1,
                  gpu_task=lambda fn: fn) -> tuple[gr.Image, gr.Textbox]:
    """Render the tab; returns its image and prompt inputs, which other tabs fill (the Evaluate
    tab's "Open in Deepstack")."""
    gr.Markdown("What each of the 8 injections carries into the language model, where, and what "
                "changes when a level is zeroed or scaled.")
    level_names = [level.name for level in describe_levels(config)] if config is not None else []
    with picture_row("deepstack", last_chat_image, status=RUN_HINT) as row:  # the run's progress under the picture
        prompt = gr.Textbox(label="Prompt", value="What colour is the shape?", elem_id="deepstack-prompt")
        ablate = gr.CheckboxGroup(level_names, value=DEFAULTS.ablate, label="Ablate (zero) these levels")
        scales = gr.Textbox(value=", ".join(DEFAULTS.scale), label="Scale levels",
                            placeholder="e.g. deepstack0=0.5, spatial_TL=2")
        full = gr.Checkbox(value=DEFAULTS.full, label="Keep full tensors in the export")
        run = gr.Button(INSPECT, variant="primary", elem_id="deepstack-run")
    image, status = row.image, row.status
    report = gr.Markdown(elem_id="deepstack-report")
    table = gr.Dataframe(headers=LEVEL_COLUMNS, label="Levels", interactive=False)
    # One picture a row, at the page's width, without Gradio's label over it: each carries its title.
    norms = gr.Image(label="Injected vs residual norms", show_label=False, format="png", elem_id="deepstack-norms")
    trajectory = gr.Image(label="Residual norm through the layers", show_label=False, format="png")
    heat_tiles = gr.Image(label="Injected norm over the image (tiles)", show_label=False, format="png")
    heat_base = gr.Image(label="Injected norm over the image (base view)", show_label=False, format="png")
    export = gr.File(interactive=False, label="Export (summary.json, PNGs, capture.safetensors)")
    boxes = InspectBoxes(table=table, norms=norms, trajectory=trajectory, heat_tiles=heat_tiles, heat_base=heat_base,
                         report=report, export=export)

    # a refused run leaves the results on show, marked as the previous run's; so does another picture,
    # one uploaded while the run works included
    ready = busy_while_running(run, INSPECTING)
    event = run_keeping_previous(run, make_inspect(engine, sessions, gpu_task, boxes),
                                 [image, prompt, ablate, scales, full], boxes.components(), report,
                                 picture=image, api_name="inspect", concurrency_id=MODEL_QUEUE,
                                 concurrency_limit=concurrency, show_progress_on=status)
    ready(event)
    image.change(**previous_run_mark(report))
    return image, prompt
