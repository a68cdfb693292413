"""Take a tab's picture for the docs, in headless Chromium, on the app as a user would drive it:

    .venv/bin/python scripts/screenshot.py circuits [--out docs/images/circuits_tab.png]
    .venv/bin/python scripts/screenshot.py training [--out docs/images/training_tab.png]
    .venv/bin/python scripts/screenshot.py evaluate [--rows 24] [--out docs/images/evaluate_tab.png]

* circuits: the trained demo checkpoint, the attention view for "What shape is green?" on the bundled
  shapes-wide example (README.md, docs/circuits.md);
* training: the trained demo checkpoint's own training log opened from the app's default run
  folders (docs/training.md);
* evaluate: the bundled checkpoint, base vs the French adapter on the bundled dataset, the browser
  test's own steps, one row selected (docs/evaluate.md).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g4v.paths import EXAMPLES_DIR, TRAINED_MODEL_DIR  # noqa: E402
from tests.browser import PICTURE_LOADED as LOADED, browser_page, save_section  # noqa: E402
from tests.conftest import running_app  # noqa: E402


def circuits(page, url: str, args) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Circuits").click()
    page.locator("#circuits-image input[type=file]").set_input_files(str(EXAMPLES_DIR / "shapes-wide.png"))
    page.wait_for_function(LOADED, arg="#circuits-image")
    page.locator("#circuits-prompt textarea").fill("What shape is green?")
    page.locator("#circuits-attention-run").click()
    for element in ("#circuits-share", "#circuits-tiles"):
        page.wait_for_function(LOADED, arg=element, timeout=300_000)
    save_section(page, args.out, "#circuits-image", "#circuits-share", width=1100)


def training(page, url: str, args) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Training").click()
    page.locator("#training-open").click()  # the demo's run is the one the tab starts on
    page.wait_for_function(LOADED, arg="#training-curves", timeout=300_000)
    save_section(page, args.out, "#training-run", "#training-curves", width=1100)


def evaluate(page, url: str, args) -> None:
    from tests.test_evaluate_app import run_in_browser

    run_in_browser(page, url, args.rows)
    page.locator("#eval-samples [data-testid=cell-0-3]").click()  # a selected row, as a user would have
    save_section(page, args.out, "#eval-arm-a", "#eval-picked", width=1280, above=60)


#: tab -> (how to take it, the app's flags, the page's width)
TABS = {"circuits": (circuits, ("--model", str(TRAINED_MODEL_DIR)), 1100),
        "training": (training, ("--model", str(TRAINED_MODEL_DIR)), 1100),
        "evaluate": (evaluate, (), 1280)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tab", choices=list(TABS))
    parser.add_argument("--out", help="the picture (default: docs/images/<tab>_tab.png)")
    parser.add_argument("--rows", type=int, default=24, help="evaluate: dataset rows run")
    args = parser.parse_args()
    args.out = args.out or f"docs/images/{args.tab}_tab.png"
    take, flags, width = TABS[args.tab]
    with running_app(*flags) as url, browser_page(width=width, height=900) as page:
        take(page, url, args)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
