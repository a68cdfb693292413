"""The PDFium child process: one document opened, its pages measured and drawn on request.

PDFium cannot be interrupted, and a hostile page can make it allocate without end (a form that
draws itself) or crash, so :mod:`g4v.documents.pdf` never calls it in the app's own process. It
starts this file with a fresh interpreter (``python -P pdf_worker.py MEMORY CPU``: no fork of a
process that has threads) and the child caps its own address space and CPU time before it loads
PDFium. Whatever happens in here, the parent sees at worst a child that died, and says so in one line.

Only the standard library and pypdfium2 are imported (no g4v, no torch, no PIL), so a child starts
in a fraction of a second. The parent keeps every check and every message; this file only answers.

Frames both ways are a 4-byte big-endian length, a JSON header, then ``header["bytes"]`` raw bytes:
no pickle, so a child that PDFium's bugs could take over still cannot run code in the parent.
Requests: the PDF's bytes first, then ``{"op": "size", "index": i}`` or ``{"op": "render", "index": i,
"scale": s}``. Replies: ``{"pages": n}`` or ``{"error": "load", "code": c}`` for the document,
``{"size": [w, h]}`` and ``{"width", "height", "stride", "mode", "dest_mode"}`` + the
bitmap's bytes for a page, ``{"error": "page"}`` for a page PDFium cannot load.
"""

import json
import os
import resource
import struct
import sys

HEADER = struct.Struct(">I")


def read_frame(stream) -> tuple[dict, bytes] | None:
    """One frame from ``stream``, or None at its end or inside a frame cut short (the other side died)."""
    prefix = stream.read(HEADER.size)
    if len(prefix) < HEADER.size:
        return None
    header = json.loads(stream.read(HEADER.unpack(prefix)[0]))
    payload = stream.read(header.get("bytes", 0))
    return (header, payload) if len(payload) == header.get("bytes", 0) else None


def write_frame(stream, header: dict, payload: bytes | memoryview = b"") -> None:
    encoded = json.dumps({**header, "bytes": len(payload)}).encode()
    stream.write(HEADER.pack(len(encoded)) + encoded)
    stream.write(payload)
    stream.flush()


def answer(document, header: dict, out) -> None:
    """One page request: its size in points, or its bitmap drawn as the parent's scale says."""
    import pypdfium2 as pdfium

    try:
        page = document[header["index"]]
    except pdfium.PdfiumError:  # e.g. a page tree that loops back on itself
        write_frame(out, {"error": "page"})
        return
    try:
        if header["op"] == "size":
            write_frame(out, {"size": list(page.get_size())})
            return
        # the arguments the app always rendered with: forms never initialised nor drawn
        bitmap = page.render(scale=header["scale"], may_draw_forms=False)
        # the modes PdfBitmap.to_pil() gives PIL, so the parent builds the very same picture
        dest_mode = pdfium.internal.BitmapTypeToStrReverse[bitmap.format]
        write_frame(out, {"width": bitmap.width, "height": bitmap.height, "stride": bitmap.stride,
                          "mode": bitmap.mode, "dest_mode": dest_mode}, memoryview(bitmap.buffer).cast("B"))
    finally:
        page.close()


def main(memory: int, cpu_seconds: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    # The protocol owns the original stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    source = sys.stdin.buffer
    first = read_frame(source)
    if first is None:
        return
    import pypdfium2 as pdfium

    try:
        document = pdfium.PdfDocument(first[1])
    except pdfium.PdfiumError as err:
        write_frame(out, {"error": "load", "code": getattr(err, "err_code", None)})
        return
    write_frame(out, {"pages": len(document)})
    while (request := read_frame(source)) is not None:
        answer(document, request[0], out)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
