"""The Attribution tab: which image regions, through which of the 8 levels, an answer token relied
on; whether that map beats random removal (the deletion test); and the logit lens over the image."""

from dataclasses import dataclass

import gradio as gr

from g4v.attribution.deletion import describe_area
from g4v.attribution.gradients import METHODS
from g4v.attribution.run import AttributionReport, AttributionSettings, run_attribution
from g4v.errors import MAX_NUMBER_CHARS, WHOLE_TEXT, G4VError, quoted
from g4v.model.levels import describe_levels
from webapp.common import MODEL_QUEUE, OutputBoxes, markdown_code, shows_errors
from webapp.pictures import picture_row
from webapp.runs import busy_while_running, live_progress, previous_run_mark, run_keeping_previous
from webapp.sessions import SessionStores, session_key

WHOLE_ANSWER = "the whole answer"
EXPLAIN, EXPLAINING = "Explain", "Explaining…"  # the button, and what it says while a run works
#: What the tab's widgets start at: the settings' own defaults (``python -m g4v attribute``'s too).
DEFAULTS = AttributionSettings()
RUN_HINT = ("An explanation runs the model forward and backward many times (the deletion test, the logit lens) "
            "and draws five pictures: a few seconds for the demo checkpoint on a CPU, longer for the real model; "
            "the bar shows each stage and the time left.")


def token_choice(text: str | None) -> int | None:
    """The dropdown's ``"0: 'red'"`` -> 0; :data:`WHOLE_ANSWER` -> None (sum over the answer)."""
    if not text or text == WHOLE_ANSWER:
        return None if text == WHOLE_ANSWER else 0
    head = str(text).split(":", 1)[0].strip()
    if not WHOLE_TEXT.fullmatch(head) or head[0] in "+-" or len(head) > MAX_NUMBER_CHARS:
        raise G4VError(f"pick an answer token from the list, not {quoted(text)}")
    return int(head)


def report_markdown(report: AttributionReport) -> str:
    attribution, deletion, answer = report.attribution, report.deletion, report.answer
    totals = ", ".join(f"{name} {value:+.3g}" for name, value in attribution.level_totals().items())
    head, _, rest = describe_area(deletion, answer.measure).partition(": ")
    lines = [f"**Answer:** {markdown_code(''.join(answer.texts))}",
             f"**Explained:** {answer.describe()}, {answer.measure} {attribution.target_logprob:.4g}",
             f"**Per level (sum over image tokens):** {totals}",
             f"**{head[0].upper()}{head[1:]}:** {rest}"]
    if attribution.method == "ig":
        lines.append(f"**Integrated gradients:** {attribution.steps} steps, completeness gap "
                     f"{attribution.convergence_delta:.3g} (scores sum vs f(image) - f(no image))")
    return "\n\n".join(lines)


@dataclass
class ExplainBoxes(OutputBoxes):
    """An explanation's results, in ``/attribute``'s order."""

    token: gr.Dropdown  # the answer's tokens, the explained one chosen
    report: gr.Markdown
    tiles: gr.Image
    base: gr.Image
    deletion: gr.Image
    lens: gr.Image
    lens_levels: gr.Image
    export: gr.File


def make_explain(engine, sessions: SessionStores, gpu_task, boxes: ExplainBoxes):
    @gpu_task
    @shows_errors
    def explain(image_path, prompt, target, token, method, deletion_level, against="", request: gr.Request = None,
                progress=gr.Progress()):
        """Attribute one answer token (or the whole answer) to the image tokens of every level;
        with ``against`` (comma-separated answers), the whole answer's log-odds against them."""
        rivals = tuple(part.strip() for part in (against or "").split(",") if part.strip())
        settings = AttributionSettings(target=target or None, token=token_choice(token), method=method,
                                       deletion_level=deletion_level or None, against=rivals)
        # the export goes to the visitor's own store
        with sessions.using(session_key(request)) as visitor, live_progress(progress) as tell:
            report = run_attribution(engine, image_path, prompt, settings, exports=visitor.stores["inspect"],
                                     progress=tell)
        tokens = [f"{i}: {text!r}" for i, text in enumerate(report.answer.texts)] + [WHOLE_ANSWER]
        chosen = WHOLE_ANSWER if report.answer.target is None else tokens[report.answer.target]
        figures = report.figures
        return {boxes.token: gr.update(choices=tokens, value=chosen), boxes.report: report_markdown(report),
                boxes.tiles: figures["tile"], boxes.base: figures["base"], boxes.deletion: figures["deletion"],
                boxes.lens: figures.get("lens"), boxes.lens_levels: figures.get("lens_levels"),
                boxes.export: [str(path) for path in report.files]}

    return explain


def attribution_tab(engine, config, last_chat_image: gr.State, sessions: SessionStores, concurrency: int = 1,
                    gpu_task=lambda fn: fn) -> None:
    gr.Markdown("Which image regions, through which of the 8 levels, an answer token relied on "
                "(gradient x input, or integrated gradients), whether that map beats removing random "
                "tokens, and what each layer would predict at the image positions (logit lens).")
    level_names = [level.name for level in describe_levels(config)] if config is not None else []
    with picture_row("attribution", last_chat_image, status=RUN_HINT) as row:  # the run's progress under the picture
        prompt = gr.Textbox(label="Prompt", value="What colour is the shape?", elem_id="attribution-prompt")
        target = gr.Textbox(label="Answer to explain (empty: the model's own answer)")
        token = gr.Dropdown([str(DEFAULTS.token), WHOLE_ANSWER], value=str(DEFAULTS.token), allow_custom_value=True,
                            label="Answer token (filled after a run)", elem_id="attribution-token")
        with gr.Row():
            method = gr.Radio(list(METHODS), value=DEFAULTS.method, label="Method")
            deletion_level = gr.Dropdown([("(all levels)", ""), *level_names], value="",
                                         label="Deletion test at one level only")
        against = gr.Textbox(label="Explain against (other answers, comma-separated; empty: the answer's "
                             "own log-probability)", value="", placeholder="e.g. red, green, blue",
                             elem_id="attribution-against")
        run = gr.Button(EXPLAIN, variant="primary", elem_id="attribution-run")
    image, status = row.image, row.status
    report = gr.Markdown(elem_id="attribution-report")
    # One picture a row, at the page's width, without Gradio's label over it: each carries its title.
    pictures = {"show_label": False, "format": "png"}
    tiles = gr.Image(label="Attribution over the image (tiles)", elem_id="attribution-tiles", **pictures)
    base = gr.Image(label="Attribution over the image (base view)", **pictures)
    deletion = gr.Image(label="Deletion test", elem_id="attribution-deletion", **pictures)
    lens = gr.Image(label="Logit lens (residual stream)", **pictures)
    lens_levels = gr.Image(label="Logit lens (each level's features)", **pictures)
    export = gr.File(interactive=False, label="Export (summary.json, PNGs, attribution.safetensors)",
                     file_count="multiple")
    boxes = ExplainBoxes(token=token, report=report, tiles=tiles, base=base, deletion=deletion, lens=lens,
                         lens_levels=lens_levels, export=export)

    ready = busy_while_running(run, EXPLAINING)
    # a refused run leaves the results on show, marked as the previous run's; so does another picture,
    # one uploaded while the run works included
    explained = run_keeping_previous(run, make_explain(engine, sessions, gpu_task, boxes),
                                     [image, prompt, target, token, method, deletion_level, against],
                                     boxes.components(), report, picture=image, api_name="attribute",
                                     concurrency_id=MODEL_QUEUE, concurrency_limit=concurrency,
                                     show_progress_on=status)
    ready(explained)
    image.change(**previous_run_mark(report))
    token.input(**previous_run_mark(report))  # another answer token: the results are of the one explained
