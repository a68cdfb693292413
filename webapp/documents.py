"""Documents in the app: a PDF page picker for every tab's image input, the task presets of the Chat
tab, and the structured panel under its answer.

The picker renders pages with :mod:`g4v.documents.pdf` into PNG files of a bounded temporary folder
and hands their paths on: to a tab's image input (one page), or into the Chat box's attachments
(several pages, up to one message's image limit). Every tab thus sees a rendered page exactly as it
sees an uploaded picture, through ``open_image``.
"""

import functools
import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from g4v.conversation import MAX_IMAGES_PER_MESSAGE
from g4v.documents.pdf import (DEFAULT_DPI, MAX_DPI, MIN_DPI, check_dpi, looks_like_pdf, numbered_pages,
                               render_thumbnails)
from g4v.documents.presets import PRESETS, build_prompt, get_preset, parse_schema
from g4v.documents.structured import read_answer
from g4v.errors import G4VError
from g4v.images import open_image
from webapp.common import QUIET_INPUT, OutputBoxes, escape_markdown, markdown_code, shows_errors, toast_text
from webapp.tempdirs import own_folder

#: Rendered pages live in the app's own folder (webapp.tempdirs) until Gradio has copied them into
#: its cache; past this many the oldest go first.
KEEP_PAGES = 200
#: The picker's thumbnail strip in pixels: a row of cells at a desktop width and the top of the next.
THUMBNAILS_HEIGHT = 320
#: Thumbnails a row: under the Chat box (the page's width), and beside a tab's picture (half of it).
CHAT_COLUMNS, TAB_COLUMNS = 6, 3
NO_TASK = "(free question)"
PENDING_NOTE = "*Waiting for the new answer: it is read here once complete.*"
#: The panel without a task preset: what would show here.
IDLE_NOTE = "*Pick a task preset above: each answer to it is read here (a table, HTML, or JSON checked against the schema).*"
EXAMPLE_SCHEMA = '{\n  "type": "object",\n  "properties": {"total": {"type": "number"}},\n  "required": ["total"]\n}'


def save_pages(images: list, stem: str, first_pages: list[int], dpi: float) -> list[str]:
    """Write rendered pages as PNG files (lossless: the model must see what PDFium drew)."""
    folder = own_folder("pages")
    paths = []
    for image, number in zip(images, first_pages):
        path = folder / f"{stem[:40]}-page{number}-{dpi:g}dpi-{uuid.uuid4().hex[:8]}.png"
        image.save(path)
        paths.append(str(path))
    _prune(folder)
    return paths


def _prune(folder: Path) -> None:
    files = sorted(folder.glob("*.png"), key=lambda p: p.stat().st_mtime)
    for old in files[:-KEEP_PAGES]:
        old.unlink(missing_ok=True)


def _checked_dpi(value) -> float:
    """The resolution slider's value as the picker takes it. Gradio's own check of a slider value
    fails on a text or a null (a multi-line "could not preprocess" and a bare "Error" in the page),
    so the value goes through :func:`check_dpi` instead, in one line."""
    try:
        return check_dpi(value)
    except G4VError as err:
        raise gr.Error(str(err), print_exception=False) from None


def _checked_pdf(pdf_path) -> str:
    if not pdf_path:
        raise G4VError("upload a PDF first")
    return str(pdf_path)


@shows_errors
def show_thumbnails(pdf_path) -> tuple[list, str]:
    """The uploaded document's page thumbnails, and page 1 chosen."""
    if not pdf_path:
        return [], "1"
    thumbnails = render_thumbnails(pdf_path, name=Path(pdf_path).name)
    return [(image, f"page {i}") for i, image in enumerate(thumbnails, start=1)], "1"


#: What the Chat box takes, said when it refuses an attachment.
BOX_TAKES = "the box takes pictures and PDFs"


@functools.lru_cache(maxsize=256)
def picture_problem(path: str) -> str | None:
    """Why ``open_image`` refuses this attachment (corrupt, not a picture, too many pixels), or None.
    Cached by path: the box's change event comes with every keystroke, and an uploaded file's path
    (in a folder named by its content's hash) always holds the same bytes."""
    try:
        open_image(path)
    except G4VError as err:
        return str(err)
    return None


def sorted_attachments(current) -> tuple[str, list[str], list[str], dict[str, str]]:
    """The Chat box's value as (text, pictures kept, PDFs, refused attachments with why)."""
    current = current if isinstance(current, dict) else {}
    files = [f.get("path") if isinstance(f, dict) else f for f in current.get("files") or []]
    pdfs = [f for f in files if f and looks_like_pdf(f)]
    refused = {f: problem for f in files if f and f not in pdfs and (problem := picture_problem(f))}
    return current.get("text") or "", [f for f in files if f not in pdfs and f not in refused], pdfs, refused


@dataclass
class BoxSorting(OutputBoxes):
    """What sorting the Chat box's attachments updates (:func:`pdf_to_picker`)."""

    box: gr.MultimodalTextbox
    document: gr.File  # the picker's PDF
    accordion: gr.Accordion  # the picker, opened for a PDF
    refusal: gr.JSON  # what was taken out, for the toast (show_refusal)
    left_out: gr.Markdown  # the line under the box


def pdf_to_picker(boxes: BoxSorting, current, shown=None, line_text=None) -> dict:
    """The Chat box's value with its PDFs taken out, the first of them for the picker, and the picker
    opened; nothing changes while no PDF is attached (every change of the box comes here: Gradio's
    MultimodalTextbox has no upload event, and its input event does not fire for attachments).
    An attachment that is not a readable picture is taken out too: left in, it showed as a broken
    chip until the message was refused at sending. The refusal goes to ``boxes.refusal`` (for the
    toast, :func:`show_refusal`) and to the line under the box (:func:`left_out_line`), which stays
    until the message is sent or a picture is attached after it: a toast is easy to miss, and the
    text would then go without the picture.

    ``shown`` is the refusal shown last and ``line_text`` the line as it reads now: the box's change
    event came twice for one upload, so the same refusal still on show is not said again (one toast,
    not "Warning (2)"); said once more after the line went (sent, or a picture attached since)."""
    text, kept, pdfs, refused = sorted_attachments(current)
    shown = shown if isinstance(shown, dict) else {}
    if not pdfs and not refused:
        attached_since = set(kept) - set(shown.get("kept") or [])
        return {boxes.left_out: left_out_line()} if line_text and attached_since else gr.skip()
    problems = [f"{'; '.join(refused.values())}: removed from the message ({BOX_TAKES})"] if refused else []
    if len(pdfs) > 1:
        problems.append(f"one PDF at a time: {Path(pdfs[0]).name} is open in the picker below")
    said = "; ".join(problems)
    refusal = {"id": hashlib.sha256(json.dumps([said, kept, text]).encode()).hexdigest()[:16], "text": said,
               "kept": kept}
    updates = {boxes.box: {"text": text, "files": kept}}
    if problems and not (refusal["id"] == shown.get("id") and line_text):
        updates |= {boxes.refusal: refusal, boxes.left_out: left_out_line(said)}
    if pdfs:
        updates |= {boxes.document: pdfs[0], boxes.accordion: gr.Accordion(open=True)}
    return updates


def left_out_line(text: str | None = None):
    """The line under the Chat box that says what was taken out of the message (hidden for None).
    Escaped: it quotes file names, which Markdown would otherwise read as markup."""
    if not text:
        return gr.update(value="", visible=False)
    return gr.update(value="⚠️ " + escape_markdown(text), visible=True)


def show_refusal(refusal):
    """A warning toast for what :func:`pdf_to_picker` took out of the box (a warning: the message
    itself still sends). A queued step of its own, run only when there is something to say: Gradio
    shows no toast for an unqueued event (and the box's change events stay unqueued: they come
    with the typing)."""
    if refusal:
        gr.Warning(toast_text(refusal["text"]))


def pick_thumbnail(evt: gr.SelectData):
    """Clicking a thumbnail chooses its page."""
    return str(evt.index + 1)


def page_files(pdf_path, pages: str, dpi, limit: int) -> list[str]:
    """The chosen pages rendered to PNG files (each checked and refused in one line as in the CLI)."""
    path = _checked_pdf(pdf_path)
    numbered = numbered_pages(path, pages, dpi, name=Path(path).name, max_images=limit)
    return save_pages([image for _, image in numbered], Path(path).stem, [n for n, _ in numbered], float(dpi))


def document_picker(target, chat_box: bool = False, elem_id: str = "doc", left_out: gr.Markdown | None = None):
    """Render the picker (an accordion) and wire its button to ``target``; returns that event, so a
    tab can chain its own analysis after it (``.success(...)``).

    ``target`` is an image input (the chosen page replaces its picture) or, with ``chat_box``, the
    Chat tab's MultimodalTextbox (the chosen pages join its attachments, its text is kept; what the
    box refuses is said in a toast and in ``left_out``, the line under the box).
    """
    limit = MAX_IMAGES_PER_MESSAGE if chat_box else 1
    with gr.Accordion("From a PDF", open=False, elem_id=f"{elem_id}-picker") as accordion:
        # Under the Chat box the picker has the page's width; beside a tab's picture, half of it: there
        # the file box takes the whole width (beside the page box its name was cut to "r….pdf").
        with gr.Row() if chat_box else gr.Column():
            document = gr.File(label="PDF", file_types=[".pdf"], type="filepath", height=120,
                               elem_id=f"{elem_id}-pdf")
            with gr.Column():
                pages = gr.Textbox(value="1", label=f"Page{'s, e.g. 1,3-4' if chat_box else ''} (or click a page below)",
                                   elem_id=f"{elem_id}-pages")
                dpi = gr.Slider(MIN_DPI, MAX_DPI, value=DEFAULT_DPI, step=12, label="Render resolution (dpi)")
                dpi.preprocess = _checked_dpi  # what a client sends ("abc", null) is refused in our words
                use = gr.Button("Add to the message" if chat_box else "Use this page", elem_id=f"{elem_id}-use")
        # A fixed number of columns whatever the page count (Gradio otherwise widens the cells to fill
        # the row: a 2-page PDF became two 580-px squares, blown up and cut off), as many as the
        # picker's width holds at Gradio's 100-px least a cell (six cut the sixth off beside a tab's
        # picture), each thumbnail drawn at its own size or shrunk to fit its cell, never enlarged or
        # cropped; further rows scroll. No label over them: it covered the first row's tops.
        thumbnails = gr.Gallery(label="Pages", show_label=False, columns=CHAT_COLUMNS if chat_box else TAB_COLUMNS,
                                fit_columns=False,
                                height=THUMBNAILS_HEIGHT, allow_preview=False, object_fit="scale-down",
                                elem_id=f"{elem_id}-thumbnails")

    def thumbnails_shown(pdf_path):
        pictures, first = show_thumbnails(pdf_path)
        return {thumbnails: pictures, pages: first}

    # A PDF refused here (corrupt, hostile) is its toast. The strip is emptied, as the pages it showed
    # were another PDF's, and the page box starts again at 1; writing both takes their "Error" badges off.
    document.change(thumbnails_shown, document, [thumbnails, pages], api_visibility="private").failure(
        lambda: {thumbnails: [], pages: "1"}, None, [thumbnails, pages], api_visibility="private", queue=False,
        **QUIET_INPUT)
    if chat_box:  # a PDF attached with the box's paperclip opens here, for its pages to be chosen
        # Not a gr.State: a State's change event does not fire for an unqueued event's output.
        refusal = gr.JSON(visible=False)
        sorting = BoxSorting(box=target, document=document, accordion=accordion, refusal=refusal, left_out=left_out)
        target.change(functools.partial(pdf_to_picker, sorting), [target, refusal, left_out], sorting.components(),
                      api_visibility="private", queue=False, show_progress="hidden", trigger_mode="always_last")
        refusal.change(show_refusal, refusal, None, api_visibility="private", show_progress="hidden")
    thumbnails.select(pick_thumbnail, None, pages, api_visibility="private")

    @shows_errors
    def use_pages(pdf_path, chosen, resolution, current):
        files = page_files(pdf_path, chosen, resolution, limit)
        if not chat_box:
            return files[0]
        current = current if isinstance(current, dict) else {}
        attached = [f for f in current.get("files") or []]
        if len(attached) + len(files) > MAX_IMAGES_PER_MESSAGE:
            raise G4VError(f"too many images: {len(attached)} attached and {len(files)} pages, "
                           f"one message takes at most {MAX_IMAGES_PER_MESSAGE}")
        return {"text": current.get("text") or "", "files": attached + files}

    return use.click(use_pages, [document, pages, dpi, target], target, api_visibility="private", **QUIET_INPUT)


# ── Chat: task presets and the structured panel ─────────────────────────────────────────────────


def preset_choices() -> list[tuple[str, str]]:
    return [(NO_TASK, "")] + [(preset.label, key) for key, preset in PRESETS.items()]


@shows_errors
def fill_prompt(task, schema_text, current) -> tuple[dict, dict]:
    """Choosing a task puts its prompt into the Chat box (attachments kept), in place of an empty
    box or another preset's prompt, never of the user's own text; a free question or a document
    question empties a preset's prompt. Key-value extraction shows the schema box and rebuilds the
    prompt when the schema changes."""
    current = current if isinstance(current, dict) else {}
    shown = schema_field(task)
    text = current.get("text") or ""
    if not is_preset_text(text):
        if task:
            gr.Info("The box keeps your text; empty it and choose the task again for the task's own prompt.")
        return gr.update(), shown
    if not task or get_preset(task).needs_question:
        prompt = ""
    else:
        prompt = build_prompt(task, schema_text=schema_text) if shown["visible"] else build_prompt(task)
    return {"text": prompt, "files": current.get("files") or []}, shown


def is_preset_text(text: str) -> bool:
    """Whether the box holds nothing but a preset's prompt (or nothing): a tag, or the key-value
    prompt around any JSON schema. Only such text may a preset replace."""
    text = text.strip()
    if not text or any(text == preset.prompt for preset in PRESETS.values()
                        if not (preset.needs_schema or preset.needs_question)):
        return True
    for preset in PRESETS.values():
        head, _, tail = preset.prompt.partition("{schema}") if preset.needs_schema else ("", "", "")
        if head and text.startswith(head) and text.endswith(tail):
            try:
                json.loads(text[len(head):len(text) - len(tail)])
            except ValueError:
                return False
            return True
    return False


def schema_field(task):
    """The schema field shows only for key-value extraction."""
    return gr.update(visible=bool(task) and get_preset(task).needs_schema)


def chat_examples(rows: list[list], box, task, schema) -> gr.Examples:
    """The Chat tab's examples (rows of :func:`webapp.layout.example_rows`): a click puts the
    message in the box, then sets the task preset and the schema field (the key-value example's
    schema, shown; otherwise the user's schema kept and shown only for key-value extraction).
    The field's visibility is set here, not left to ``task.change``, which does not fire when the
    preset is already the example's."""
    presets = {message["text"]: (preset, schema_text) for message, preset, schema_text in rows}
    # A card shows its prompt and picture; a document prompt (a tag, or the key-value prompt with its
    # schema) reads badly there, so with such examples every card shows a short label instead.
    labels = [f"{get_preset(preset).label}: {Path(message['files'][0]).name}" if preset else message["text"]
              for message, preset, _ in rows] if any(preset for _, preset, _ in rows) else None

    def picked(message):
        preset, schema_text = presets.get((message or {}).get("text"), ("", None))
        shown = schema_field(preset)
        return {task: preset, schema: shown if schema_text is None else gr.update(value=schema_text,
                                                                                  visible=shown["visible"])}

    return gr.Examples([[message] for message, _, _ in rows], inputs=[box], outputs=[task, schema], fn=picked,
                       run_on_click=True, cache_examples=False, label="Examples", elem_id="chat-examples",
                       example_labels=labels)


@shows_errors
def structured_view(task, schema_text, answer) -> tuple[str, dict, str]:
    """The panel for ``answer``, the newest one this session's model wrote (a ``gr.State`` only the
    server writes: a client's chat history never chooses what is checked): rendered HTML, table
    rows, problems (schema or parse) as text. A malformed answer shows as-is with its parse error;
    nothing here raises on model output. None: no answer yet (a new or cleared chat)."""
    if not task or not isinstance(answer, str):
        return "", gr.update(value=None, visible=False), "" if task else IDLE_NOTE
    preset = get_preset(task)
    try:
        schema = parse_schema(schema_text) if preset.needs_schema else None
    except G4VError as err:
        schema, schema_note = None, f"The schema could not be used: {escape_markdown(err)}"
    else:
        schema_note = ""
    result = read_answer(preset.output, answer, schema)
    lines = [schema_note] if schema_note else []
    if result.error:
        lines.append(f"**Could not read the answer as {preset.output.upper()}:** {markdown_code(result.error)}")
    lines += [f"- {markdown_code(problem.path)}: expected {markdown_code(problem.expected)}, got {markdown_code(problem.got)}"
              for problem in result.problems]
    if result.ok and not schema_note:
        lines.append(f"Read as {preset.output.upper()}" + (" and valid against the schema." if schema else "."))
    table = gr.update(value=result.rows[1:], headers=result.rows[0], visible=True) if len(result.rows) > 1 else \
        gr.update(value=None, visible=False)
    shown_once = "" if preset.output == "csv" and len(result.rows) > 1 else result.html  # the grid has the rows
    return shown_once, table, "\n".join(lines)


def pending_view(task) -> tuple[str, dict, str]:
    """The panel while an answer is being written: empty, with a note when a task preset reads it."""
    return "", gr.update(value=None, visible=False), PENDING_NOTE if task else IDLE_NOTE


def chat_documents(box, answer: gr.State, left_out: gr.Markdown):
    """Render the Chat tab's document tools under its box; returns ``follow(event)``, which updates
    the structured panel after each answer, and the task and schema fields (the examples set them).
    ``answer``: the newest answer the server wrote for this session (see :func:`structured_view`);
    ``left_out``: the line under the box that says what was taken out of the message."""
    document_picker(box, chat_box=True, elem_id="chat-doc", left_out=left_out)
    with gr.Row():
        task = gr.Dropdown(preset_choices(), value="", label="Task preset (Granite Vision's documented prompts)",
                           elem_id="chat-task")
        schema = gr.Code(EXAMPLE_SCHEMA, language="json", label="JSON schema (key-value extraction)",
                         visible=False, elem_id="chat-schema")
    with gr.Accordion("Structured answer", open=True, elem_id="chat-structured"):
        notes = gr.Markdown(IDLE_NOTE, elem_id="chat-structured-notes")
        rendered = gr.HTML(elem_id="chat-structured-html")
        table = gr.Dataframe(visible=False, interactive=False, label="Table", elem_id="chat-structured-table")
    # A preset the user picks puts its prompt into the box; one an example sets comes with the
    # example's own prompt and picture, which a rebuild here could race (it reads the box as it was).
    # .select, not .input: Gradio 6's Dropdown fires .input twice per pick (two "keeps your text" toasts).
    def filled(*values):
        message, shown = fill_prompt(*values)
        return {box: message, schema: shown}

    task.select(filled, [task, schema, box], [box, schema], api_visibility="private")
    task.change(schema_field, task, schema, api_visibility="private", queue=False, show_progress="hidden")
    schema.blur(filled, [task, schema, box], [box, schema], api_visibility="private")
    panel = [rendered, table, notes]

    def panel_of(view):
        """``view`` (:func:`structured_view` or :func:`pending_view`) returning by box, under its own name."""
        @functools.wraps(view)
        def by_box(*values):
            return dict(zip(panel, view(*values), strict=True))

        return by_box

    def follow(event, started=None):
        """Read each answer once it is complete; from ``started`` (a message sent) until then, the
        panel says it waits, instead of showing the previous answer as if it were this one's."""
        if started is not None:
            started.then(panel_of(pending_view), task, panel, api_visibility="private", queue=False,
                         show_progress="hidden")
        return event.then(panel_of(structured_view), [task, schema, answer], panel,
                          api_visibility="private", show_progress="hidden")

    return follow, task, schema
