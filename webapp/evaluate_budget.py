"""The Evaluate tab's token-budget sweep: arm A against itself keeping K % of the image tokens, per
policy, over the dataset chosen above (:func:`g4v.evaluate.budget.run_budget_sweep`), then the
accuracy and KL curves against the kept fraction (:func:`viz.token_budget.budget_figure`).

The sweep takes the tab's own inputs (arm A, dataset, columns, rows, seed, tokens), checked as a
Run checks them, and runs in the tab's worker (:func:`webapp.evaluate_runs.in_worker`) with its
progress and Stop. Its folder is kept per settings like a run's, so
the same sweep again resumes. The same function answers the ``/evaluate_budget`` API endpoint.
"""

from dataclasses import dataclass, replace

import gradio as gr

from g4v.errors import G4VError
from g4v.evaluate.budget import accuracy_text, parse_keeps, parse_policies, run_budget_sweep
from g4v.model.token_budget import DEFAULT_KEEPS, POLICIES
from viz.token_budget import budget_figure
from webapp.common import EVALUATE_QUEUE, OutputBoxes, escape_markdown, shows_errors
from webapp.evaluate_runs import eval_config, in_worker
from webapp.runs import STATUS_HEIGHT, without_error_badges
from webapp.sessions import session_key

#: Policies ticked at first: the cheapest ranking and its control.
DEFAULT_POLICIES = ("norm", "random")


def curve_markdown(curve: dict) -> str:
    """The curve as a table: one row per (policy, kept %)."""
    lines = [f"**Token budget of {escape_markdown(curve['arm'])}** (random is the control)", "",
             "| policy | kept | rows | accuracy [95%] | same answer | KL mean [95%] |", "|---|---|---|---|---|---|"]
    for point in curve["points"]:
        agree = "-" if point["agreement"] is None else f"{100 * point['agreement']:.0f}%"
        kl = "-" if point["kl_mean"] is None else f"{point['kl_mean']:.3f} [{point['kl_ci95'][0]:.3f}-{point['kl_ci95'][1]:.3f}]"
        accuracy = accuracy_text(point["accuracy"], point["ci95"])
        lines.append(f"| {point['policy']} | {point['keep']}% | {point['n']} | {accuracy} | {agree} | {kl} |")
    return "\n".join(lines)


@dataclass
class BudgetBoxes(OutputBoxes):
    """The sweep's results, in the order of the ``/evaluate_budget`` endpoint's outputs (API clients
    read its results by position)."""

    status: gr.Markdown
    plot: gr.Image
    curve: gr.JSON


def budget_section(workspace, choices, reuse: dict, adapters_dir, inputs: list, concurrency: int = 1,
                   gpu_task=lambda fn: fn) -> None:
    """Render the sweep's controls and results; ``inputs`` are the tab's arm A, dataset, upload,
    the five column boxes, rows, seed and max new tokens, checked as a Run checks them
    (:func:`~webapp.evaluate_runs.eval_config`)."""
    with gr.Accordion("Token budget: arm A with fewer image tokens (accuracy and KL against the kept fraction)",
                      open=False, elem_id="eval-budget"):
        gr.Markdown("Each run drops image tokens from the sequence (all 8 levels of a dropped token go with it), "
                    "chosen by a policy: injected-feature norm, attention from the last prompt token at layer 2 "
                    "(FastV-like), attribution (gradient x input), or random, the control. keep=100 is the plain "
                    "model. One run per policy and kept percentage, on the rows chosen above.")
        with gr.Row():
            keeps = gr.Textbox(value=",".join(map(str, DEFAULT_KEEPS)), label="Image tokens kept (%)", max_lines=1,
                               elem_id="eval-budget-keeps")
            policies = gr.CheckboxGroup(list(POLICIES), value=list(DEFAULT_POLICIES), label="Policies",
                                        elem_id="eval-budget-policies")
        run = gr.Button("Run token-budget sweep", elem_id="eval-budget-run")
        boxes = BudgetBoxes(status=gr.Markdown(min_height=STATUS_HEIGHT, elem_id="eval-budget-status"),
                            plot=gr.Image(show_label=False, format="png", elem_id="eval-budget-plot"),
                            curve=gr.JSON(label="Curve (JSON)", visible=False))

    @gpu_task
    @shows_errors
    def sweep(arm_a, dataset, files, image_col, prompt_col, reference_col, category_col, id_col, limit, seed,
              max_new_tokens, kept, chosen, request: gr.Request, progress=gr.Progress()):
        """Run (or resume) the sweep; returns the table, the curve picture and the curve's data, by box."""
        wanted_keeps = parse_keeps(kept)
        if not chosen:
            raise G4VError("choose at least one token policy")
        wanted_policies = parse_policies(list(chosen))
        with workspace.sessions.using(session_key(request)) as visitor:
            config = eval_config(workspace, choices, visitor, arm_a, arm_a, dataset, files,
                               (image_col, prompt_col, reference_col, category_col, id_col), limit, seed,
                               max_new_tokens, False, False)
            if config.a.backend != "hf" or config.a.keep is not None:
                raise G4VError(f"a token budget runs on the app's transformers arms; arm A is {config.a.display}")
            # the folder is kept per sweep: its settings and its lists of kept percentages and policies
            marker = replace(config, b=replace(config.a, label=f"sweep {wanted_keeps} {wanted_policies}"))
            out_dir = workspace.run_dir(marker, visitor)
            try:
                with visitor.stores["uploads"].lease(config.data), visitor.stores["runs"].lease(out_dir):
                    result = in_worker(workspace, request, progress, "rows", lambda report, cancel: run_budget_sweep(
                        config, out_dir, wanted_keeps, wanted_policies, adapters_dir=adapters_dir, reuse=reuse,
                        data_dirs=workspace.allowed_dirs(visitor), progress=report, cancel=cancel))
            finally:
                workspace.release(out_dir, visitor)
        data = result.to_dict()
        return {boxes.status: curve_markdown(data), boxes.plot: budget_figure(data), boxes.curve: data}

    event = run.click(sweep, [*inputs, keeps, policies], boxes.components(), api_name="evaluate_budget",
                      concurrency_id=EVALUATE_QUEUE, concurrency_limit=concurrency, show_progress_on=boxes.status)
    without_error_badges(event, boxes.components())
