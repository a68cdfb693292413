"""The Evaluate tab: two arms over a whole dataset, the statistics that settle the question, and a
way from any sample back to the Chat, Deepstack and LoRA tabs.

What a visitor may pick is what the server offers, never a typed path or URL (a Space visitor must
not make the server read its files or fetch an address): the app's own engine (reused, no second
model load), the same with each adapter of the adapter folders, vLLM in a local server when the
vLLM environment is there, and the servers the operator named with ``--eval-server``. Datasets:
the bundled one, those found in the ``--data-dir`` folders, or an upload (unpacked by
:mod:`g4v.evaluate.uploads` into a bounded folder of the app's own).

The run is ``g4v.evaluate.run_eval`` in a worker thread, one at a time on the model's queue, with
live progress; Stop lets the sample in flight finish and shows what is done. The run's folder is
kept per settings, so pressing Run again with the same settings resumes (or re-reads a finished
run) instead of starting over. The same function answers the ``/evaluate`` API endpoint.
"""

import json
import re
import threading
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import gradio as gr

from g4v.errors import G4VError, quoted
from g4v.evaluate import BUNDLED_DATASET, Columns, EvalConfig, RunResult, open_dataset, run_eval
from g4v.evaluate.data import REQUIRED_ROLES
from g4v.evaluate.store import CSV_FILE, PARQUET_FILE, ROWS_FILE, RUN_FILE, SUMMARY_FILE, read_settings, shareable
from g4v.evaluate.uploads import UPLOAD_SUFFIXES, extract_upload
from viz.evaluate import all_failed, run_figures
from webapp.chat_history import file_path
from webapp.common import EVALUATE_QUEUE, QUIET_INPUT, OutputBoxes, escape_markdown, shows_errors
from webapp.evaluate_budget import budget_section
from webapp.evaluate_choices import (BUNDLED, SAME_AS_A, SAME_AS_A_LABEL, UPLOAD, ArmChoice, arm_choices,
                                     dataset_choices, dataset_label)
from webapp.evaluate_equivalence import equivalence_boxes, plan_view, result_values, result_views, wire_plan
from webapp.evaluate_open import OpenTargets, wire_open_buttons
from webapp.evaluate_runs import COLUMN_ROLES, eval_config, in_worker
from webapp.evaluate_tables import (AGGREGATE_HEADERS, ALL_ROWS, DATASET_ORDER, ROWS_NAME, SAMPLE_HEADERS, SEED_NAME,
                                    aggregate_rows, column_widths, run_status, sample_rows)
from webapp.runs import run_keeping_previous, status_line
from webapp.sessions import Session, SessionStores, session_key

#: Uploaded datasets kept on disk per visitor (the oldest goes when another arrives) ...
KEEP_UPLOADS = 4
#: ... run folders (each resumable while kept) ...
KEEP_RUNS = 8
#: ... and the tab's stores with these bounds (export zips and opened samples' pictures: ``files``).
STORES = {"uploads": KEEP_UPLOADS, "runs": KEEP_RUNS, "files": 4 * KEEP_RUNS}
#: Files of a run folder that its export zip holds, the zip's name, and the export box's label,
#: which says the download is that one zip.
EXPORTED = (PARQUET_FILE, CSV_FILE, SUMMARY_FILE, RUN_FILE, ROWS_FILE)
EXPORT_ZIP = "evaluation.zip"
EXPORT_LABEL = f"Export: {EXPORT_ZIP}, one zip of {', '.join(EXPORTED)}"
#: Rows a run in the tab covers unless told otherwise (a first look, not the whole dataset).
DEFAULT_LIMIT = 24
#: Pixels of the upload box's file list: four files (a table, its pictures; Gradio draws a row
#: about 60 px tall) show without scrolling.
UPLOAD_BOX_HEIGHT = 270
#: Under the samples table before a row is picked (and after a new run replaced the rows).
NO_ROW = "No row selected."
#: Under the dataset choice while "upload" is chosen and the box is empty (or a refused upload left it).
UPLOAD_HINT = "Upload a .zip of a dataset folder, or a table file with its pictures."


# ── the tab's state on the server ──────────────────────────────────────────────────────────────


class EvalWorkspace:
    """Where the tab's files live (each visitor's own stores, see :mod:`webapp.sessions`) and what
    it remembers between events, per visitor: extracted uploads by the uploaded files, run folders
    by settings (so a run is resumed, not repeated); and each session's stop switch."""

    def __init__(self, sessions: SessionStores, data_dirs=()):
        self.sessions = sessions
        self.data_dirs = [Path(d).expanduser() for d in data_dirs or ()]
        self._stops: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def allowed_dirs(self, visitor: Session | None) -> list[Path]:
        """The folders a dataset may come from (``open_dataset``'s ``data_dirs``): never another
        visitor's uploads."""
        own = [visitor.stores["uploads"].root] if visitor is not None else []
        return [BUNDLED_DATASET.parent, *own, *self.data_dirs]

    def source(self, key, files, visitor: Session | None) -> Path:
        """The dataset behind a dropdown key (and the upload box, for ``upload``)."""
        if key == UPLOAD and visitor is not None:
            return self.extract(files, visitor)
        found = dataset_choices(self.data_dirs).get(key)
        if found is None:
            raise G4VError(f"unknown dataset {quoted(key)}: choose one from the list, or upload one")
        return found

    def extract(self, files, visitor: Session) -> Path:
        paths = [p for p in (file_path(f) for f in files or []) if p]
        if not paths:
            raise G4VError("no dataset uploaded: send a .zip of the dataset folder, or a table file with its pictures")
        key, extracted = tuple(sorted(paths)), visitor.notes.setdefault("extracted", {})
        with self._lock:
            known = extracted.get(key)
            if known is not None and known.exists():
                return known
            folder = visitor.stores["uploads"].new_folder()
        source = extract_upload(paths, folder)
        with self._lock:
            for stale in [k for k, v in extracted.items() if not v.exists()]:
                del extracted[stale]
            extracted[key] = source
        return source

    def run_dir(self, config: EvalConfig, visitor: Session) -> Path:
        """The folder of the run with these settings (the same one again resumes it, or sums it up
        again with another margin); a run with the same settings still going elsewhere is refused."""
        key = repr({k: v for k, v in asdict(config).items() if k not in ("margin", "discordance")})
        run_dirs, busy = visitor.notes.setdefault("run_dirs", {}), visitor.notes.setdefault("busy", set())
        with self._lock:
            folder = run_dirs.get(key)
            if folder is None or not folder.exists():
                folder = run_dirs[key] = visitor.stores["runs"].new_folder()
            if folder in busy:
                raise G4VError("a run with these settings is already going (in another window); wait for it")
            busy.add(folder)
        return folder

    def release(self, folder: Path, visitor: Session) -> None:
        with self._lock:
            visitor.notes["busy"].discard(folder)

    def stop_switch(self, session: str) -> threading.Event:
        with self._lock:
            self._stops[session] = threading.Event()
            return self._stops[session]

    def stop(self, session: str) -> bool:
        with self._lock:
            switch = self._stops.get(session)
        if switch is not None:
            switch.set()
        return switch is not None

    def forget(self, session: str, switch: threading.Event) -> None:
        with self._lock:
            if self._stops.get(session) is switch:
                del self._stops[session]

    def export(self, out_dir: Path, visitor: Session, dataset: str) -> Path:
        """A zip of the run's result files, in a folder of its own; its ``run.json`` names the
        dataset and the models without server paths (:func:`~g4v.evaluate.store.shareable`)."""
        target = visitor.stores["files"].new_folder() / EXPORT_ZIP
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zipped:
            for name in EXPORTED:
                if name == RUN_FILE:
                    zipped.writestr(name, json.dumps(shareable(read_settings(out_dir), dataset), indent=1) + "\n")
                elif (out_dir / name).is_file():
                    zipped.write(out_dir / name, name)
        return target

    def sample_pictures(self, run: dict, index, visitor: Session) -> tuple[list[str], str]:
        """One run sample's pictures saved as PNGs where the app serves them, and its prompt."""
        if not run or index is None:
            raise G4VError("select a row of the sample table first")
        if isinstance(index, bool) or not re.fullmatch(r"[0-9]{1,9}", str(index).strip()):
            raise G4VError(f"row {quoted(index)} is not a row number of the sample table: select a row")
        index = int(str(index).strip())
        if not Path(run["source"]).exists():
            raise G4VError("this run's uploaded dataset is no longer kept: upload it and run again")
        dataset = open_dataset(run["source"], Columns(**run["columns"]), self.allowed_dirs(visitor))
        if index >= len(dataset):
            raise G4VError(f"row {index} is not in the dataset")
        sample = dataset.sample(index)
        if sample.error:
            raise G4VError(f"row {index} cannot be opened: {sample.error}")
        folder = visitor.stores["files"].new_folder()
        paths = []
        for number, picture in enumerate(sample.images):
            paths.append(str(folder / f"sample-{index}-{number}.png"))
            picture.save(paths[-1])
        return paths, sample.prompt


# ── the tab ────────────────────────────────────────────────────────────────────────────────────


@dataclass
class ResultBoxes(OutputBoxes):
    """What a run fills, in the order of the ``/evaluate`` endpoint's outputs (API clients read its
    results by position): built once by the tab, given to ``run.click`` as :meth:`components` and
    filled by name by :func:`show_result`."""

    status: gr.Markdown
    aggregate: gr.Dataframe
    equivalence: gr.Markdown
    field_table: gr.Dataframe
    drift_table: gr.Dataframe
    accuracy_plot: gr.Image
    paired_plot: gr.Image
    kl_plot: gr.Image
    divergence_plot: gr.Image
    samples: gr.Dataframe
    export: gr.File
    summary: gr.JSON
    run_state: gr.State


def make_run(engine, workspace: EvalWorkspace, choices: list[ArmChoice], adapters_dir, gpu_task, boxes: ResultBoxes):
    reuse = {choices[0].spec.engine_key(): engine}

    def config_from(visitor, *inputs):
        return eval_config(workspace, choices, visitor, *inputs)

    @gpu_task
    @shows_errors
    def evaluate(arm_a, arm_b, dataset, files, image_col, prompt_col, reference_col, category_col, id_col,
                 limit, seed, max_new_tokens, blank_probe, levels, margin=EvalConfig.margin,
                 discordance=EvalConfig.discordance, request: gr.Request = None, progress=gr.Progress()):
        """Run (or resume) the comparison; yields the status while it works, then every result. The
        visitor's dataset and run folder are leased meanwhile: no other upload prunes them."""
        with workspace.sessions.using(session_key(request)) as visitor:
            config = config_from(visitor, arm_a, arm_b, dataset, files,
                                 (image_col, prompt_col, reference_col, category_col, id_col),
                                 limit, seed, max_new_tokens, blank_probe, levels, margin, discordance)
            out_dir = workspace.run_dir(config, visitor)
            try:
                with visitor.stores["uploads"].lease(config.data), visitor.stores["runs"].lease(out_dir):
                    yield from run_in_thread(config, out_dir, visitor, shared_name(dataset, files), request, progress)
            finally:
                workspace.release(out_dir, visitor)

    def run_in_thread(config, out_dir, visitor, dataset_name, request, progress):
        result = in_worker(workspace, request, progress, "samples", lambda report, cancel: run_eval(
            config, out_dir, adapters_dir=adapters_dir, reuse=reuse, data_dirs=workspace.allowed_dirs(visitor),
            progress=report, cancel=cancel))
        yield show_result(boxes, result, config, workspace.export(out_dir, visitor, dataset_name))

    return evaluate


def shared_name(key, files) -> str:
    """How an export names the dataset: the dropdown's label, or the uploaded files' names."""
    if key != UPLOAD:
        return dataset_label(key)
    return "upload: " + ", ".join(Path(p).name for p in (file_path(f) for f in files or []) if p)


def show_result(boxes: ResultBoxes, result: RunResult, config: EvalConfig, export: Path) -> dict:
    """Every output of the tab for a finished or stopped run, by box."""
    pictures = run_figures(result.summary, result.rows)
    equivalence, field_table, drift_table = result_values(result.summary)
    run = {"source": config.data, "columns": asdict(config.columns),
           "adapters": [config.a.adapter, config.b.adapter], "out_dir": str(result.out_dir)}
    status = run_status(result.summary, config.a.display, config.b.display)
    failed = all_failed(result.rows)  # said above the results too, not only in the pictures
    return {boxes.status: f"{status}\n\n**{failed}**" if failed else status,
            boxes.aggregate: aggregate_rows(result.summary), boxes.equivalence: equivalence,
            boxes.field_table: field_table, boxes.drift_table: drift_table,
            boxes.accuracy_plot: pictures["accuracy"], boxes.paired_plot: pictures["paired"],
            boxes.kl_plot: pictures["kl"], boxes.divergence_plot: pictures["divergence"],
            boxes.samples: sample_rows(result.rows), boxes.export: str(export), boxes.summary: result.summary.to_dict(),
            boxes.run_state: run}


def evaluate_tab(engine, model: str, adapters_dir, workspace: EvalWorkspace, targets: OpenTargets | None = None,
                 servers=(), concurrency: int = 1, gpu_task=lambda fn: fn) -> None:
    """Render the Evaluate tab into the current ``gr.Blocks``."""
    choices = arm_choices(engine, model, adapters_dir, servers)
    gr.Markdown("Two arms over a whole dataset: accuracy with 95% intervals, paired wins and losses (exact McNemar test), "
                "agreement, KL for two transformers arms, all per category; equivalence within a margin (TOST) and "
                "per-field scores of key-value and table answers. Select a sample row to open it in another tab.")
    with gr.Row():
        arm_a = gr.Dropdown([(c.label, c.key) for c in choices], value=choices[0].key, label="Arm A", elem_id="eval-arm-a")
        arm_b = gr.Dropdown([(c.label, c.key) for c in choices] + [(SAME_AS_A_LABEL, SAME_AS_A)],
                            value=choices[min(1, len(choices) - 1)].key, label="Arm B", elem_id="eval-arm-b")
        datasets = [*dataset_choices(workspace.data_dirs), UPLOAD]
        dataset = gr.Dropdown([(dataset_label(key), key) for key in datasets], value=BUNDLED, label="Dataset",
                              elem_id="eval-dataset")
    files = gr.File(label="Upload a dataset (.zip of a folder with metadata.jsonl, or a table with its pictures)",
                    file_count="multiple", file_types=list(UPLOAD_SUFFIXES), elem_id="eval-upload", height=UPLOAD_BOX_HEIGHT)
    with gr.Accordion("Column mapping (filled with the guessed columns; empty: guessed)", open=False), gr.Row():
        guessed = guessed_columns(BUNDLED, None, workspace)
        columns = [gr.Textbox(value=guessed.get(role) or "", label=f"{role} column", max_lines=1,
                              elem_id=f"eval-column-{role}") for role in COLUMN_ROLES]
    with gr.Row():
        # No precision or bounds on the boxes: Gradio would round 2.5 silently; whole_or_none refuses it.
        limit = gr.Number(value=DEFAULT_LIMIT, label=f"{ROWS_NAME} (0: {ALL_ROWS})", elem_id="eval-limit")
        seed = gr.Number(value=-1, label=f"{SEED_NAME} (-1: {DATASET_ORDER})")
        max_new_tokens = gr.Slider(1, 256, value=EvalConfig.max_new_tokens, step=1, label="Max new tokens")
        blank_probe = gr.Checkbox(label="Blank-image probe (is the picture ignored?)")
        levels = gr.Checkbox(label="Per-level injected norms (transformers arms)")
    margin, discordance = equivalence_boxes()
    described = gr.Markdown(elem_id="eval-dataset-info")
    row_count, planned = plan_view(guessed.get("rows"), DEFAULT_LIMIT)
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id="eval-run")
        stop = gr.Button("Stop", elem_id="eval-stop")
    status = status_line(elem_id="eval-status")  # the run's bar is drawn over it
    aggregate = gr.Dataframe(headers=AGGREGATE_HEADERS, label="Aggregates (all, then per category)",
                             interactive=False, elem_id="eval-aggregate", wrap=True,
                             column_widths=column_widths(AGGREGATE_HEADERS))
    equivalence, field_table, drift_table = result_views()
    with gr.Row():  # the figures carry their own titles
        accuracy_plot = gr.Image(show_label=False, format="png", elem_id="eval-accuracy-plot")
        paired_plot = gr.Image(show_label=False, format="png")
    with gr.Row():
        kl_plot = gr.Image(show_label=False, format="png")
        divergence_plot = gr.Image(show_label=False, format="png")
    samples = gr.Dataframe(headers=SAMPLE_HEADERS, label="Samples, worst first (select a row)", interactive=False,
                           elem_id="eval-samples", wrap=True, max_height=420, column_widths=column_widths(SAMPLE_HEADERS))
    picked = gr.Markdown(NO_ROW, elem_id="eval-picked")
    with gr.Row():
        to_chat = gr.Button("Open in Chat", elem_id="eval-open-chat")
        to_deepstack = gr.Button("Open in Deepstack", elem_id="eval-open-deepstack")
        to_lora = gr.Button("Open in LoRA", elem_id="eval-open-lora")
    export = gr.File(interactive=False, label=EXPORT_LABEL, elem_id="eval-export")
    with gr.Accordion("Summary (JSON)", open=False):
        summary = gr.JSON()
    run_state, row_state = gr.State(None), gr.State(None)

    budget_section(workspace, choices, {choices[0].spec.engine_key(): engine}, adapters_dir,
                   [arm_a, dataset, files, *columns, limit, seed, max_new_tokens], concurrency, gpu_task)
    wire_dataset_info(workspace, dataset, files, columns, described, row_count)
    wire_plan(row_count, limit, discordance, margin, planned)
    boxes = ResultBoxes(status=status, aggregate=aggregate, equivalence=equivalence, field_table=field_table,
                        drift_table=drift_table, accuracy_plot=accuracy_plot, paired_plot=paired_plot, kl_plot=kl_plot,
                        divergence_plot=divergence_plot, samples=samples, export=export, summary=summary,
                        run_state=run_state)
    evaluate = make_run(engine, workspace, choices, adapters_dir, gpu_task, boxes)
    ran = run_keeping_previous(run, evaluate, [arm_a, arm_b, dataset, files, *columns, limit, seed, max_new_tokens,
                                               blank_probe, levels, margin, discordance],
                               boxes.components(), status, api_name="evaluate", concurrency_id=EVALUATE_QUEUE,
                               concurrency_limit=concurrency, show_progress_on=status)  # one progress bar, not one a box
    # the new run's rows replace the old ones: a row picked among those is no row of this run
    ran.success(lambda: {row_state: None, picked: NO_ROW}, None, [row_state, picked], api_visibility="private",
                queue=False, **QUIET_INPUT)

    def stop_run(request: gr.Request):
        if not workspace.stop(session_key(request) or "api"):
            gr.Info("no run is going in this window")

    stop.click(stop_run, None, None, queue=False, api_visibility="private")

    def select(evt: gr.SelectData):
        index = (evt.row_value or [None])[0]
        return {row_state: index, picked: f"Row {index} selected." if index is not None else NO_ROW}

    samples.select(select, None, [row_state, picked], api_visibility="private", queue=False)
    if targets is not None:
        wire_open_buttons(workspace, targets, run_state, row_state, (to_chat, to_deepstack, to_lora))


#: The column boxes' fill, run in the page (Gradio's ``js``) when the guess lands: each box still
#: showing what it did when the dataset was chosen gets the guess for its role; any other is left
#: as it is (``undefined``: Gradio writes nothing there). In the page because a step on the server
#: compares the boxes as they were when its request left, and would write over what the visitor
#: typed while its answer was on its way.
FILL_UNCHANGED_BOXES = f"""(found, before, ...now) => {json.dumps(list(COLUMN_ROLES))}.map((role, i) =>
    found && before && role in found && (before[i] ?? "") === (now[i] ?? "") ? found[role] : undefined)"""


def wire_dataset_info(workspace: EvalWorkspace, dataset, files, columns, described, row_count) -> None:
    """Choosing (or uploading) a dataset fills the column boxes with the guessed mapping, and ``row_count``.

    The guess takes a moment (an upload is unpacked and read), and a visitor may type a column name
    meanwhile. So the choice's quick first step notes what the boxes show, the guess lands in a
    hidden box, and the page fills only the boxes that still show what they did: what was typed is
    kept. (Hidden boxes, not ``gr.State``: a state stays on the server, out of the page's reach.)"""
    shown = gr.JSON(visible=False)  # what the column boxes showed when the dataset was chosen
    guess = gr.JSON(visible=False)  # the last guess, by role

    @shows_errors
    def describe(key, uploaded, request: gr.Request):
        """The guessed columns (by role), the line under the dataset and its row count, by box."""
        if key == UPLOAD and not uploaded:
            return {guess: {}, described: UPLOAD_HINT}
        with workspace.sessions.using(session_key(request)) as visitor:
            mapping = guessed_columns(key, uploaded, workspace, visitor, strict=True)
        return {guess: {role: mapping[role] or "" for role in COLUMN_ROLES},
                described: dataset_line(dataset_label(key), mapping), row_count: mapping["rows"]}

    def guessing(choice):
        """After the ``choice`` event: the guess, then the boxes filled. Returns the guess's event."""
        guessed = choice.then(describe, [dataset, files], [guess, described, row_count], api_visibility="private",
                              **QUIET_INPUT)
        guessed.success(None, [guess, shown, *columns], columns, js=FILL_UNCHANGED_BOXES, api_visibility="private",
                        queue=False, **QUIET_INPUT)
        return guessed

    def uploaded(upload, chosen, *boxes):
        """The dropdown on the upload, what it showed before (a refused upload goes back to it), and
        what the column boxes show (gr.update: a new Dropdown without choices would warn in the log)."""
        return {dataset: gr.update(value=UPLOAD), before_upload: chosen, shown: list(boxes)} if upload else gr.skip()

    # .select (a visitor's pick), not .change: the upload's own step below sets the dropdown too,
    # and .change would describe the upload (and show its refusal) a second time; nor .input, which
    # Gradio 6's Dropdown fires twice per pick.
    # A refused upload leaves the box (uploading a table and its pictures next must not add them to
    # it); the refusal's toast is message enough, no badge over the boxes (QUIET_INPUT).
    guessing(dataset.select(lambda *boxes: list(boxes), columns, shown, api_visibility="private", queue=False,
                            **QUIET_INPUT))
    before_upload = gr.State(BUNDLED)
    refused = guessing(files.upload(uploaded, [files, dataset, *columns], [dataset, before_upload, shown],
                                    api_visibility="private", queue=False)).failure(
        lambda chosen: {files: None, dataset: chosen}, before_upload, [files, dataset], api_visibility="private", queue=False,
        **QUIET_INPUT)
    guessing(refused)


def dataset_line(label: str, mapping: dict) -> str:
    """The line under the dataset: its row count, and for each required column not guessed, where
    to name it (the visitor names it before Run)."""
    rows = mapping["rows"]
    line = f"{rows:,} {'row' if rows == 1 else 'rows'} in {escape_markdown(label)}."
    for role in (role for role in REQUIRED_ROLES if not mapping[role]):
        line += (f" No {role} column guessed (columns: {escape_markdown(', '.join(mapping['names'][:20]))}): "
                 f"type its name in the box '{role} column' (Column mapping).")
    return line


def guessed_columns(key, uploaded, workspace: EvalWorkspace, visitor: Session | None = None,
                    strict: bool = False) -> dict:
    """The column mapping ``open_dataset`` guesses for a dataset (a role it finds no column for is
    None: the visitor names it), its row count (``rows``) and its columns (``names``); when building
    the page (not ``strict``) a dataset that cannot be read gives an empty mapping."""
    try:
        loaded = open_dataset(str(workspace.source(key, uploaded, visitor)), None, workspace.allowed_dirs(visitor),
                              required=())
    except G4VError:
        if strict:
            raise
        return {}
    return {**asdict(loaded.columns), "rows": len(loaded), "names": loaded.column_names}
