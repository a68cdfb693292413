"""Datasets sent through the app: a zip of a dataset folder, or a table file with its pictures.

An upload is unpacked into an empty folder the app gives (one per upload, inside its own bounded
store), and only there. A zip is a list of names and sizes written by whoever made it, so every
entry is checked before anything is written: names that climb out (``../``) or start at the root,
links, encrypted entries, names that appear twice, files that are neither pictures nor tables, too
many files, or more bytes than the limits allow once unpacked (:mod:`g4v.settings.limits`) (a zip bomb declares small
compressed sizes; the uncompressed sizes are what count, and no entry is read past the size it
declared). Each refusal is one line naming the entry as the zip names it, never a server path.
Junk that archivers add (``__MACOSX/``, ``.DS_Store``) is skipped silently.

:func:`extract_upload` returns the dataset's source for ``g4v.evaluate.open_dataset``: the folder
of a ``metadata.*`` table (Hugging Face's ``imagefolder`` layout), a saved dataset's folder, or
the one table file.
"""

import shutil
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from g4v.errors import G4VError, quoted
from g4v.settings.limits import limits

#: Picture files a dataset may hold (what ``g4v.images.open_image`` reads).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")
#: Files that describe the rows: tables, and the files of a dataset saved with ``save_to_disk``.
TABLE_SUFFIXES = (".jsonl", ".csv", ".parquet", ".json", ".arrow")
#: What the app's upload box accepts.
UPLOAD_SUFFIXES = (".zip",) + TABLE_SUFFIXES + IMAGE_SUFFIXES
#: Longest file or folder name Linux takes (NAME_MAX, bytes).
MAX_NAME_BYTES = 255
#: A folder holding these two files is a dataset saved with ``datasets``' ``save_to_disk``.
SAVED_DATASET_FILES = ("dataset_info.json", "state.json")


def extract_upload(files, into: Path) -> Path:
    """Unpack the uploaded ``files`` (paths of files the app received) into the empty folder
    ``into``; return the dataset's source inside it (see :func:`find_source`).

    Either one ``.zip`` or a table file with its pictures (whose paths in the table are then
    plain file names: a folder layout needs a zip)."""
    paths = [Path(f) for f in files or []]
    if not paths:
        raise G4VError("no dataset uploaded: send a .zip of the dataset folder, or a table file with its pictures")
    zips = [p for p in paths if p.suffix.lower() == ".zip"]
    if zips and len(paths) > 1:
        raise G4VError("upload either one .zip or a table file with its pictures, not both")
    if zips:
        _extract_zip(zips[0], into)
    else:
        _copy_files(paths, into)
    return find_source(into)


# ── a zip ──────────────────────────────────────────────────────────────────────────────────────


def _extract_zip(archive: Path, into: Path) -> None:
    """Check every entry of ``archive`` first, then write the files (never past their declared size)."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            entries = [(info, target) for info in zipped.infolist() if (target := entry_target(info)) is not None]
            check_totals([target.as_posix() for _, target in entries], [info.file_size for info, _ in entries])
            for info, target in entries:
                destination = into.joinpath(*target.parts)
                destination.parent.mkdir(parents=True, exist_ok=True)
                with zipped.open(info) as source, open(destination, "xb") as sink:
                    _copy_at_most(source, sink, info.file_size, info.filename)
    except (zipfile.BadZipFile, zlib.error, EOFError):
        raise G4VError(f"{archive.name} is not a zip file, or it is damaged") from None
    except (zipfile.LargeZipFile, NotImplementedError, RuntimeError, OSError) as err:
        raise G4VError(f"{archive.name} cannot be unpacked: {_unpack_problem(err)}") from None


def _unpack_problem(err: Exception) -> str:
    """What is wrong, in words (the exception's class name meant nothing to a visitor)."""
    if isinstance(err, NotImplementedError):
        return "it uses a compression method that cannot be read here (stored, deflate, bzip2 and lzma can)"
    if isinstance(err, zipfile.LargeZipFile):
        return "it needs ZIP64 extensions, which are not read here"
    if isinstance(err, RuntimeError):
        return "an entry is encrypted or needs a password"
    if isinstance(err, (FileExistsError, IsADirectoryError, NotADirectoryError)):
        return "two of its entries have one name (a file twice, or a file and a folder)"
    return f"the server could not write it ({(getattr(err, 'strerror', None) or 'a file system error').lower()})"


def entry_target(info: zipfile.ZipInfo) -> PurePosixPath | None:
    """The relative path a zip entry may be written to, None for entries to skip (folders, archiver
    junk); a G4VError for an entry that must not be unpacked."""
    name = info.filename
    shown = quoted(name, 80)
    if "\\" in name or "\x00" in name or ":" in name:
        raise G4VError(f"the zip holds an entry with an unusual name ({shown}): use plain names with '/'")
    if name.startswith("/"):
        raise G4VError(f"the zip holds an absolute path ({shown}): entries must be relative")
    path = PurePosixPath(name)
    if ".." in path.parts:
        raise G4VError(f"the zip holds a path that leaves its folder ({shown})")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise G4VError(f"the zip holds a link ({shown}): only plain files are unpacked")
    if info.is_dir():
        return None
    if _is_junk(path):
        return None
    if info.flag_bits & 0x1:
        raise G4VError(f"the zip holds an encrypted entry ({shown})")
    _check_file_name(path, shown)
    return path


def _is_junk(path: PurePosixPath) -> bool:
    """Files archivers add that no dataset means: macOS resource forks and hidden files."""
    return path.parts[0] == "__MACOSX" or any(part.startswith(".") for part in path.parts)


def _check_file_name(path: PurePosixPath, shown: str) -> None:
    if any(len(part.encode()) > MAX_NAME_BYTES for part in path.parts):
        raise G4VError(f"a file name in the upload is too long ({shown})")
    suffix = path.suffix.lower()
    if suffix not in IMAGE_SUFFIXES + TABLE_SUFFIXES:
        raise G4VError(f"the upload holds {shown}, which is neither a picture ({', '.join(IMAGE_SUFFIXES)}) "
                       f"nor a table ({', '.join(TABLE_SUFFIXES)})")


def check_totals(names: list[str], sizes: list[int]) -> None:
    """Refuse an upload with too many files, a name twice, or too many bytes in all."""
    if len(names) > limits().max_dataset_files:
        raise G4VError(f"the upload holds {len(names):,} files, the limit is {limits().max_dataset_files:,}")
    seen = set()
    for name in names:
        if name.lower() in seen:  # also refuses names that clash on a case-insensitive disk
            raise G4VError(f"the upload holds {quoted(name, 80)} twice")
        seen.add(name.lower())
    total = sum(sizes)
    if total > limits().max_dataset_bytes:
        raise G4VError(f"the upload unpacks to {total / 2**20:,.0f} MiB, the limit is {limits().max_dataset_bytes / 2**20:,.0f} MiB")


def _copy_at_most(source, sink, size: int, name: str) -> None:
    """Copy ``size`` bytes at most; an entry that holds more than it declared is refused."""
    left = size
    while chunk := source.read(min(1 << 20, left + 1)):
        left -= len(chunk)
        if left < 0:
            raise G4VError(f"the zip entry {quoted(name, 80)} holds more than its declared size")
        sink.write(chunk)


# ── loose files ────────────────────────────────────────────────────────────────────────────────


def _copy_files(paths: list[Path], into: Path) -> None:
    """Copy a table file and pictures side by side into ``into`` (by their base names)."""
    for path in paths:
        if path.is_symlink() or not path.is_file():
            raise G4VError(f"the upload {quoted(path.name, 80)} is not a plain file")
        _check_file_name(PurePosixPath(path.name), quoted(path.name, 80))
    check_totals([p.name for p in paths], [p.stat().st_size for p in paths])
    for path in paths:
        shutil.copyfile(path, into / path.name)


# ── which file is the dataset ──────────────────────────────────────────────────────────────────


def find_source(folder: Path) -> Path:
    """The dataset inside an unpacked upload: a saved dataset's folder, else the folder of its one
    ``metadata.*`` table (imagefolder), else its one table file."""
    saved = sorted({p.parent for p in folder.rglob(SAVED_DATASET_FILES[0]) if (p.parent / SAVED_DATASET_FILES[1]).is_file()})
    if len(saved) == 1:
        return saved[0]
    tables = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES
                    and p.suffix.lower() not in (".arrow", ".json"))
    if not tables or len(saved) > 1:
        raise G4VError("the upload holds no table naming the pictures and prompts "
                       "(metadata.jsonl, a .jsonl, .csv or .parquet file, or one saved dataset)")
    if len(tables) > 1:
        names = ", ".join(quoted(p.relative_to(folder).as_posix(), 60) for p in tables[:3])
        raise G4VError(f"the upload holds {len(tables)} tables ({names}{', ...' if len(tables) > 3 else ''}): "
                       "send one dataset at a time")
    table = tables[0]
    return table.parent if table.stem.lower() == "metadata" else table
