"""g4v: the Granite 4 Vision workbench in the browser (also the Hugging Face Spaces entry point).

    python app.py [--model M] [--backend auto|hf] [--host 127.0.0.1] [--port 7860]

The Gradio wiring reads top to bottom; the work happens in plain functions of the ``g4v`` package.
"""

import argparse
import json
import os
import threading
from pathlib import Path

import gradio as gr

from g4v.commands.engine_flags import add_engine_flags, engine_options
from g4v.conversation import Message, SamplingSettings, validate_conversation
from g4v.engines import BACKENDS, Engine, create_engine
from g4v.errors import G4VError
from g4v.images import open_image
from g4v.port_diff_runner import run_port_diff_in_vllm_env, vllm_python
from g4v.paths import ASSETS_DIR, EXAMPLES_DIR, REAL_MODEL_ID, TRAINED_MODEL_DIR, default_model, is_bundled
from g4v.deepstack import describe_levels, parse_scale_specs
from g4v.inspection import run_inspection
from g4v.lora import adapter_choices, adapter_folder_help, lora_side_by_side, lora_token_diff, model_config
from g4v.tiling import highlight_token, tiling_report, token_at

try:  # Hugging Face ZeroGPU: GPU work must run inside functions decorated with spaces.GPU.
    import spaces

    gpu_task = spaces.GPU
except ImportError:  # anywhere else the decorator is a no-op

    def gpu_task(fn=None, **_):
        return fn if fn is not None else (lambda f: f)


MAX_IMAGES_PER_MESSAGE = 4
MAX_NEW_TOKENS_LIMIT = 1024


# ── settings ─────────────────────────────────────────────────────────────────────────────────


def parse_args(argv=None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description="Granite 4 Vision workbench")
    parser.add_argument("--model", default=default_model(), help="model folder or hub id ($G4V_MODEL)")
    parser.add_argument("--backend", default=env("G4V_BACKEND", "auto"), choices=BACKENDS)
    parser.add_argument("--device", default=env("G4V_DEVICE", "auto"))
    parser.add_argument("--dtype", default=env("G4V_DTYPE", "auto"))
    # Loopback unless told otherwise; Spaces tells us through GRADIO_SERVER_NAME.
    parser.add_argument("--host", default=env("G4V_HOST", env("GRADIO_SERVER_NAME", "127.0.0.1")),
                        help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=int(env("G4V_PORT", env("GRADIO_SERVER_PORT", "7860"))))
    parser.add_argument("--concurrency", type=int, default=int(env("G4V_CONCURRENCY", "1")),
                        help="requests run on the model at once; the rest wait in the queue")
    parser.add_argument("--max-queue", type=int, default=int(env("G4V_MAX_QUEUE", "32")))
    parser.add_argument("--adapters-dir", default=env("G4V_ADAPTERS_DIR"),
                        help="folder(s) LoRA adapters may be loaded from (default: assets/adapters)")
    add_engine_flags(parser)  # --base-url/--api-key (openai) and vLLM's own settings (vllm)
    return parser.parse_args(argv)


# ── chat: Gradio messages -> g4v conversation ────────────────────────────────────────────────


def _file_path(item) -> str | None:
    """The server path of an uploaded file in any of the shapes Gradio uses for it."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        if item.get("type") == "file":
            item = item.get("file", {})
        return item.get("path")
    return getattr(item, "path", None)


def _content_parts(content) -> tuple[list[str], list[str]]:
    """(texts, file paths) of one Gradio message's content."""
    texts, files = [], []
    parts = content if isinstance(content, (list, tuple)) else [content]
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            texts.append(part.get("text", ""))
        elif (path := _file_path(part)) is not None:
            files.append(path)
    return texts, files


def to_conversation(message: dict, history: list[dict]) -> list[Message]:
    """Turn the multimodal textbox value and the chat history into g4v messages.

    Consecutive history entries of one role are merged: Gradio stores an uploaded file and the
    text sent with it as separate entries.
    """
    conversation: list[Message] = []
    for entry in history:
        role = entry.get("role") if isinstance(entry, dict) else getattr(entry, "role", None)
        content = entry.get("content") if isinstance(entry, dict) else getattr(entry, "content", None)
        texts, files = _content_parts(content)
        images = [open_image(path, name=Path(path).name) for path in files]
        if conversation and conversation[-1].role == role:
            previous = conversation[-1]
            previous.text = "\n".join(t for t in (previous.text, *texts) if t)
            previous.images.extend(images)
        else:
            conversation.append(Message(role, "\n".join(t for t in texts if t), images))

    files = [_file_path(f) for f in (message.get("files") or [])]
    if len(files) > MAX_IMAGES_PER_MESSAGE:
        raise G4VError(f"too many images: {len(files)} in one message, the limit is {MAX_IMAGES_PER_MESSAGE}")
    images = [open_image(path, name=Path(path).name) for path in files]
    conversation.append(Message("user", message.get("text") or "", images))
    return conversation


def make_chat_fn(engine: Engine):
    @gpu_task
    def chat(message: dict, history: list[dict], max_new_tokens, temperature, top_p, seed):
        """Stream the answer; a refusal is one ``gr.Error`` line and the chat carries on."""
        try:
            conversation = to_conversation(message, history)
            validate_conversation(conversation)
            settings = SamplingSettings(
                max_new_tokens=int(max_new_tokens),
                temperature=float(temperature),
                top_p=float(top_p),
                seed=None if seed in (None, "", -1) else int(seed),
            ).validated(MAX_NEW_TOKENS_LIMIT)
            stream = engine.stream(conversation, settings, cancel=threading.Event())
        except G4VError as err:
            raise gr.Error(str(err)) from None
        last_image = _last_image_path(message, history)
        answer = ""
        for piece in stream:  # the stop button closes this generator, which stops generation
            answer += piece
            yield answer, last_image

    return chat


def _last_image_path(message: dict, history: list[dict]) -> str | None:
    """The newest image of the conversation, for "inspect the chat image" buttons."""
    paths = [_file_path(f) for f in (message.get("files") or [])]
    for entry in history:
        paths.extend(_content_parts(entry.get("content") if isinstance(entry, dict) else None)[1])
    return paths[-1] if paths else None


# ── tiling ───────────────────────────────────────────────────────────────────────────────────


def make_tiling_fns(config):
    def analyse(image_path):
        """Overlay, token-budget table and plan for one image."""
        if config is None:
            raise gr.Error("the tiling inspector needs the model's config.json, which this backend does not expose")
        if not image_path:
            raise gr.Error("upload an image first")
        try:
            overlay, rows, plan = tiling_report(image_path, config)
            first_tile_token = plan.base_tokens
            token_view = highlight_token(image_path, plan, first_tile_token)
        except G4VError as err:
            raise gr.Error(str(err)) from None
        return overlay, rows, plan, first_tile_token, token_view, token_description(plan, first_tile_token)

    def select_index(image_path, plan, index):
        if plan is None or not image_path:
            raise gr.Error("analyse an image first")
        try:
            return highlight_token(image_path, plan, index), token_description(plan, int(index))
        except (G4VError, TypeError, ValueError) as err:
            raise gr.Error(str(err)) from None

    def select_click(image_path, plan, evt: gr.SelectData):
        """Clicking the token view picks the tile token under the pointer."""
        if plan is None or not image_path:
            raise gr.Error("analyse an image first")
        x, y = evt.index
        token = token_at(plan, x, y) or token_at(plan, x, y, kind="base")
        if token is None:
            raise gr.Error(f"no token covers pixel ({x}, {y})")
        return token.index, highlight_token(image_path, plan, token.index), token_description(plan, token.index)

    return analyse, select_index, select_click


def token_description(plan, index: int) -> str:
    token = plan.tokens[index]
    left, top, right, bottom = (round(v, 1) for v in token.box)
    where = f"tile {token.tile}, " if token.tile is not None else ""
    return (f"Token **{token.index}** of {plan.num_image_tokens}: {token.kind}, {where}row {token.row}, "
            f"column {token.col}; covers x {left}-{right}, y {top}-{bottom} of the original image.")


# ── Deepstack ────────────────────────────────────────────────────────────────────────────────

LEVEL_COLUMNS = ["level", "kind", "vision layer", "LLM layer", "injected norm", "residual before", "residual after"]


def make_inspect_fn(engine: Engine):
    @gpu_task
    def inspect(image_path, prompt, ablate, scales_text, full):
        """Capture the 8 injections for one image and prompt; ablate or scale levels if asked."""
        try:
            scales = parse_scale_specs(part.strip() for part in (scales_text or "").split(",") if part.strip())
            result = run_inspection(engine, image_path, prompt, ablate=ablate or (), scale=scales, full=bool(full))
        except G4VError as err:
            raise gr.Error(str(err)) from None
        rows = [[lv["name"], lv["kind"], lv["vision_layer"], lv["llm_layer"], round(lv["injected_norm_mean"], 3),
                 round(lv["residual_norm_before_mean"], 3), round(lv["residual_norm_after_mean"], 3)]
                for lv in result.summary["levels"]]
        figures = result.figures
        return (rows, figures["norms"], figures["trajectory"], figures["heatmaps_tile"], figures["heatmaps_base"],
                ablation_report(result.summary), str(result.export_zip))

    return inspect


def ablation_report(summary: dict) -> str:
    top = ", ".join(f"`{t['text']}` {t['prob']:.3f}" for t in summary["next_token_top5"])
    lines = [f"**Next token (top 5):** {top}", f"**Greedy continuation:** `{summary['continuation']}`"]
    ablation = summary.get("ablation")
    if ablation:
        after = ", ".join(f"`{t['text']}` {t['prob']:.3f}" for t in ablation["top5_after"])
        changed = {name: f for name, f in ablation["scales"].items() if f != 1.0}
        lines += [
            f"**Changed levels:** {', '.join(f'{n} x{f:g}' for n, f in changed.items())}",
            f"**KL(before || after) of the next token:** {ablation['kl_divergence']:.4g}",
            f"**Top 5 after:** {after}",
            f"**Greedy continuation after:** `{ablation['continuation_after']}`",
        ]
    return "\n\n".join(lines)


# ── vLLM port ────────────────────────────────────────────────────────────────────────────────

PORT_COLUMNS = ["level", "LLM layer", "max |diff|", "max relative diff", "verdict"]


def make_port_fn(model: str):
    def port_diff(image_path, prompt):
        """vLLM's granite4_vision against transformers for one image (runs in the vLLM environment)."""
        try:
            report = run_port_diff_in_vllm_env(image_path, prompt, model)
        except G4VError as err:
            raise gr.Error(str(err)) from None
        summary = report.summary
        rows = [[lv["name"], lv["llm_layer"], lv["max_abs_diff"], lv["max_rel_diff"],
                 "ok" if lv["ok"] else lv.get("problem") or "differs"] for lv in summary.get("levels") or []]
        verdict = f"**{'Agrees' if summary.get('ok') else 'Differs'}**: {summary.get('message', '')}"
        return verdict, rows, str(report.png), summary

    return port_diff


# ── LoRA ─────────────────────────────────────────────────────────────────────────────────────


def _images_of(image_path) -> list[str]:
    return [image_path] if image_path else []


def make_lora_fns(engine: Engine, adapters_dir):
    @gpu_task
    def side_by_side(adapter, image_path, prompt, max_new_tokens, temperature, seed):
        """Base and adapter answers, streamed together with the same settings and seed."""
        try:
            settings = SamplingSettings(
                max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                seed=None if seed in (None, "", -1) else int(seed),
            ).validated(MAX_NEW_TOKENS_LIMIT)
            pairs = lora_side_by_side(engine, adapter or "", prompt, _images_of(image_path), settings,
                                      adapters_dir=adapters_dir, cancel=threading.Event())
            yield from pairs
        except G4VError as err:
            raise gr.Error(str(err)) from None

    @gpu_task
    def token_diff(adapter, image_path, prompt, max_new_tokens):
        """Greedy answers with and without the adapter, scored token by token under both."""
        try:
            view = lora_token_diff(engine, adapter or "", prompt, _images_of(image_path), int(max_new_tokens),
                                   adapters_dir=adapters_dir)
        except G4VError as err:
            raise gr.Error(str(err)) from None
        return view.html, view.figure, view.data

    return side_by_side, token_diff


# ── layout ───────────────────────────────────────────────────────────────────────────────────


def banner(model: str) -> str:
    switch = (f"For the real model run `python app.py --model {REAL_MODEL_ID}` (or set `G4V_MODEL`) on a "
              "machine with a GPU and access to the Hugging Face Hub.")
    if is_bundled(model) and Path(model).resolve() == TRAINED_MODEL_DIR.resolve():
        return ("**Demo checkpoint in use**: a tiny Granite 4 Vision (the real architecture, 6 M parameters) "
                "trained here on synthetic pictures of shapes. It answers questions about the colour, kind, "
                "position and number of simple shapes, and little else. " + switch)
    if is_bundled(model):
        return ("**Demo checkpoint in use**: a tiny Granite 4 Vision with the real architecture and random "
                "weights, bundled so the workbench runs offline. Its answers are not meaningful. " + switch)
    return f"Model: `{model}`"


def example_messages() -> list[list]:
    """Chat examples listed in assets/examples/examples.json, with default sampling settings."""
    listed = json.loads((EXAMPLES_DIR / "examples.json").read_text())
    return [[{"text": item["prompt"], "files": [str(EXAMPLES_DIR / item["file"])]}, 128, 0.0, 1.0, 0]
            for item in listed]


def local_config(engine: Engine):
    """The model's transformers config, or None when it cannot be read here (a remote server's
    served model name); the Tiling and Deepstack tabs need it."""
    try:
        return model_config(engine)
    except (G4VError, OSError, ValueError):
        return None


def build_app(engine: Engine, model: str, concurrency: int = 1, adapters_dir=None) -> gr.Blocks:
    config = local_config(engine)
    with gr.Blocks(title="Granite 4 Vision workbench") as demo:
        gr.Markdown("# Granite 4 Vision workbench")
        gr.Markdown(banner(model), elem_id="model-banner")
        last_chat_image = gr.State(None)  # the newest image sent in Chat, for the inspection tabs

        with gr.Tab("Chat", id="chat"):
            max_new_tokens = gr.Slider(1, MAX_NEW_TOKENS_LIMIT, value=128, step=1, label="Max new tokens", render=False)
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)", render=False)
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p", render=False)
            seed = gr.Number(value=0, precision=0, label="Seed (-1 = random)", render=False)
            gr.ChatInterface(
                make_chat_fn(engine),
                multimodal=True,
                textbox=gr.MultimodalTextbox(
                    file_types=["image"], file_count="multiple", placeholder="Ask about an image...",
                    sources=["upload"],
                ),
                additional_inputs=[max_new_tokens, temperature, top_p, seed],
                additional_inputs_accordion="Sampling",
                additional_outputs=[last_chat_image],
                examples=example_messages(),
                cache_examples=False,
                concurrency_limit=concurrency,
                api_name="chat",
            )

        with gr.Tab("Tiling", id="tiling"):
            gr.Markdown("Which anyres grid the model picks, how the image is resized and padded, and "
                        "which pixels each image token covers.")
            with gr.Row():
                tiling_image = gr.Image(type="filepath", label="Image", sources=["upload"], height=320)
                with gr.Column():
                    tiling_from_chat = gr.Button("Use the last chat image", elem_id="tiling-from-chat")
                    tiling_table = gr.Dataframe(headers=["part", "layout", "tokens"], label="Token budget",
                                                interactive=False)
            tiling_overlay = gr.Image(label="Grid, tiles, padding and unpadded region", interactive=False, format="png",
                                      elem_id="tiling-overlay")
            with gr.Row():
                token_view = gr.Image(label="Selected token (click a spot to pick its token)", interactive=False,
                                      format="png")
                with gr.Column():
                    token_index = gr.Number(label="Token index", precision=0, value=0)
                    token_info = gr.Markdown()
            tiling_plan = gr.State(None)

            analyse, select_index, select_click = make_tiling_fns(config)
            tiling_outputs = [tiling_overlay, tiling_table, tiling_plan, token_index, token_view, token_info]
            tiling_image.upload(analyse, tiling_image, tiling_outputs, api_name="tiling")
            tiling_from_chat.click(lambda path: path, last_chat_image, tiling_image, api_visibility="private").then(
                analyse, tiling_image, tiling_outputs, api_visibility="private")
            token_index.submit(select_index, [tiling_image, tiling_plan, token_index], [token_view, token_info],
                               api_name="tiling_token")
            token_view.select(select_click, [tiling_image, tiling_plan], [token_index, token_view, token_info],
                              api_visibility="private")

        with gr.Tab("Deepstack", id="deepstack"):
            gr.Markdown("What each of the 8 injections carries into the language model, where, and what "
                        "changes when a level is zeroed or scaled.")
            level_names = [level.name for level in describe_levels(config)] if config is not None else []
            with gr.Row():
                inspect_image = gr.Image(type="filepath", label="Image", sources=["upload"], height=240)
                with gr.Column():
                    inspect_from_chat = gr.Button("Use the last chat image", elem_id="deepstack-from-chat")
                    inspect_prompt = gr.Textbox(label="Prompt", value="What colour is the shape?")
                    inspect_ablate = gr.CheckboxGroup(level_names, label="Ablate (zero) these levels")
                    inspect_scales = gr.Textbox(label="Scale levels", placeholder="e.g. deepstack0=0.5, spatial_TL=2")
                    inspect_full = gr.Checkbox(label="Keep full tensors in the export")
                    inspect_run = gr.Button("Inspect", variant="primary", elem_id="deepstack-run")
            inspect_table = gr.Dataframe(headers=LEVEL_COLUMNS, label="Levels", interactive=False)
            inspect_report = gr.Markdown()
            with gr.Row():
                inspect_norms = gr.Image(label="Injected vs residual norms", format="png", elem_id="deepstack-norms")
                inspect_trajectory = gr.Image(label="Residual norm through the layers", format="png")
            inspect_heat_tiles = gr.Image(label="Injected norm over the image (tiles)", format="png")
            inspect_heat_base = gr.Image(label="Injected norm over the image (base view)", format="png")
            inspect_export = gr.File(label="Export (summary.json, PNGs, capture.safetensors)")

            inspect_from_chat.click(lambda path: path, last_chat_image, inspect_image, api_visibility="private")
            inspect_run.click(
                make_inspect_fn(engine),
                [inspect_image, inspect_prompt, inspect_ablate, inspect_scales, inspect_full],
                [inspect_table, inspect_norms, inspect_trajectory, inspect_heat_tiles, inspect_heat_base,
                 inspect_report, inspect_export],
                api_name="inspect",
            )

        with gr.Tab("vLLM port", id="port"):
            gr.Markdown("Where vLLM's port of Granite 4 Vision departs from transformers: per injection level, "
                        "per layer, per config field. Runs in the vLLM environment "
                        f"({'found' if vllm_python() else 'not found: run scripts/setup_vllm_cpu_env.sh'}); "
                        "about a minute on a CPU.")
            with gr.Row():
                port_image = gr.Image(type="filepath", label="Image", sources=["upload"], height=200)
                with gr.Column():
                    port_from_chat = gr.Button("Use the last chat image", elem_id="port-from-chat")
                    port_prompt = gr.Textbox(label="Prompt", value="What colour is the shape?")
                    port_run = gr.Button("Compare", variant="primary")
            port_verdict = gr.Markdown()
            port_table = gr.Dataframe(headers=PORT_COLUMNS, label="Levels", interactive=False)
            port_picture = gr.Image(label="Per-token differences and trajectories", format="png")
            port_json = gr.JSON(label="Everything (trajectory, next token, config audit)")
            port_from_chat.click(lambda path: path, last_chat_image, port_image, api_visibility="private")
            port_run.click(make_port_fn(model), [port_image, port_prompt],
                           [port_verdict, port_table, port_picture, port_json], api_name="port_diff")

        with gr.Tab("LoRA", id="lora"):
            gr.Markdown("Base model and adapter answers side by side, and where they differ token by token. "
                        + adapter_folder_help(adapters_dir))
            with gr.Row():
                choices = adapter_choices(adapters_dir)
                lora_adapter = gr.Dropdown(choices, value=choices[0] if choices else None, label="Adapter",
                                           allow_custom_value=True)
                lora_image = gr.Image(type="filepath", label="Image (optional)", sources=["upload"], height=200)
                with gr.Column():
                    lora_from_chat = gr.Button("Use the last chat image", elem_id="lora-from-chat")
                    lora_max_new_tokens = gr.Slider(1, 256, value=48, step=1, label="Max new tokens")
                    lora_temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                    lora_seed = gr.Number(value=0, precision=0, label="Seed")
            lora_prompt = gr.Textbox(label="Prompt", value="What colour is the shape?")
            with gr.Row():
                lora_run = gr.Button("Run side by side", variant="primary")
                lora_diff_run = gr.Button("Token-level difference")
                lora_stop = gr.Button("Stop")
            with gr.Row():
                base_answer = gr.Textbox(label="Base model", lines=4, interactive=False)
                adapter_answer = gr.Textbox(label="With adapter", lines=4, interactive=False)
            lora_diff_html = gr.HTML()
            lora_diff_plot = gr.Plot(label="Log-probabilities and KL per token")
            lora_diff_json = gr.JSON(label="Numbers", visible=False)

            side_by_side, token_diff = make_lora_fns(engine, adapters_dir)
            lora_from_chat.click(lambda path: path, last_chat_image, lora_image, api_visibility="private")
            running = lora_run.click(
                side_by_side,
                [lora_adapter, lora_image, lora_prompt, lora_max_new_tokens, lora_temperature, lora_seed],
                [base_answer, adapter_answer], api_name="lora_side_by_side",
            )
            lora_stop.click(None, cancels=[running], api_visibility="private")
            lora_diff_run.click(
                token_diff, [lora_adapter, lora_image, lora_prompt, lora_max_new_tokens],
                [lora_diff_html, lora_diff_plot, lora_diff_json], api_name="lora_diff",
            )
    return demo


#: Handlers that run the model. ChatInterface registers its own (``_stream_fn``) and takes no
#: concurrency_id, so the shared group is set after the layout is built.
MODEL_HANDLERS = {"_stream_fn", "_submit_fn", "side_by_side", "token_diff", "inspect"}


def share_model_queue(demo: gr.Blocks, limit: int) -> None:
    """Put every model-bound event in one concurrency group: at most ``limit`` run at once, across
    tabs, and the rest wait their turn in the (bounded) queue."""
    for block_fn in demo.fns.values():
        if block_fn.name in MODEL_HANDLERS:
            block_fn.concurrency_id = "model"
            block_fn.concurrency_limit = limit


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        engine = create_engine(args.backend, args.model, **engine_options(args))
    except G4VError as err:
        raise SystemExit(f"error: {err}") from None
    demo = build_app(engine, args.model, args.concurrency, adapters_dir=args.adapters_dir)
    share_model_queue(demo, args.concurrency)
    demo.queue(max_size=args.max_queue, default_concurrency_limit=args.concurrency)
    demo.launch(
        server_name=args.host,
        server_port=args.port,
        share=False,
        allowed_paths=[str(ASSETS_DIR)],
        show_error=True,
    )


if __name__ == "__main__":
    main()
