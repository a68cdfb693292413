"""The bounds on what visitors and commands may send, in one place: pictures, uploads, PDFs,
dataset uploads and the visitors' sessions (docs/limits.md lists them for users).

Each limit is a field of :class:`Limits`: its default, written once, and the ``G4V_*`` variable
that changes it. :func:`limits` reads the environment the first time it is asked (the app asks at
start, so a bad value stops it with one line) and keeps the answer; no module reads these
variables at import, so a test or a launcher that sets one before the first request is heard.
"""

from dataclasses import dataclass, field

from g4v.settings.flags import environment_values

MiB = 1024 ** 2
GiB = 1024 ** 3


@dataclass(frozen=True)
class Limits:
    max_image_pixels: int = field(default=40_000_000, metadata={
        "env": "G4V_MAX_IMAGE_PIXELS", "help": "pictures with more pixels are refused from the file's header"})
    max_upload_size: str = field(default="25mb", metadata={
        "env": "G4V_MAX_UPLOAD_SIZE", "help": "the largest file the page accepts, as Gradio reads it (50mb, 1gb)"})
    max_pdf_bytes: int = field(default=50 * MiB, metadata={
        "env": "G4V_MAX_PDF_BYTES", "help": "larger PDFs are refused before they are read"})
    max_pdf_pages: int = field(default=300, metadata={
        "env": "G4V_MAX_PDF_PAGES", "help": "PDFs with more pages are refused (the picker draws a thumbnail of each)"})
    pdf_renderers: int = field(default=2, metadata={
        "env": "G4V_PDF_RENDERERS", "help": "child processes rendering PDFs at once; the rest wait their turn"})
    pdf_render_memory: int = field(default=GiB, metadata={
        "env": "G4V_PDF_RENDER_MEMORY", "help": "a PDF renderer's address space, in bytes"})
    pdf_page_seconds: float = field(default=30.0, metadata={
        "env": "G4V_PDF_PAGE_SECONDS", "help": "how long PDFium may take to open a document or draw one page"})
    max_dataset_files: int = field(default=5000, metadata={
        "env": "G4V_MAX_DATASET_FILES", "help": "an uploaded dataset archive with more files is refused"})
    max_dataset_bytes: int = field(default=512 * MiB, metadata={
        "env": "G4V_MAX_DATASET_BYTES", "help": "an uploaded dataset that unpacks to more bytes is refused"})
    max_sessions: int = field(default=64, metadata={
        "env": "G4V_MAX_SESSIONS", "help": "visitors' sessions kept; the oldest idle one goes first"})
    max_session_bytes: int = field(default=8 * GiB, metadata={
        "env": "G4V_MAX_SESSION_BYTES", "help": "bytes all visitors' sessions may keep on disk together"})

    @classmethod
    def from_environment(cls, environ=None) -> "Limits":
        """The defaults, changed by the ``G4V_*`` variables set in ``environ`` (default
        ``os.environ``); a bad value is one :class:`~g4v.errors.G4VError` line naming it."""
        return cls(**environment_values(cls, environ))


_current: Limits | None = None


def limits() -> Limits:
    """This process's limits: read from the environment the first time, the same object after."""
    global _current
    if _current is None:
        _current = Limits.from_environment()
    return _current
