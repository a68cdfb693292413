"""The workbench's panels, written once: each one's tab, commands, API endpoints and docs page.

The page builds one tab per entry, in this order (``webapp/layout.py`` holds only how each tab is
built, by its id); ``python -m g4v --help`` lists the commands in the same order; the tests walk the
entries (the page's tabs and endpoints, the command line, the docs). A new panel is one entry here,
its tab builder in ``webapp/layout.py``, and its own modules (docs/architecture.md, "Where a new
panel goes").

The list lives with the command line because the CLI needs the names and builds without Gradio:
``webapp`` may import ``g4v``, never the other way. Plain strings only, so nothing heavy loads.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Panel:
    """One panel as every front names it."""

    #: The tab's id: the prefix of its elements' ids (``#deepstack-image``), and its tab module,
    #: ``webapp/<id>.py`` (with any ``webapp/<id>_*.py`` beside it).
    id: str
    #: The tab's title, what a visitor clicks.
    tab: str
    #: Its work in the library (a package or module of ``g4v``); None for Chat, whose work is the
    #: base layer's (``g4v.conversation`` and the engines).
    package: str | None
    #: Its commands, as typed (``python -m g4v lora-diff``); each one's module is
    #: ``g4v/commands/<name with _ for ->.py``.
    commands: tuple[str, ...]
    #: Its API endpoints (``/inspect``), which are also its MCP tools.
    endpoints: tuple[str, ...]
    #: Its page in ``docs/``.
    docs: str


PANELS = (
    Panel("chat", "Chat", None, ("chat",), ("chat",), "chat.md"),
    Panel("tiling", "Tiling", "g4v.tiling", ("tiling",), ("tiling", "tiling_token"), "tiling.md"),
    Panel("deepstack", "Deepstack", "g4v.inspect", ("inspect",), ("inspect",), "deepstack.md"),
    Panel("attribution", "Attribution", "g4v.attribution", ("attribute",), ("attribute",), "attribution.md"),
    Panel("circuits", "Circuits", "g4v.circuits", ("circuits",),
          ("circuits_attention", "circuits_reverse", "circuits_knockout", "circuits_patch"), "circuits.md"),
    Panel("port", "vLLM port", "g4v.port", ("port-diff",), ("port_diff",), "port_diff.md"),
    Panel("lora", "LoRA", "g4v.lora", ("lora-diff", "merge-lora"), ("lora_side_by_side", "lora_diff"), "lora.md"),
    Panel("evaluate", "Evaluate", "g4v.evaluate", ("eval",), ("evaluate", "evaluate_budget"), "evaluate.md"),
    Panel("training", "Training", "g4v.training", ("training",), ("training", "training_steps"), "training.md"),
)

#: Commands of no one panel, listed after the panels' own: weights in another dtype against float32
#: (levels and datasets), and the benchmarks of several panels.
OTHER_COMMANDS = ("precision", "bench")


def command_modules() -> list[str]:
    """Every command's module name under ``g4v.commands``, in the order ``--help`` lists them."""
    return [name.replace("-", "_") for panel in PANELS for name in panel.commands] + list(OTHER_COMMANDS)
