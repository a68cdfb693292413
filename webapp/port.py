"""The vLLM port tab: where vLLM's port of Granite 4 Vision departs from transformers, per injection
level, per layer, per config field. It runs ``python -m g4v port-diff`` in the vLLM environment,
with the CLI's vision-LoRA options (``--vision-lora``, ``--vllm-vision-lora``, ``--vllm-serving``)."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from g4v.checkpoint.vision_lora import MODES, VisionLora, check_mode, find_vision_lora
from g4v.engines import vllm_python
from g4v.errors import G4VError
from g4v.port import lora_audit
from g4v.port.in_vllm_env import SETUP_COMMAND, run_port_diff_in_vllm_env
from g4v.port.settings import PortDiffSettings
from g4v.port.summary import PortDiffSummary
from g4v.port.table import LEVEL_COLUMNS, level_rows, with_texts, without_model_path
from webapp.common import OutputBoxes, escape_markdown, shows_errors
from webapp.pictures import picture_row
from webapp.runs import busy_while_running, live_progress, previous_run_mark, run_keeping_previous

SETUP_HINT = (f"**This tab is off: the vLLM environment is not built** (`make run` leaves it out). Turn it on "
              f"with `{SETUP_COMMAND}` (a few minutes, about 6 GiB), then restart the app; or point "
              "`G4V_VLLM_PYTHON` at a Python that has vLLM.")
RUN_HINT = ("A comparison runs in the vLLM environment, mostly starting vLLM's engine: about a minute on a CPU; "
            "the bar here names each stage and the time left.")
COMPARE, COMPARING = "Compare", "Comparing…"  # the button, and what it says while a run works
#: What the refusals call the serving box (the app has no ``--vllm-serving`` flag).
SERVING_NAME = "vLLM LoRA arguments"
#: The tab's starting options: ``port-diff``'s defaults, written once in PortDiffSettings.
DEFAULTS = PortDiffSettings()


@dataclass(frozen=True)
class PortCheckpoint:
    """What the tab knows of the served checkpoint, read once from its folder: its vision LoRA (None:
    it has none) and the folder (None: no local one), whose name the page says instead of its path."""

    lora: VisionLora | None
    folder: Path | None

    @classmethod
    def of(cls, model: str) -> "PortCheckpoint":
        folder = Path(model).expanduser()
        folder = folder.resolve() if folder.is_dir() else None
        try:
            lora = find_vision_lora(str(folder)) if folder is not None else None
        except G4VError:
            lora = None  # port-diff itself says what is wrong with it
        return cls(lora, folder)

    def shown(self, line: str) -> str:
        """``line`` with the checkpoint's path on the server reduced to its folder's name."""
        for folder in {self.folder, self.lora.folder if self.lora else None} - {None}:
            line = line.replace(str(folder), folder.name)
        return line


@dataclass
class LoraSettings:
    """The tab's vision LoRA options, checked: both sides' modes, vLLM's LoRA arguments as given
    (None: g4v's recipe for the mode; folders confined to the checkpoint's), and the audit's
    findings for them (:func:`g4v.port.lora_audit.findings`, from the config alone, no vLLM).

    Not merged into :class:`PortDiffSettings`: that is the request (what ``port-diff`` is asked),
    this is the tab's check of its vision LoRA part (the parsed, confined arguments, the findings,
    the refused folders), shown before anything runs; :meth:`request` is the one from the other."""

    transformers: str
    vllm: str
    serving: dict | None
    findings: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # folders the app will not hand vLLM (the audit only)

    def to_dict(self) -> dict:
        return {"transformers": self.transformers, "vllm": self.vllm, "vllm_serving": self.serving,
                "findings": self.findings, "refused": self.refused}

    def request(self) -> PortDiffSettings:
        """The ``port-diff`` request these options make (the rest at its defaults)."""
        return PortDiffSettings(vision_lora=self.transformers, vllm_vision_lora=self.vllm,
                                vllm_serving=None if self.serving is None else json.dumps(self.serving))


def lora_settings(checkpoint: PortCheckpoint, vision_lora: str | None, vllm_vision_lora: str | None,
                  serving_text: str | None, strict: bool = True) -> LoraSettings:
    """The options as port-diff takes them; a bad one is one line (:class:`G4VError`). ``strict``
    False (the audit): a folder the app refuses goes into ``refused`` instead, beside the findings
    of the rest, so the page shows every problem at once."""
    transformers, vllm = check_mode(vision_lora), check_mode(vllm_vision_lora)
    serving = lora_audit.parse_serving((serving_text or "").strip() or None, SERVING_NAME)
    serving, refused = lora_audit.check_serving(serving, checkpoint.folder)
    if refused and strict:
        raise G4VError(f"{SERVING_NAME}: " + "; ".join(refused))
    lora = checkpoint.lora
    vllm_side = vllm if lora else "off"
    used = lora_audit.recipe(lora, vllm_side) if serving is None else serving
    found = lora_audit.findings(lora, transformers if lora else "off", vllm_side, used)
    return LoraSettings(transformers, vllm, serving, [checkpoint.shown(line) for line in found], refused)


def audit_note(checkpoint: PortCheckpoint, vision_lora, vllm_vision_lora, serving_text) -> str:
    """The options' audit, before anything runs: what the checkpoint has, then one line per finding
    (or that both sides run the same model); a bad option says why here, where it is typed, and a
    refused folder comes with the findings of the rest (every problem at once)."""
    try:
        settings = lora_settings(checkpoint, vision_lora, vllm_vision_lora, serving_text, strict=False)
    except G4VError as err:
        return f"**Not usable**: {escape_markdown(err)}"
    if settings.refused:
        return "\n".join([f"**Not usable**: {SERVING_NAME}: " + escape_markdown("; ".join(settings.refused)), "",
                          *(f"- {escape_markdown(line)}" for line in settings.findings)])
    lora = checkpoint.lora
    head = ("This checkpoint has no vision LoRA (its weights are the vision model): the modes do not apply."
            if lora is None else f"Vision LoRA: rank {lora.rank}, {len(lora.modules)} modules; transformers "
            f"{settings.transformers}, vLLM {settings.vllm}"
            + (" with g4v's recipe." if settings.serving is None else " with your LoRA arguments."))
    lines = settings.findings or ["no finding: both sides run the same model"]
    return head + "\n\n" + "\n".join(f"- {escape_markdown(line)}" for line in lines)


@dataclass
class PortBoxes(OutputBoxes):
    """A comparison's results, in ``/port_diff``'s order."""

    verdict: gr.Markdown  # above the results: a refused or outdated run's mark goes here
    table: gr.Dataframe
    picture: gr.Image
    details: gr.JSON


def make_port_diff(model: str, boxes: PortBoxes, checkpoint: PortCheckpoint | None = None):
    checkpoint = checkpoint or PortCheckpoint.of(model)

    @shows_errors
    def port_diff(image_path, prompt, vision_lora=DEFAULTS.vision_lora, vllm_vision_lora=DEFAULTS.vllm_vision_lora,
                  vllm_serving=DEFAULTS.vllm_serving, progress=gr.Progress()):
        """vLLM's granite4_vision against transformers for one image (runs in the vLLM environment),
        with the vision LoRA options checked before vLLM starts (every option has a default, so an
        API client that sends only the image and prompt still runs: ``vllm_serving`` None, not "")."""
        settings = lora_settings(checkpoint, vision_lora, vllm_vision_lora, vllm_serving)
        with live_progress(progress) as tell:
            report = run_port_diff_in_vllm_env(image_path, prompt, model, settings.request(), progress=tell)
        summary = shown_summary(report.summary, checkpoint)
        return {boxes.verdict: verdict_text(summary), boxes.table: level_rows(summary.levels),
                boxes.picture: str(report.png), boxes.details: summary.to_dict()}

    return port_diff


def shown_summary(summary: PortDiffSummary, checkpoint: PortCheckpoint | None = None) -> PortDiffSummary:
    """The summary as the page shows it: the model's path on the server (and the checkpoint's, in
    findings and errors) reduced to its folder's name; the caller's is left as it was."""
    summary = without_model_path(summary)
    return with_texts(summary, checkpoint.shown) if checkpoint is not None else summary


def verdict_text(summary: PortDiffSummary) -> str:
    """The verdict line, the tolerance rule, and the vision LoRA findings under it, one per line (the
    message and findings as text: they quote files and the vLLM side's own words, never markup)."""
    tolerance, lora = summary.tolerance, summary.vision_lora
    findings = lora.findings if lora else []
    return (f"**{'Agrees' if summary.ok else 'Differs'}**: {escape_markdown(summary.message)}"
            + (f"\n\nPer-level tolerance: `{tolerance.rule}` ({tolerance.source})" if tolerance else "")
            + ("\n\nVision LoRA findings:\n" + "\n".join(f"- {escape_markdown(line)}" for line in findings) if findings else ""))


def port_tab(model: str, last_chat_image: gr.State) -> None:
    available = vllm_python() is not None
    checkpoint = PortCheckpoint.of(model)
    gr.Markdown("Where vLLM's port of Granite 4 Vision departs from transformers: per injection level, "
                "per layer, per config field.")
    if not available:
        gr.Markdown(SETUP_HINT, elem_id="port-setup-hint")
    with picture_row("port", last_chat_image, height=200, status=RUN_HINT) as row:  # the run's progress under the picture
        prompt = gr.Textbox(label="Prompt", value="What colour is the shape?", elem_id="port-prompt")
        run = gr.Button(COMPARE, variant="primary", interactive=available, elem_id="port-run")
    image, status = row.image, row.status
    name = checkpoint.folder.name if checkpoint.folder else "FOLDER"
    with gr.Accordion("Vision LoRA and vLLM serving", open=checkpoint.lora is not None):
        with gr.Row():
            hf_mode = gr.Dropdown(list(MODES), value=DEFAULTS.vision_lora, label="transformers: vision LoRA",
                                  elem_id="port-vision-lora")
            vllm_mode = gr.Dropdown(list(MODES), value=DEFAULTS.vllm_vision_lora, label="vLLM: vision LoRA",
                                    info="native: the LoRA per image request; merged: a merged copy; off: the base",
                                    elem_id="port-vllm-vision-lora")
        serving = gr.Textbox(label=SERVING_NAME + " (JSON, as you serve it; empty: g4v's recipe for the mode)",
                             placeholder=f'{{"enable_lora": true, "max_lora_rank": 16, "default_mm_loras": '
                                         f'{{"image": "{name}"}}}}',
                             info=f"keys: {', '.join(lora_audit.SERVING_KEYS)}; a folder is this checkpoint's, "
                                  f"by its name ({name})", elem_id="port-vllm-serving")
        audit = gr.Markdown(audit_note(checkpoint, DEFAULTS.vision_lora, DEFAULTS.vllm_vision_lora, ""),
                            elem_id="port-lora-audit")
    options = [hf_mode, vllm_mode, serving]
    for option in options:
        option.change(lambda *values: audit_note(checkpoint, *values), options, audit, api_visibility="private",
                      queue=False, show_progress="hidden")
    verdict = gr.Markdown(elem_id="port-verdict")
    table = gr.Dataframe(headers=list(LEVEL_COLUMNS), label="Levels", interactive=False, elem_id="port-levels")
    picture = gr.Image(label="Per-token differences and trajectories", format="png")
    details = gr.JSON(label="Everything (trajectory, next token, config audit)")
    boxes = PortBoxes(verdict=verdict, table=table, picture=picture, details=details)
    ready = busy_while_running(run, COMPARING) if available else lambda event: None
    # a refused run leaves the results on show, marked as the previous run's; so does another picture,
    # one uploaded while the run works included
    event = run_keeping_previous(run, make_port_diff(model, boxes, checkpoint), [image, prompt, *options],
                                 boxes.components(), verdict, picture=image, api_name="port_diff",
                                 show_progress_on=status)
    ready(event)
    image.change(**previous_run_mark(verdict))
