"""Opening user images safely: one-line errors for bad files, one RGB picture for good ones.

Everything that reaches a model goes through :func:`open_image`, so the CLI, the app and the API
refuse the same things with the same words.
"""

import io
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from g4v.errors import G4VError, first_line
from g4v.settings.limits import limits


def open_image(source, name: str | None = None, max_pixels: int | None = None, fit=None) -> Image.Image:
    """Open a path, bytes or PIL image and return it as an upright 8-bit RGB picture.

    Raises :class:`G4VError` naming the problem: missing file, not an image, corrupt or truncated
    data, or more pixels than ``max_pixels`` (default ``limits().max_image_pixels``: decompression
    bombs; checked from the header, before decoding).
    ``fit(width, height) -> (width, height)``: the size to keep, when smaller the picture is reduced
    to it (bicubic) as soon as it is decoded, so only one full-size copy is ever held (a JPEG is
    decoded at a fraction of its size already, from its header's scale).
    """
    max_pixels = limits().max_image_pixels if max_pixels is None else max_pixels
    if isinstance(source, Image.Image):
        label = name or "image"
        image = source
    elif isinstance(source, (bytes, bytearray)):
        label = name or "image"
        image = _identify(io.BytesIO(source), label)
    else:
        path = Path(source)
        label = name or path.name  # the file's name only: an app's upload path is the server's business
        if not path.exists():
            raise G4VError(f"image not found: {label}")
        if not path.is_file():
            raise G4VError(f"not a file: {label}")
        image = _identify(path, label)

    width, height = image.size
    if width < 1 or height < 1:
        raise G4VError(f"{label} has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise G4VError(
            f"{label} is too large: {width}x{height} = {width * height:,} pixels (the limit is {max_pixels:,})"
        )
    try:
        upright = (height, width) if image.getexif().get(ExifTags.Base.Orientation) in (5, 6, 7, 8) else (width, height)
        kept = tuple(fit(*upright)) if fit is not None else upright
        if kept != upright and getattr(image, "format", None) == "JPEG":
            image.draft("RGB", (max(kept), max(kept)))  # a scale of 1/2, 1/4 or 1/8 keeping at least that, either way up
        image.load()
        image = to_rgb(ImageOps.exif_transpose(image))
    except (OSError, SyntaxError, ValueError) as err:
        raise G4VError(f"{label} is corrupt or truncated") from None  # the decoder's own words are its business
    return image if image.size == kept else image.resize(kept, Image.Resampling.BICUBIC)


def _identify(fp, label: str) -> Image.Image:
    try:
        return Image.open(fp)
    except UnidentifiedImageError:
        raise G4VError(f"{label} is not an image (unrecognised format)") from None
    except Image.DecompressionBombError as err:
        raise G4VError(f"{label} is too large ({first_line(err)})") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise G4VError(f"{label} is corrupt or unreadable ({first_line(err)})") from None


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB: 16-bit and float greys are rescaled, transparency is flattened onto white."""
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") else max(float(values.max()), 1.0)
        grey = np.clip(values / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(grey, mode="L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode != "RGB":
        return image.convert("RGB")
    return image


def named_size(width: int, height: int) -> dict:
    """A size for JSON with its sides named, ``{"width": W, "height": H}`` (``image_size`` in the
    tiling, inspect, attribution and port-diff JSON): a bare pair was [height, width] there, as in
    transformers' ``image_sizes``, while every text says width x height; names cannot be misread."""
    return {"width": int(width), "height": int(height)}
