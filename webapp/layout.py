"""The whole page: a banner, then one tab per panel, each built by its own module."""

import json
from dataclasses import dataclass, field
from typing import Callable

import gradio as gr

from g4v.commands.panels import PANELS
from g4v.engines import Engine
from g4v.errors import G4VError
from g4v.loading import model_name
from g4v.paths import (ASSETS_DIR, DOCUMENTS_MODEL_DIR, EXAMPLES_DIR, REAL_MODEL_ID, TRAINED_MODEL_DIR, is_bundled,
                       names_folder)
from webapp.attribution import attribution_tab
from webapp.chat import chat_tab
from webapp.circuits import circuits_tab
from webapp.common import engine_line, markdown_code, model_task
from webapp.deepstack import deepstack_tab
from webapp.evaluate import STORES, EvalWorkspace, evaluate_tab
from webapp.evaluate_open import OpenInChat, OpenInDeepstack, OpenInLora, OpenTargets
from webapp.intake import WorkbenchBlocks
from webapp.lora import lora_tab
from webapp.port import port_tab
from webapp.runs import RUN_STATUS
from webapp.sessions import SessionStores, session_key
from webapp.tiling import tiling_tab
from webapp.training import training_tab

#: Gradio deletes the files it cached for this app (uploads, returned pictures, exports) once they
#: are this old, checking this often; and all of them when the server stops.
CACHE_CLEANUP = (600, 3600)  # (every seconds, older than seconds)


def workbench_theme() -> gr.themes.Base:
    """Gradio's default theme, its fonts declared at 400 and 700 only (``app.py`` launches with it).

    Gradio 6.31 ships ``SourceSansPro-SemiBold`` and ``IBMPlexMono-SemiBold`` as their Cyrillic
    subsets (55 and 75 glyphs, Latin capitals A and B among them), and the default theme declares
    weights 400 and 600. Every semibold label (buttons, headings) and, for want of a 700 face, all
    bold text then drew its A and B in Source Sans and every other letter in a fallback font ("Open
    in LoRA" ended in a smaller A). With 400 and 700 declared, CSS font matching draws 600 with the
    700 face, whose files are whole."""
    return gr.themes.Default(
        font=[gr.themes.LocalFont("Source Sans Pro", weights=(400, 700)), "ui-sans-serif", "system-ui", "sans-serif"],
        font_mono=[gr.themes.LocalFont("IBM Plex Mono", weights=(400, 700)), "ui-monospace", "Consolas", "monospace"])


#: The page's own CSS (``app.py`` launches with it). A run's progress bar is drawn over a status
#: line (:func:`webapp.runs.status_line`), over a translucent veil: the line's text is hidden
#: while the run works (Gradio marks the box ``pending``), so the bar's words are not drawn over
#: the line's own. At once: Gradio fades a pending box in 0.15 s, and the line stayed readable under
#: the bar's first words for that long.
WORKBENCH_CSS = f".{RUN_STATUS} .pending {{ visibility: hidden; transition: none; }}"


def banner(model: str) -> str:
    switch = (f"For the real model run `python app.py --model {REAL_MODEL_ID}` (or set `G4V_MODEL`) on a "
              "machine with a GPU and access to the Hugging Face Hub.")
    trained = ("**Demo checkpoint in use**: a tiny Granite 4 Vision (the real architecture, 6 M parameters) "
               "trained here on synthetic pictures of shapes. It answers questions about the colour, kind, "
               "position and number of simple shapes")
    documents = ("reads synthetic bar charts into CSV (the Chart to CSV task) and fills a JSON schema about the "
                 "shapes (the key-value extraction task)")
    if names_folder(model, TRAINED_MODEL_DIR):
        return (f"{trained}, and little else. The same checkpoint trained further on documents also {documents}. "
                f"To use it, run `python app.py --model assets/{DOCUMENTS_MODEL_DIR.name}`. " + switch)
    if names_folder(model, DOCUMENTS_MODEL_DIR):
        return (f"{trained}. Its document stages taught it two more tasks: it {documents}. "
                "It does little else. " + switch)
    if is_bundled(model):
        return ("**Demo checkpoint in use**: a tiny Granite 4 Vision with the real architecture and random "
                "weights, bundled so the workbench runs offline. Its answers are not meaningful. " + switch)
    return f"Model: {markdown_code(model_name(model))}"  # a local folder by its name: the page never shows a server path


def example_rows(model: str) -> list[list]:
    """Chat examples listed in assets/examples/examples.json, as rows of the Chat tab's examples:
    [the box's value, the task preset the example is asked with ("" for a plain question), the JSON
    schema's text (None when the example has none)], so clicking a document example also picks its
    preset and the structured panel reads the answer. An entry with a ``model``
    (a bundled checkpoint's folder name) is shown only when that checkpoint is served."""
    listed = json.loads((EXAMPLES_DIR / "examples.json").read_text())
    return [[{"text": item["prompt"], "files": [str(EXAMPLES_DIR / item["file"])]}, item.get("task", ""),
             (EXAMPLES_DIR / item["schema"]).read_text() if "schema" in item else None]
            for item in listed if "model" not in item or names_folder(model, ASSETS_DIR / item["model"])]


def local_config(engine: Engine):
    """The model's transformers config, or None when it cannot be read here (a remote server's
    served model name); the Tiling and Deepstack tabs need it."""
    try:
        return engine.model_config()
    except (G4VError, OSError, ValueError):
        return None


@dataclass
class Page:
    """What the tabs are built from: ``build_app``'s arguments and what the page shares."""

    engine: Engine
    model: str
    config: object  # the model's transformers config, or None (see local_config)
    concurrency: int
    gpu_task: Callable
    adapters_dir: object
    data_dirs: tuple
    eval_servers: tuple
    runs_dir: object
    sessions: SessionStores
    last_chat_image: gr.State  # the newest image sent in Chat, for the picture tabs
    tabs: gr.Tabs
    #: What each tab built so far returned, by panel id: the inputs another tab fills (Evaluate's "Open in ...").
    built: dict = field(default_factory=dict)

    def engine_line(self, panel_id: str, inspector: bool = True) -> None:
        """The line over a tab naming the engine it runs on (``#<id>-engine-line``)."""
        gr.Markdown(engine_line(self.engine, inspector=inspector), elem_id=f"{panel_id}-engine-line")


# Each tab as the page builds it, by its module's builder: the engine line over it where it has one,
# and what it returns for another tab to fill (kept in ``page.built``).


def chat(page: Page):
    page.engine_line("chat", inspector=False)
    return chat_tab(page.engine, page.last_chat_image, example_rows(page.model), page.concurrency, page.gpu_task,
                    page.config)


def tiling(page: Page):
    page.engine_line("tiling")
    tiling_tab(page.config, page.last_chat_image)


def deepstack(page: Page):
    page.engine_line("deepstack")
    return deepstack_tab(page.engine, page.config, page.last_chat_image, page.sessions, page.concurrency, page.gpu_task)


def attribution(page: Page):
    page.engine_line("attribution")
    attribution_tab(page.engine, page.config, page.last_chat_image, page.sessions, page.concurrency, page.gpu_task)


def circuits(page: Page):
    page.engine_line("circuits")
    circuits_tab(page.engine, page.last_chat_image, page.sessions, page.concurrency, page.gpu_task)


def port(page: Page):
    page.engine_line("port")
    port_tab(page.model, page.last_chat_image)


def lora(page: Page):
    page.engine_line("lora", inspector=False)
    return lora_tab(page.engine, page.model, page.adapters_dir, page.last_chat_image, page.concurrency, page.gpu_task)


def evaluate(page: Page):
    deepstack_image, deepstack_prompt = page.built["deepstack"]
    lora_adapter, lora_image, lora_prompt = page.built["lora"]
    targets = OpenTargets(OpenInChat(page.built["chat"], page.tabs),
                          OpenInDeepstack(deepstack_image, deepstack_prompt, page.tabs),
                          OpenInLora(lora_image, lora_prompt, lora_adapter, page.tabs))
    evaluate_tab(page.engine, page.model, page.adapters_dir, EvalWorkspace(page.sessions, page.data_dirs), targets,
                 page.eval_servers, page.concurrency, page.gpu_task)


def training(page: Page):
    training_tab(page.last_chat_image, page.runs_dir, page.gpu_task)


#: How each panel's tab is built, by its id; which tabs there are, in what order and under what
#: title, is :data:`g4v.commands.panels.PANELS`.
TABS: dict[str, Callable[[Page], object]] = {
    "chat": chat, "tiling": tiling, "deepstack": deepstack, "attribution": attribution, "circuits": circuits,
    "port": port, "lora": lora, "evaluate": evaluate, "training": training}


def build_app(engine: Engine, model: str, concurrency: int = 1, adapters_dir=None, gpu_task=lambda fn: fn,
              data_dirs=(), eval_servers=(), runs_dir=None) -> gr.Blocks:
    """The workbench page. ``data_dirs``: folders the Evaluate tab lists datasets from (besides the
    bundled one); ``eval_servers``: OpenAI-compatible servers it offers as arms (``URL[,model=NAME]``);
    ``runs_dir``: the Training tab's run folders."""
    gpu_task = model_task(engine, gpu_task)  # a request sent while the model loads is told so
    with WorkbenchBlocks(title="Granite 4 Vision workbench", analytics_enabled=False, delete_cache=CACHE_CLEANUP) as demo:
        # Each visitor's files in folders of their own (webapp.sessions), inside Gradio's cache so
        # Gradio serves them without copying them, and the stores' pruning is the only copy's
        # lifetime. Exports: at least twice the model's concurrency, so none is pruned while written.
        sessions = SessionStores(demo.GRADIO_CACHE, {"inspect": max(8, 2 * concurrency), **STORES})

        def forget_visitor(request: gr.Request):
            sessions.end(session_key(request))

        demo.unload(forget_visitor)
        gr.Markdown("# Granite 4 Vision workbench")
        gr.Markdown(banner(model), elem_id="model-banner")
        last_chat_image = gr.State(None)
        with gr.Tabs() as tabs:  # by id, so a tab can switch to another (the Evaluate tab's "Open in ...")
            page = Page(engine, model, local_config(engine), concurrency, gpu_task, adapters_dir, data_dirs,
                        eval_servers, runs_dir, sessions, last_chat_image, tabs)
            for panel in PANELS:
                with gr.Tab(panel.tab, id=panel.id):
                    page.built[panel.id] = TABS[panel.id](page)
    return demo
