"""The whole page: a banner, then one tab per panel, each built by its own module."""

import json

import gradio as gr

from g4v.engines import Engine
from g4v.errors import G4VError
from g4v.loading import model_name
from g4v.paths import (ASSETS_DIR, DOCUMENTS_MODEL_DIR, EXAMPLES_DIR, REAL_MODEL_ID, TRAINED_MODEL_DIR, is_bundled,
                       names_folder)
from webapp.attribution import attribution_tab
from webapp.chat import chat_tab
from webapp.circuits import circuits_tab
from webapp.common import WorkbenchBlocks, engine_line, markdown_code, model_task
from webapp.deepstack import deepstack_tab
from webapp.evaluate import STORES, EvalWorkspace, evaluate_tab
from webapp.evaluate_open import OpenInChat, OpenInDeepstack, OpenInLora, OpenTargets
from webapp.lora import lora_tab
from webapp.port import port_tab
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


def build_app(engine: Engine, model: str, concurrency: int = 1, adapters_dir=None, gpu_task=lambda fn: fn,
              data_dirs=(), eval_servers=(), runs_dir=None) -> gr.Blocks:
    """The workbench page. ``data_dirs``: folders the Evaluate tab lists datasets from (besides the
    bundled one); ``eval_servers``: OpenAI-compatible servers it offers as arms (``URL[,model=NAME]``);
    ``runs_dir``: the Training tab's run folders."""
    config = local_config(engine)
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
        last_chat_image = gr.State(None)  # the newest image sent in Chat, for the inspection tabs
        with gr.Tabs() as tabs:  # by id, so a tab can switch to another (the Evaluate tab's "Open in ...")
            with gr.Tab("Chat", id="chat"):
                gr.Markdown(engine_line(engine), elem_id="chat-engine-line")
                chat_box = chat_tab(engine, last_chat_image, example_rows(model), concurrency, gpu_task)
            with gr.Tab("Tiling", id="tiling"):
                gr.Markdown(engine_line(engine, inspector=True), elem_id="tiling-engine-line")
                tiling_tab(config, last_chat_image)
            with gr.Tab("Deepstack", id="deepstack"):
                gr.Markdown(engine_line(engine, inspector=True), elem_id="deepstack-engine-line")
                deepstack_image, deepstack_prompt = deepstack_tab(engine, config, last_chat_image, sessions,
                                                                  concurrency, gpu_task)
            with gr.Tab("Attribution", id="attribution"):
                gr.Markdown(engine_line(engine, inspector=True), elem_id="attribution-engine-line")
                attribution_tab(engine, config, last_chat_image, sessions, concurrency, gpu_task)
            with gr.Tab("Circuits", id="circuits"):
                gr.Markdown(engine_line(engine, inspector=True), elem_id="circuits-engine-line")
                circuits_tab(engine, last_chat_image, sessions, concurrency, gpu_task)
            with gr.Tab("vLLM port", id="port"):
                gr.Markdown(engine_line(engine, inspector=True), elem_id="port-engine-line")
                port_tab(model, last_chat_image)
            with gr.Tab("LoRA", id="lora"):
                gr.Markdown(engine_line(engine), elem_id="lora-engine-line")
                lora_adapter, lora_image, lora_prompt = lora_tab(engine, model, adapters_dir, last_chat_image,
                                                                 concurrency, gpu_task)
            with gr.Tab("Evaluate", id="evaluate"):
                targets = OpenTargets(OpenInChat(chat_box, tabs), OpenInDeepstack(deepstack_image, deepstack_prompt, tabs),
                                      OpenInLora(lora_image, lora_prompt, lora_adapter, tabs))
                evaluate_tab(engine, model, adapters_dir, EvalWorkspace(sessions, data_dirs), targets,
                             eval_servers, concurrency, gpu_task)
            with gr.Tab("Training", id="training"):
                training_tab(last_chat_image, runs_dir, gpu_task)
    return demo
