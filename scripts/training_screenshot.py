"""Take docs/training.md's picture of the Training tab: the app's default run folders, the trained demo
checkpoint's own training log opened, in headless Chromium.

    .venv/bin/python scripts/training_screenshot.py [--out docs/images/training_tab.png]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g4v.paths import TRAINED_MODEL_DIR  # noqa: E402
from tests.browser import PICTURE_LOADED as LOADED, browser_page, save_section  # noqa: E402
from tests.conftest import running_app  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/images/training_tab.png")
    args = parser.parse_args()
    with running_app("--model", str(TRAINED_MODEL_DIR)) as url, browser_page(width=1100, height=900) as page:
        page.goto(url)
        page.get_by_role("tab", name="Training").click()
        page.locator("#training-open").click()  # the demo's run is the one the tab starts on
        page.wait_for_function(LOADED, arg="#training-curves", timeout=300_000)
        save_section(page, args.out, "#training-run", "#training-curves", width=1100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
