"""Take the picture of the Circuits tab (README.md, docs/circuits.md): the app on the trained demo checkpoint, the
attention view for "What shape is green?" on the bundled shapes-wide example, in headless Chromium.

    .venv/bin/python scripts/circuits_screenshot.py [--out docs/images/circuits_tab.png]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g4v.paths import EXAMPLES_DIR, TRAINED_MODEL_DIR  # noqa: E402
from tests.browser import PICTURE_LOADED as LOADED, browser_page, save_section  # noqa: E402
from tests.conftest import running_app  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/images/circuits_tab.png")
    args = parser.parse_args()
    with running_app("--model", str(TRAINED_MODEL_DIR)) as url, browser_page(width=1100, height=900) as page:
        page.goto(url)
        page.get_by_role("tab", name="Circuits").click()
        page.locator("#circuits-image input[type=file]").set_input_files(str(EXAMPLES_DIR / "shapes-wide.png"))
        page.wait_for_function(LOADED, arg="#circuits-image")
        page.locator("#circuits-prompt textarea").fill("What shape is green?")
        page.locator("#circuits-attention-run").click()
        for element in ("#circuits-share", "#circuits-tiles"):
            page.wait_for_function(LOADED, arg=element, timeout=300_000)
        save_section(page, args.out, "#circuits-image", "#circuits-share", width=1100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
