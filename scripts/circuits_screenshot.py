"""Take the README's picture of the Circuits tab: the app on the trained demo checkpoint, the
attention view for "What shape is green?" on the bundled shapes-wide example, in headless Chromium.

    .venv/bin/python scripts/circuits_screenshot.py [--out docs/images/circuits_tab.png]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g4v.paths import EXAMPLES_DIR, TRAINED_MODEL_DIR  # noqa: E402
from tests.browser import browser_page  # noqa: E402
from tests.conftest import running_app  # noqa: E402

LOADED = "(s) => { const i = document.querySelector(s + ' img'); return !!i && i.complete && i.naturalWidth > 0 }"


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
        page.evaluate("window.scrollTo(0, 0)")  # bounding boxes are measured in the viewport
        top = page.locator("#circuits-image").bounding_box()["y"] - 20
        bottom = page.locator("#circuits-share").bounding_box()
        page.screenshot(path=args.out, full_page=True,
                        clip={"x": 0, "y": top, "width": 1100, "height": bottom["y"] + bottom["height"] + 10 - top})
    from PIL import Image

    Image.open(args.out).convert("RGB").quantize(256).save(args.out, optimize=True)  # a page shot needs few colours
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
