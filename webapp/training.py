"""The Training tab: a training run's 8 levels over its steps, its warnings, and two of its steps
side by side. The work is :mod:`g4v.training`; the table and the curves are what
``python -m g4v training RUN_DIR`` prints and draws (:mod:`g4v.training.report`).

Runs come only from the run folders (``--runs-dir``, else ``$G4V_RUNS_DIR``, else ``assets``). A
run's checkpoints are loaded one at a time, each in a model of its own beside the served one, and
closed before the next: the served model is never replaced, and never more than one checkpoint
is in memory (one loading request at a time, the others wait in the tab's queue)."""

import time
from dataclasses import dataclass

import gradio as gr

from g4v.errors import G4VError
from g4v.training.measure import ANSWER_TOKENS, default_probe, open_steps
from g4v.training.report import COLUMNS, alert_lines, headline, kept_line, open_run, summary_rows
from g4v.training.runs import folder_label, list_runs, read_run, resolve_run, runs_dirs
from viz.training import curves_figure, steps_figure
from webapp.common import OutputBoxes, optional_whole, shows_errors
from webapp.pictures import picture_row
from webapp.runs import time_left, without_error_badges

#: One run loaded or measured at a time, whoever asks: each measured checkpoint is a model in memory.
TRAINING_QUEUE = "training"
STEP_COLUMNS = ["level", "injected norm A", "injected norm B", "ratio A", "ratio B", "dominant A", "dominant B"]
#: The run the tab preselects ("Open run" shows it): the trained demo checkpoint's own training log.
DEMO_RUN = "granite4-vision-tiny-trained"


@dataclass
class RunBoxes(OutputBoxes):
    """What opening a run fills, in ``/training``'s order."""

    status: gr.Markdown
    table: gr.Dataframe
    curves: gr.Image
    step_a: gr.Dropdown
    step_b: gr.Dropdown
    opened: gr.State  # the run's name, for the side-by-side view
    data: gr.JSON


@dataclass
class StepBoxes(OutputBoxes):
    """What opening two steps fills, in ``/training_steps``'s order."""

    table: gr.Dataframe
    figure: gr.Image
    answer_a: gr.Textbox
    answer_b: gr.Textbox


def status_text(curves) -> str:
    lines = [f"**{headline(curves)}**"]
    warnings = alert_lines(curves)
    if warnings:
        lines.append("Warnings (marked on the curves: ▼ collapse, ▲ explosion):\n\n" +
                     "\n".join(f"- {line}" for line in warnings))
    lines.append(kept_line(curves))
    return "\n\n".join(lines)


def step_rows(views) -> list[list]:
    a, b = (view.record.levels for view in views)
    shown = lambda x: "" if x is None else float(f"{x:.4g}")
    return [[la.name, shown(la.injected_norm), shown(lb.injected_norm), shown(la.ratio), shown(lb.ratio),
             shown(la.dominant_share), shown(lb.dominant_share)] for la, lb in zip(a, b)]


def make_handlers(runs_dir, gpu_task, run_boxes: RunBoxes, step_boxes: StepBoxes):
    dirs = runs_dirs(runs_dir)

    @gpu_task
    @shows_errors
    def open_run_view(choice, measure=False, progress=gr.Progress()):
        """The run's curves (its checkpoints measured when it logged none, or when asked)."""
        started = time.monotonic()

        def tick(done, total, elapsed):
            left = time_left(done, total, time.monotonic() - started)
            progress((done, total), desc=f"checkpoints measured{', ' + left if left else ''}", unit="checkpoints")

        curves = open_run(choice, dirs, measure=bool(measure), progress=tick)
        kept = sorted(curves.checkpoints)
        first, last = (kept[0], kept[-1]) if kept else (None, None)
        return {run_boxes.status: status_text(curves), run_boxes.table: summary_rows(curves),
                run_boxes.curves: curves_figure(curves.to_dict()), run_boxes.opened: curves.name,
                run_boxes.step_a: gr.update(choices=kept, value=first),
                run_boxes.step_b: gr.update(choices=kept, value=last), run_boxes.data: curves.to_dict()}

    @gpu_task
    @shows_errors
    def open_steps_view(opened, step_a, step_b, image_path, prompt):
        """Two steps' checkpoints on one picture: their levels and their greedy answers."""
        if not opened:
            raise G4VError("open a run first")
        steps = (optional_whole(step_a, "step A"), optional_whole(step_b, "step B"))
        if None in steps:
            raise G4VError("choose two steps that have checkpoints")
        name, folder = resolve_run(opened, dirs)
        if steps[0] == steps[1]:  # a run that kept one checkpoint offers the same step in both boxes
            kept = sorted(read_run(folder, name).checkpoints)
            raise G4VError(f"this run kept one checkpoint (step {kept[0]}): the side-by-side view needs two"
                           if len(kept) == 1 else
                           f"step A and step B are both step {steps[0]}: choose two different steps")
        if not image_path:
            raise G4VError("the side-by-side view needs a picture: upload one first")
        views = open_steps(read_run(folder, name), steps, image_path, prompt or "")
        return {step_boxes.table: step_rows(views), step_boxes.figure: steps_figure([v.to_dict() for v in views], name),
                step_boxes.answer_a: views[0].answer, step_boxes.answer_b: views[1].answer}

    return open_run_view, open_steps_view


def training_tab(last_chat_image: gr.State, runs_dir=None, gpu_task=lambda fn: fn) -> None:
    """Render the tab."""
    dirs = runs_dirs(runs_dir)
    runs = list_runs(dirs)
    gr.Markdown("A training run's 8 levels over its steps: how large each injection is beside the residual stream, "
                "how its projector learns, and where a level collapsed or exploded. Runs are read from the run "
                f"folders ({', '.join(folder_label(d) for d in dirs)}; `--runs-dir` or `$G4V_RUNS_DIR`): a "
                "Trainer's `trainer_state.json` or TensorBoard events, or the demo trainer's log; a run without "
                "them has its checkpoints measured on the bundled example pictures.")
    with gr.Row():
        run = gr.Dropdown(runs, value=DEMO_RUN if DEMO_RUN in runs else (runs[0] if runs else None), label="Run",
                          allow_custom_value=True, elem_id="training-run", scale=3)
        measure = gr.Checkbox(False, label="Measure its checkpoints even if it logged its levels", scale=2)
        go = gr.Button("Open run", variant="primary", elem_id="training-open", scale=1)
    status = gr.Markdown(elem_id="training-status")
    table = gr.Dataframe(headers=COLUMNS, label="Levels (first and last record)", interactive=False,
                         elem_id="training-table")
    curves = gr.Image(label="The levels over the steps", show_label=False, format="png", elem_id="training-curves")
    data = gr.JSON(label="Records", visible=False)
    gr.Markdown("### Two steps side by side\nEach step's checkpoint on one picture (loaded in turn, never beside "
                "another): what its 8 levels carry and what it answers.")
    probe_picture, probe_prompt = default_probe()[0]
    with picture_row("training", last_chat_image, label="Picture", value=probe_picture, height=200, pdf=False) as row:
        prompt = gr.Textbox(probe_prompt, label="Prompt", elem_id="training-prompt")
        with gr.Row():
            step_a = gr.Dropdown([], label="Step A", elem_id="training-step-a")
            step_b = gr.Dropdown([], label="Step B", elem_id="training-step-b")
        both = gr.Button("Open both steps", elem_id="training-steps")
    image = row.image
    step_table = gr.Dataframe(headers=STEP_COLUMNS, label="The levels at both steps", interactive=False,
                              elem_id="training-step-table")
    step_figure = gr.Image(label="Both steps", show_label=False, format="png", elem_id="training-step-figure")
    with gr.Row():
        answer_a = gr.Textbox(label=f"Step A's answer (greedy, {ANSWER_TOKENS} tokens at most)", interactive=False,
                              elem_id="training-answer-a")
        answer_b = gr.Textbox(label="Step B's answer", interactive=False, elem_id="training-answer-b")

    opened = gr.State(None)
    run_boxes = RunBoxes(status, table, curves, step_a, step_b, opened, data)
    step_boxes = StepBoxes(step_table, step_figure, answer_a, answer_b)
    open_run_view, open_steps_view = make_handlers(runs_dir, gpu_task, run_boxes, step_boxes)
    queue = {"concurrency_id": TRAINING_QUEUE, "concurrency_limit": 1}
    opening = go.click(open_run_view, [run, measure], run_boxes.components(), api_name="training", **queue)
    without_error_badges(opening, run_boxes.components())
    stepping = both.click(open_steps_view, [opened, step_a, step_b, image, prompt], step_boxes.components(),
                          api_name="training_steps", **queue)
    without_error_badges(stepping, step_boxes.components())
