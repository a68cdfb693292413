"""g4v: the Granite 4 Vision workbench in the browser (also the Hugging Face Spaces entry point).

    python app.py [--model M] [--backend auto|hf|vllm|openai] [--host 127.0.0.1] [--port 7860] [--mcp]

Arguments, engine, page, launch. The page is built tab by tab in :mod:`webapp`; the work happens
in plain functions of the :mod:`g4v` package.
"""

import argparse
import os
import signal
import time
from dataclasses import dataclass, field

# Before Gradio is imported: no telemetry, and a cache folder of this app's own. Gradio serves any
# file inside its cache folder, so a shared one (/tmp/gradio) would serve other programs' files.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
if "GRADIO_TEMP_DIR" not in os.environ:  # inside the app's own folder, deleted at exit (webapp.tempdirs)
    from webapp.tempdirs import own_folder

    os.environ["GRADIO_TEMP_DIR"] = str(own_folder("gradio"))
else:  # a cache folder the caller chose: what this run adds to it still goes at exit
    from pathlib import Path

    from webapp.tempdirs import remove_new_entries_at_exit

    remove_new_entries_at_exit(Path(os.environ["GRADIO_TEMP_DIR"]))

from g4v.commands.engine_flags import add_engine_flags, engine_options  # noqa: E402
from g4v.engines import BACKENDS, create_engine  # noqa: E402
from g4v.engines.capabilities import Instrumentable  # noqa: E402
from g4v.errors import G4VError, first_line  # noqa: E402
from g4v.paths import EXAMPLES_DIR, default_model  # noqa: E402
from g4v.settings.flags import add_settings_flags, environment_values, settings_from_args  # noqa: E402
from g4v.settings.limits import limits  # noqa: E402
from webapp.layout import WORKBENCH_CSS, build_app, workbench_theme  # noqa: E402
from webapp.mcp import use_workbench_mcp_server  # noqa: E402

try:  # Hugging Face ZeroGPU: GPU work must run inside functions decorated with spaces.GPU.
    import spaces

    gpu_task = spaces.GPU
    zero_gpu = True
except ImportError:  # anywhere else the decorator is a no-op
    zero_gpu = False

    def gpu_task(fn=None, **_):
        return fn if fn is not None else (lambda f: f)


#: How ``G4V_MCP`` (or Gradio's own ``GRADIO_MCP_SERVER``) turns the MCP server on or leaves it off.
SWITCH_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False,
                "": False}


def read_switch(text: str) -> bool:
    """``G4V_MCP``'s value as a switch (:data:`SWITCH_WORDS`), or the line that says it is none."""
    word = text.strip().lower()
    if word not in SWITCH_WORDS:
        raise ValueError(f"must be 1 or 0 (true or false), not {word[:40]!r}")
    return SWITCH_WORDS[word]


@dataclass(frozen=True)
class AppSettings:
    """The app's settings, each default written once: its flags and the environment variables that
    change their defaults derive from these fields (:mod:`g4v.settings.flags`). The environment is
    read when the arguments are (:func:`parse_args`), never at import; a bad value is one line."""

    model: str = field(default_factory=default_model, metadata={"help": "model folder or hub id ($G4V_MODEL)"})
    backend: str = field(default="auto", metadata={"env": "G4V_BACKEND", "choices": BACKENDS})
    device: str = field(default="auto", metadata={"env": "G4V_DEVICE"})
    dtype: str = field(default="auto", metadata={"env": "G4V_DTYPE"})
    # Loopback unless told otherwise; Spaces tells us through GRADIO_SERVER_NAME (and its port).
    host: str = field(default="127.0.0.1", metadata={"env": ("G4V_HOST", "GRADIO_SERVER_NAME"),
                                                     "help": "bind address (default 127.0.0.1)"})
    port: int = field(default=7860, metadata={"env": ("G4V_PORT", "GRADIO_SERVER_PORT")})
    concurrency: int = field(default=1, metadata={
        "env": "G4V_CONCURRENCY", "help": "requests run on the model at once; the rest wait in the queue"})
    max_queue: int = field(default=32, metadata={"env": "G4V_MAX_QUEUE"})
    adapters_dir: str | None = field(default=None, metadata={
        "env": "G4V_ADAPTERS_DIR", "help": "folder(s) LoRA adapters may be loaded from (default: assets/adapters)"})
    data_dirs: list[str] = field(default_factory=list, metadata={
        "flag": "--data-dir", "repeat": True, "env": "G4V_DATA_DIRS",
        "from_env": lambda text: [folder for folder in text.split(os.pathsep) if folder],
        "help": "folder the Evaluate tab lists datasets from, repeatable (the variable's separated by ':'); "
                "the bundled dataset and uploads are always offered"})
    runs_dir: str | None = field(default=None, metadata={
        "env": "G4V_RUNS_DIR", "help": "folder(s) the Training tab reads training runs from (default: assets)"})
    eval_servers: list[str] = field(default_factory=list, metadata={
        "flag": "--eval-server", "repeat": True, "env": "G4V_EVAL_SERVERS", "from_env": str.split,
        "help": "an OpenAI-compatible server the Evaluate tab offers as an arm, as URL[,model=NAME], repeatable "
                "(the variable's separated by spaces); visitors cannot type URLs"})
    # Off unless asked for: the MCP server offers the page's API endpoints (webapp.mcp) to agents.
    mcp: bool = field(default=False, metadata={
        "env": ("G4V_MCP", "GRADIO_MCP_SERVER"), "from_env": read_switch,
        "help": "also serve the API endpoints as an MCP server for agents, at /gradio_api/mcp/ (1 or 0; default off)"})


def parse_args(argv=None) -> argparse.Namespace:
    """The app's flags (:class:`AppSettings`' fields, starting at the environment's values) and the
    engines' (:func:`~g4v.commands.engine_flags.add_engine_flags`)."""
    parser = argparse.ArgumentParser(description="Granite 4 Vision workbench")
    try:
        from_environment = environment_values(AppSettings)
    except G4VError as err:  # G4V_PORT=abc, G4V_MCP=maybe: one line, as a bad flag's
        parser.error(str(err))
    add_settings_flags(parser, AppSettings, defaults=from_environment)
    add_engine_flags(parser)  # --base-url/--api-key (openai) and vLLM's own settings (vllm)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    settings = settings_from_args(AppSettings, args)
    try:
        limits()  # read now, so a bad G4V_MAX_* is one line at start, not a failed request later
        # The transformers engine is checked and described now and loaded once the page is served
        # (g4v.engines.deferred): start-up is then the page's, not the model's. Not on ZeroGPU,
        # whose GPU calls run in processes forked from this one: none may fork mid-load.
        # On ZeroGPU each request's decode runs inside its own GPU call (inline), one at a time.
        engine = create_engine(settings.backend, settings.model, defer=not zero_gpu, inline=zero_gpu, **engine_options(args))
        demo = build_app(engine, settings.model, settings.concurrency, adapters_dir=settings.adapters_dir,
                         gpu_task=gpu_task, data_dirs=settings.data_dirs,
                         eval_servers=settings.eval_servers,  # a bad --eval-server: one line
                         runs_dir=settings.runs_dir)
        if settings.mcp:
            use_workbench_mcp_server()  # Gradio prints the MCP server's address at launch
    except G4VError as err:
        raise SystemExit(f"error: {err}") from None
    if zero_gpu and engine.supports(Instrumentable):  # the decode step compiled ahead of time (g4v.engines.aot)
        from g4v.engines.aot import compile_on_zero_gpu

        print(f"* {compile_on_zero_gpu(engine.capable(Instrumentable), spaces)}", flush=True)
    # SIGTERM (a supervisor's stop) is handled like Ctrl-C: Gradio then closes its server, which
    # deletes its cached files (delete_cache), and normal exit deletes the Deepstack exports.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    demo.queue(max_size=settings.max_queue, default_concurrency_limit=settings.concurrency)
    try:
        demo.launch(
            server_name=settings.host,
            server_port=settings.port,
            share=False,
            theme=workbench_theme(),
            css=WORKBENCH_CSS,
            allowed_paths=[str(EXAMPLES_DIR)],  # the example pictures; never the weights or the code
            max_file_size=limits().max_upload_size,
            show_error=True,
            quiet=True,  # Gradio's own lines suggest share=True: this app never makes a share link
            prevent_thread_lock=True,
            mcp_server=settings.mcp,  # never Gradio's GRADIO_MCP_SERVER behind the flag's back (parse_args reads it)
        )
    except OSError as err:  # Gradio's words name its launch(), and a traceback came with them
        demo.close()
        engine.close()
        if "Cannot find empty port" in str(err):  # Gradio's words when it could not bind the port
            raise SystemExit(f"error: cannot serve on {settings.host} port {settings.port} (in use, or not this "
                             "machine's): choose another with --port or G4V_PORT") from None
        raise SystemExit(f"error: could not start the server: {first_line(err)}") from None
    if settings.mcp and not demo.mcp_server:  # Gradio keeps serving the page without it; asked for, it is missing
        demo.close()
        raise SystemExit(f"error: {demo.mcp_error}")
    deferred = not engine.is_loaded
    # One write for both lines, so whoever reads the address knows whether a load follows.
    print(f"* Running on local URL: {demo.local_url} (never a share link; see docs/app.md, App settings)"
          + ("\n* Loading the model; the page is up, and a request sent meanwhile waits for it" if deferred else ""),
          flush=True)
    if deferred:  # a request sent meanwhile waits for this one load
        started = time.monotonic()
        try:
            engine.load()
        except KeyboardInterrupt:
            demo.close()
            raise SystemExit(130) from None
        except Exception:  # bad weights, out of memory: the engine's one line, and the server goes with it
            demo.close()
            raise SystemExit(f"error: {engine.error}") from None
        print(f"* Model loaded in {time.monotonic() - started:.1f} s", flush=True)
    demo.block_thread()  # until Ctrl-C or SIGTERM, which close the server


if __name__ == "__main__":
    main()
