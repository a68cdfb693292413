"""Datasets for dataset runs: rows of picture(s), prompt, optional reference answer and category.

Hugging Face ``datasets`` does the loading, so every format it reads works the same way:

* a folder with ``metadata.jsonl`` or ``metadata.csv`` (the ``imagefolder`` layout: a
  ``file_name`` column of picture paths relative to the folder);
* a ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file whose image column holds paths relative
  to the file (or a list of them, for several pictures per row);
* a folder written by ``Dataset.save_to_disk`` (an ``Image`` column, or paths);
* a Hub dataset id, where the network allows.

Two kinds of problem are told apart. A bad *dataset* or *column mapping* (missing file, unknown
column, no rows, a broken JSON line) stops the run with one line before any model loads. A bad
*row* (a missing or unreadable picture, an empty prompt, too many pictures) is recorded on that
row (:attr:`EvalSample.error`) and the run goes on.

Paths are the user's input: with ``data_dirs`` (the app) the dataset must lie inside one of them,
links resolved, and every picture path inside the dataset's own folder. Whatever the mode, a
picture path that is a URL (``hf://``, ``http://``, an fsspec chain with ``::``) is refused on its
row, and ``datasets`` never opens a picture itself (:mod:`g4v.evaluate.readers` reads every table
with its pictures undecoded), so nothing is fetched and the folder rule is the only way in.
"""

import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from PIL import Image

import g4v.evaluate.readers as readers
from g4v.conversation import MAX_IMAGES_PER_MESSAGE, max_text_chars, text_preview
from g4v.errors import G4VError, quoted
from g4v.images import open_image
from g4v.paths import ASSETS_DIR
from g4v.tiling import resized_size, select_best_resolution

#: The bundled example: held-out synthetic pictures with reference answers (``python -m g4v.demo dataset``).
BUNDLED_DATASET = ASSETS_DIR / "datasets" / "shapes-heldout"
#: Metadata files of the imagefolder layout, in the order they are looked for.
METADATA_FILES = ("metadata.jsonl", "metadata.csv")
#: Column names guessed for each role when the mapping does not name one, first match wins.
GUESSES = {
    "image": ("image", "images", "file_name", "image_path", "image_file", "img"),
    "prompt": ("prompt", "question", "text", "query", "instruction"),
    "reference": ("answer", "reference", "label", "answers", "target"),
    "category": ("category", "kind", "type", "question_type"),
    "id": ("id", "sample_id", "question_id"),
}
#: The roles every run needs a column for (the others may be left out).
REQUIRED_ROLES = ("image", "prompt")
#: A picture path naming a URL or an fsspec chain (``hf://x``, ``http://...``, ``zip::...``).
URL_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://|::")
#: A dataset picture with more pixels than this is reduced as it is read (:class:`PictureFit`); one
#: at most this large is kept as it is, so ordinary pictures reach the processor untouched.
REDUCE_ABOVE_PIXELS = 4_000_000


@dataclass(frozen=True)
class PictureFit:
    """The size a dataset picture is kept at once decoded: a picture of over
    :data:`REDUCE_ABOVE_PIXELS` is reduced to the size the model's processor resizes it to anyway
    (LLaVA-NeXT's anyres: fitted into the pinpoint it picks, :func:`g4v.tiling.select_best_resolution`),
    so a row of four 6324 x 6324 pictures holds 4 x 120 MB only one picture at a time. The pinpoints
    of both arms' models are pooled (the larger fit wins); with a model whose config is unknown (a
    remote server's), the picture is scaled down to :data:`REDUCE_ABOVE_PIXELS`."""

    pinpoints: tuple = ()  # (height, width) pairs; empty: the processor is unknown

    @classmethod
    def for_configs(cls, configs) -> "PictureFit":
        pooled = []
        for config in configs:
            found = getattr(config, "image_grid_pinpoints", None)
            if not found:
                return cls()
            pooled += [(int(pin[0]), int(pin[1])) for pin in found]
        return cls(tuple(pooled))

    def __call__(self, width: int, height: int) -> tuple[int, int]:
        """``(width, height)`` to keep a picture of that size at."""
        if width * height <= REDUCE_ABOVE_PIXELS:
            return width, height
        if self.pinpoints:
            kept_height, kept_width = resized_size((height, width), select_best_resolution((height, width), self.pinpoints))
        else:
            scale = (REDUCE_ABOVE_PIXELS / (width * height)) ** 0.5
            kept_width, kept_height = max(1, int(width * scale)), max(1, int(height * scale))
        return (kept_width, kept_height) if kept_width * kept_height < width * height else (width, height)


@dataclass(frozen=True)
class Columns:
    """Which dataset column plays which role; None: guessed from :data:`GUESSES`."""

    image: str | None = None
    prompt: str | None = None
    reference: str | None = None
    category: str | None = None
    id: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> "Columns":
        """``"image=img,prompt=question,reference=answer"`` (the CLI's ``--columns``)."""
        roles = [f.name for f in fields(cls)]
        chosen = {}
        for part in (text or "").split(","):
            if not part.strip():
                continue
            role, sep, column = (piece.strip() for piece in part.partition("="))
            if not sep or not column:
                raise G4VError(f"--columns: expected ROLE=COLUMN, got {quoted(part)}")
            if role not in roles:
                raise G4VError(f"--columns: unknown role {quoted(role)} (expected one of {', '.join(roles)})")
            chosen[role] = column
        return cls(**chosen)


@dataclass
class EvalSample:
    """One row, ready for the engines: its pictures decoded, or the reason it cannot run."""

    index: int  # row number in the dataset
    sample_id: str
    images: list  # PIL images (RGB), 1..MAX_IMAGES_PER_MESSAGE
    prompt: str
    reference: str | None
    category: str | None
    image_paths: list[str] = field(default_factory=list)  # where the pictures came from, when files
    error: str | None = None  # one line, no server path


class EvalDataset:
    """A loaded table and its resolved column mapping; rows are decoded on demand."""

    def __init__(self, source: str, table, columns: Columns, folder: Path | None, confined: bool):
        self.source = source
        self.columns = columns
        self._table = table
        self._folder = folder  # relative picture paths start here
        self._confined = confined  # picture paths must stay inside ``folder``

    def __len__(self) -> int:
        return len(self._table)

    @property
    def column_names(self) -> list[str]:
        return list(self._table.column_names)

    def sample(self, index: int, fit: PictureFit | None = None) -> EvalSample:
        """Row ``index``, its pictures decoded one by one and each reduced by ``fit`` at once;
        never raises for a bad row (``error`` says what is wrong)."""
        row = self._table[index]
        cols = self.columns
        sample = EvalSample(
            index=index,
            sample_id=_text(row.get(cols.id)) if cols.id else str(index),
            images=[],
            prompt=_text(row.get(cols.prompt)) or "",
            reference=_text(row.get(cols.reference)) if cols.reference else None,
            category=_text(row.get(cols.category)) if cols.category else None,
        )
        try:
            _bound_texts(sample)
            self._load_images(sample, row.get(cols.image), fit)
            if not sample.prompt.strip():
                raise G4VError("empty prompt")
        except G4VError as err:
            sample.images, sample.error = [], str(err)
        return sample

    def _load_images(self, sample: EvalSample, value, fit: PictureFit | None) -> None:
        entries = value if isinstance(value, list) else [value]
        entries = [entry for entry in entries if entry not in (None, "")]
        if not entries:
            raise G4VError("no image in this row")
        if len(entries) > MAX_IMAGES_PER_MESSAGE:
            raise G4VError(f"{len(entries)} images in one row, at most {MAX_IMAGES_PER_MESSAGE}")
        for entry in entries:
            picture, path = self._open_entry(entry, fit)
            sample.images.append(picture)
            if path:
                sample.image_paths.append(path)

    def _open_entry(self, entry, fit: PictureFit | None) -> tuple[Image.Image, str | None]:
        """A picture from a path, an ``Image`` feature's ``{"bytes", "path"}`` or a PIL image."""
        if isinstance(entry, Image.Image):
            return open_image(entry, fit=fit), None
        if isinstance(entry, dict) and entry.get("bytes"):
            return open_image(entry["bytes"], name=Path(entry.get("path") or "image").name, fit=fit), None
        path = entry.get("path") if isinstance(entry, dict) else entry
        if not isinstance(path, str):
            raise G4VError(f"image column holds {type(entry).__name__}, not a path or a picture")
        real = self._picture_path(path)
        return open_image(str(real), name=Path(path).name, fit=fit), str(real)

    def _picture_path(self, path: str) -> Path:
        """The file ``path`` names: never a URL, inside the dataset's folder when confined."""
        if URL_LIKE.search(path):
            raise G4VError(f"image {quoted(path, 60)} is a URL: only picture files of the dataset are read")
        if "\x00" in path:
            raise G4VError(f"image path {quoted(path, 60)} holds a NUL byte")
        try:
            candidate = Path(path).expanduser()
            if not candidate.is_absolute() and self._folder is not None:
                candidate = self._folder / candidate
            real = candidate.resolve()
            if self._confined and not real.is_relative_to(self._folder.resolve()):
                raise G4VError(f"image {quoted(path, 60)} is outside the dataset's folder")
            found = real.is_file()
        except (OSError, RuntimeError):  # a name too long, a link loop
            raise G4VError(f"image path {quoted(path, 60)} cannot be read") from None
        if not found:
            raise G4VError(f"image not found: {quoted(path, 60)}")
        return real


def open_dataset(source: str, columns: Columns | None = None, data_dirs: list[Path] | None = None,
                 required: tuple[str, ...] = REQUIRED_ROLES) -> EvalDataset:
    """Load ``source`` and resolve the column mapping; a bad dataset raises one line (see module doc).
    ``required``: the roles refused when no column is named or guessed for them (none, to describe
    a dataset whose columns are still to be named)."""
    columns = columns or Columns()
    source = str(source or "").strip()
    if not source:
        raise G4VError("no dataset given")
    path = Path(source).expanduser()
    if data_dirs is not None:
        path = _inside_data_dirs(path, source, data_dirs)
    shown = path.name if data_dirs is not None else source  # the app's sources are server paths
    if path.exists():
        table, folder = _load_local(path, shown)
    elif data_dirs is None and _looks_like_hub_id(source):
        table, folder = readers.read_hub(source), None
    else:
        raise G4VError(f"dataset not found: {quoted(source, 80)}")
    if len(table) == 0:
        raise G4VError(f"dataset {quoted(shown, 80)} has no rows")
    resolved = resolve_columns(list(table.column_names), columns, required)
    return EvalDataset(source, table, resolved, folder, confined=data_dirs is not None)


def resolve_columns(available: list[str], asked: Columns, required: tuple[str, ...] = REQUIRED_ROLES) -> Columns:
    """The mapping with guesses filled in; unknown named columns and a missing column for a
    ``required`` role are refused, naming the columns there are."""
    chosen = {}
    for role in (f.name for f in fields(Columns)):
        named = getattr(asked, role)
        if named is not None and named not in available:
            raise G4VError(f"column {quoted(named)} (for {role}) is not in the dataset; "
                           f"its columns: {', '.join(available[:20])}")
        chosen[role] = named or next((name for name in GUESSES[role] if name in available), None)
    for role in required:
        if chosen[role] is None:
            raise G4VError(f"no {role} column found (columns: {', '.join(available[:20])}); "
                           f"name it with --columns {role}=COLUMN")
    return Columns(**chosen)


def _load_local(path: Path, source: str):
    """``(table, folder pictures are relative to)`` for a local file or folder."""
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            return readers.read_saved(path, source), path
        for name in METADATA_FILES:
            if (path / name).is_file():
                return readers.read_file(path / name, source), path
        raise G4VError(f"{quoted(source, 80)} is not a dataset: no metadata.jsonl or metadata.csv, "
                       "and not a saved dataset")
    builder = readers.FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise G4VError(f"{quoted(source, 80)} is not a dataset file "
                       f"(expected {', '.join(readers.FILE_BUILDERS)} or a folder)")
    return readers.read_file(path, source), path.parent


def _looks_like_hub_id(source: str) -> bool:
    """``owner/name``: two plain parts, nothing that looks like a local path (a data file's
    suffix means a mistyped path, which should be "not found" at once, not a Hub lookup)."""
    parts = source.split("/")
    return (len(parts) == 2 and all(p and not p.startswith(".") for p in parts) and not source.startswith("~")
            and Path(source).suffix.lower() not in readers.FILE_BUILDERS)


def _inside_data_dirs(path: Path, source: str, data_dirs: list[Path]) -> Path:
    """``path`` resolved (relative ones against each data folder), refused outside them."""
    roots = [Path(d).expanduser().resolve() for d in data_dirs]
    candidates = [path] if path.is_absolute() else [root / path for root in roots]
    for candidate in candidates:
        real = candidate.resolve()
        if any(real.is_relative_to(root) for root in roots) and real.exists():
            return real
    if any(candidate.resolve().exists() for candidate in candidates):
        raise G4VError(f"dataset {quoted(source, 80)} is outside the data folders")
    raise G4VError(f"dataset not found: {quoted(source, 80)}")


#: A row's text fields, as :class:`EvalSample` names them.
ROW_TEXTS = ("prompt", "reference", "category", "sample_id")


def _bound_texts(sample: EvalSample) -> None:
    """Refuse a row whose text is longer than any model could read (:func:`max_text_chars`) before a
    tokenizer sees it; the row then keeps only previews of its texts for the tables and exports."""
    limit = max_text_chars()
    too_long = [role for role in ROW_TEXTS if len(getattr(sample, role) or "") > limit]
    if too_long:
        length = len(getattr(sample, too_long[0]))
        for role in ROW_TEXTS:
            if getattr(sample, role) is not None:
                setattr(sample, role, text_preview(getattr(sample, role)))
        raise G4VError(f"the {too_long[0].removeprefix('sample_')} is too long: {length:,} characters "
                       f"(the limit is {limit:,})")


def _text(value) -> str | None:
    """A cell as text (answers lists: the first); None and an empty cell are None."""
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None or value == "" else str(value)
