"""What the circuits views write: the result as JSON and its pictures as PNG, into one folder (the
command's ``--out``, or a visitor's export folder in the app), so both fronts write the same files.
The JSON is the typed result's ``to_dict()`` (the one place its plain form is made); the pictures are
drawn from the typed result itself."""

import json
from pathlib import Path

from PIL import Image

#: view -> file name -> what it shows.
FILES = {
    "attention": {"attention.json": "the result", "image_share.png": "share by layer",
                  "attention_tiles.png": "tile-token maps", "attention_base.png": "base-view maps"},
    "reverse": {"reverse.json": "the result", "reverse.png": "the region and the text tokens reading it"},
    "knockout": {"knockout.json": "the result"},
    "patch": {"patching.json": "the result", "patching.png": "log-odds per level, one panel per direction"},
}


def draw(view: str, image: Image.Image, result) -> dict[str, Image.Image]:
    """The view's pictures of ``result`` (the view's typed result) by file name (keys of
    :data:`FILES` ending in ``.png``)."""
    from viz.circuits import attention_map_figure, image_share_figure, patching_figure, region_attention_figure

    if view == "attention":
        return {"image_share.png": image_share_figure(result),
                "attention_tiles.png": attention_map_figure(image, result, "tile"),
                "attention_base.png": attention_map_figure(image, result, "base")}
    if view == "reverse":
        return {"reverse.png": region_attention_figure(image, result)}
    if view == "patch":
        return {"patching.png": patching_figure(result)}
    return {}


def write_view(folder: Path, view: str, result, pictures: dict[str, Image.Image]) -> list[Path]:
    """Write ``result.to_dict()`` (the view's JSON file) and ``pictures`` into ``folder``; the paths
    written, in :data:`FILES` order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in FILES[view]:
        path = folder / name
        if name.endswith(".json"):
            path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        else:
            pictures[name].save(path)
        paths.append(path)
    return paths
