"""The panel registry (``g4v.commands.panels.PANELS``) against what the fronts really have: the page's
tabs in order, the API endpoints each tab serves, the command line's commands, each panel's docs page
and modules. A panel left out of the registry, or one whose entry says what its front does not do,
fails here."""

import re

import gradio as gr
import pytest

from g4v.cli import build_parser
from g4v.commands.panels import OTHER_COMMANDS, PANELS
from g4v.engines import create_engine
from g4v.paths import BUNDLED_MODEL_DIR, REPO_ROOT


@pytest.fixture(scope="module")
def page():
    """The page on the bundled checkpoint, its model not loaded (the page is built from the folder)."""
    from webapp.layout import build_app

    return build_app(create_engine("hf", str(BUNDLED_MODEL_DIR), defer=True, device="cpu", dtype="float32"),
                     str(BUNDLED_MODEL_DIR))


def tab_of(block) -> str | None:
    """The id of the page's tab holding ``block`` (the outermost: the Circuits tab holds tabs of its own)."""
    outermost = None
    while block is not None:
        if isinstance(block, gr.Tab):
            outermost = block
        block = block.parent
    return outermost.id if outermost else None


def test_the_page_has_one_tab_per_panel_in_the_registrys_order(page):
    tabs = [block for block in page.blocks.values() if isinstance(block, gr.Tab) and tab_of(block.parent) is None]
    assert [(tab.label, tab.id) for tab in tabs] == [(panel.tab, panel.id) for panel in PANELS]


def test_each_panels_endpoints_are_served_by_its_own_tab(page):
    """Every public API endpoint is one panel's, and is wired to a component inside that panel's tab."""
    served = {}
    for function in page.fns.values():
        if function.api_name and function.api_visibility == "public":
            served[function.api_name] = {tab_of(page.blocks[target]) for target, _ in function.targets}
    assert served == {endpoint: {panel.id} for panel in PANELS for endpoint in panel.endpoints}


def test_each_panels_commands_are_the_command_lines_in_the_registrys_order():
    [commands] = [action for action in build_parser()._actions if action.dest == "command"]
    assert list(commands.choices) == [name for panel in PANELS for name in panel.commands] + list(OTHER_COMMANDS)


@pytest.mark.parametrize("panel", PANELS, ids=[panel.id for panel in PANELS])
def test_each_panel_has_its_modules_and_a_docs_page_the_index_links(panel):
    assert (REPO_ROOT / "webapp" / f"{panel.id}.py").is_file()
    for command in panel.commands:
        assert (REPO_ROOT / "g4v" / "commands" / f"{command.replace('-', '_')}.py").is_file()
    if panel.package:
        package = REPO_ROOT / panel.package.replace(".", "/")
        assert package.is_dir() or package.with_suffix(".py").is_file()
    assert (REPO_ROOT / "docs" / panel.docs).is_file()
    assert re.search(rf"\]\({re.escape(panel.docs)}\)", (REPO_ROOT / "docs" / "README.md").read_text())


def test_every_export_box_is_for_downloading_only(page):
    """A panel's export box only offers its files: left to Gradio's default, a file box that events
    write to showed a × by each file, which took a result out of the box."""
    exports = [block for block in page.blocks.values()
               if isinstance(block, gr.File) and str(block.label or "").startswith("Export")]
    assert len(exports) >= 7 and all(block.interactive is False for block in exports), \
        [(block.label, block.interactive) for block in exports]
