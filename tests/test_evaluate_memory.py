"""A small upload whose rows name huge pictures stays small in memory (the red team's S3).

A 532 KB zip whose 16 rows each name four 6324 x 6324 PNGs (flat colours compress to almost
nothing) took 7-10 GB: every chunk of rows held each picture decoded at full size (120 MB), and the
processor worked on them whole. Pictures are now reduced as read to what the processor keeps
(:class:`g4v.evaluate.data.PictureFit`), one at a time, and a chunk holds a bounded count of pixels.

Peak memory is measured in a child process (its own VmHWM) running the app's upload code
and the CLI's ``eval`` on such a zip, with 1 and with 4 rows: the peak must not grow with the rows,
and stays far under the issue's 4 GB.
"""

import json
import os
import subprocess
import sys
import zipfile

import pytest
from PIL import Image

from g4v.evaluate.data import REDUCE_ABOVE_PIXELS, Columns, PictureFit, open_dataset
from g4v.loading import load_config
from g4v.paths import BUNDLED_MODEL_DIR, REPO_ROOT
from g4v.tiling import plan_tiling

SIDE = 6324  # 39,992,976 pixels: just under the app's 40 M pixel limit per picture
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 20)]


def huge_zip(folder, rows: int):
    """A dataset zip as the red team made it: each row names the same four huge flat PNGs."""
    names = [f"huge{k}.png" for k in range(len(COLOURS))]
    for name, colour in zip(names, COLOURS):
        if not (folder / name).exists():
            Image.new("RGB", (SIDE, SIDE), colour).save(folder / name)
    archive = folder / f"huge-{rows}.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as packed:
        for name in names:
            packed.write(folder / name, f"huge/{name}")
        packed.writestr("huge/metadata.jsonl", "".join(
            json.dumps({"file_name": names, "prompt": "What colour is it?", "answer": "red"}) + "\n"
            for _ in range(rows)))
    return archive


#: In the child: the zip unpacked by the app's own upload code, then ``python -m g4v eval`` on it
#: (arm A against itself); prints the child's peak resident memory in MiB: its own VmHWM, not
#: ``ru_maxrss``, which Linux carries across ``exec`` from the forking process (a pytest worker that
#: had grown to 3.2 GB gave every child that peak).
RUN_AND_MEASURE = """
import sys
from pathlib import Path
from g4v.cli import main
from g4v.evaluate.uploads import extract_upload
source = extract_upload([sys.argv[1]], Path(sys.argv[2]))
code = main(["eval", "--a", "hf", "--b", "same", "--data", str(source), "--out", sys.argv[3], "--max-new-tokens", "2"])
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(code, int(hwm.split()[1]) / 1024)
"""


@pytest.mark.slow  # two CLI runs in children, about a minute each on 2 cores
def test_a_zip_of_huge_pictures_runs_in_bounded_memory(tmp_path):
    peaks = {}
    for rows in (1, 4):
        archive = huge_zip(tmp_path, rows)
        assert archive.stat().st_size < 200_000  # a small upload
        run = subprocess.run([sys.executable, "-c", RUN_AND_MEASURE, str(archive), str(tmp_path / f"up-{rows}"),
                              str(tmp_path / f"out-{rows}")], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=900, env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                                               "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)})
        code, peak = run.stdout.split()[-2:]
        assert code == "0", run.stderr[-3000:]
        peaks[rows] = float(peak)
    # four rows hold no more than one: before, each row added four pictures at full size (480 MB)
    assert peaks[4] - peaks[1] < 150, peaks
    assert peaks[4] < 2048, peaks  # the model, one picture decoded at a time, and the rest; 4 GB was the bound


def test_a_huge_picture_is_kept_at_the_size_the_processor_resizes_it_to(tmp_path):
    """The reduced picture is the processor's own fit into the pinpoint the model picks for the
    original (same pinpoint, same resized size as the tiling plan of the original says); a
    picture of at most REDUCE_ABOVE_PIXELS is untouched."""
    config = load_config(BUNDLED_MODEL_DIR)
    fit = PictureFit.for_configs([config])
    for width, height in ((SIDE, SIDE), (6000, 1500), (900, 5000)):
        plan = plan_tiling((height, width), config)
        kept = fit(width, height)
        assert kept == plan.resized_size[::-1]
        assert plan_tiling(kept[::-1], config).best_resolution == plan.best_resolution
    assert fit(2000, 2000) == (2000, 2000) and 2000 * 2000 <= REDUCE_ABOVE_PIXELS
    assert PictureFit.for_configs([None])(8000, 8000) == (2000, 2000)  # an unknown processor: the pixel bound

    big = Image.new("RGB", (SIDE, SIDE // 2), (10, 20, 30))
    big.save(tmp_path / "big.png")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "big.png", "prompt": "Colour?"}) + "\n")
    dataset = open_dataset(str(tmp_path), Columns())
    [picture] = dataset.sample(0, fit).images
    assert picture.size == fit(SIDE, SIDE // 2) and picture.getpixel((5, 5)) == (10, 20, 30)
    assert dataset.sample(0).images[0].size == (SIDE, SIDE // 2)  # without a fit: as it is


def test_a_chunk_of_rows_ends_at_its_pixel_budget(tmp_path, monkeypatch):
    """Rows are decoded chunk by chunk, as the run asks for them, and a chunk whose pictures reach
    CHUNK_PIXELS ends at that row."""
    from g4v.evaluate import run

    Image.new("RGB", (100, 100)).save(tmp_path / "small.png")
    (tmp_path / "metadata.jsonl").write_text("".join(
        json.dumps({"file_name": ["small.png"] * 3, "prompt": "Colour?"}) + "\n" for _ in range(7)))
    dataset = open_dataset(str(tmp_path), Columns())
    monkeypatch.setattr(run, "CHUNK_PIXELS", 2 * 3 * 100 * 100)  # two rows' pictures
    chunks = run.sample_chunks(dataset, list(range(7)), 3, PictureFit())
    assert [len(chunk) for chunk in chunks] == [2, 2, 2, 1]
    monkeypatch.setattr(run, "CHUNK_PIXELS", 10**9)
    assert [[s.index for s in chunk] for chunk in run.sample_chunks(dataset, [6, 0, 1, 2], 3, PictureFit())] == \
        [[6, 0, 1], [2]]


def test_a_huge_jpeg_turned_by_its_exif_is_reduced_upright(tmp_path):
    """A JPEG is decoded at a fraction of its size (its DCT scale) and then brought to the fit of
    its upright size: a picture stored on its side comes out turned, at the upright fit."""
    from g4v.images import open_image

    stored = Image.new("RGB", (6000, 2000), (250, 250, 250))
    stored.paste((20, 20, 200), (0, 0, 3000, 2000))  # blue on the left as stored: at the top once turned
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to show"
    stored.save(tmp_path / "side.jpg", exif=exif, quality=95)
    fit = PictureFit.for_configs([load_config(BUNDLED_MODEL_DIR)])
    picture = open_image(tmp_path / "side.jpg", fit=fit)
    assert picture.size == fit(2000, 6000) and picture.size[1] > picture.size[0]
    top, bottom = picture.getpixel((picture.width // 2, 5)), picture.getpixel((picture.width // 2, picture.height - 5))
    assert top[2] > 150 > top[0] and min(bottom) > 200
    assert open_image(tmp_path / "side.jpg").size == (2000, 6000)  # no fit: full size, upright
