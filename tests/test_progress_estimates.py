"""The time left that the progress bars show: at the pace of the work done, not of the start-up,
and counted down while a batch is in flight (a new user watched Evaluate's estimate rise from 17 s
to 48 s while the count stayed at 4 of 12, and Attribution say "drawing, about 1 s left" for 12 s;
the port said "starting vLLM, about 60 s left" from 16 s to 32 s)."""

import re
import time

import pytest

from webapp.runs import OVERDUE, Pace, live_progress, time_left


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def seconds(text: str) -> float:
    number, unit = re.fullmatch(r"about (\d+) (s|min) left", text).groups()
    return float(number) * (60 if unit == "min" else 1)


def test_the_time_left_counts_down_while_a_batch_is_in_flight():
    """12 rows in batches of 4, 10 s a batch, after 30 s of opening the arms: the first count comes
    when the arms are open (0 of 12), so their opening is not the rows' pace; between two batches
    the time left falls second by second instead of rising, and it is right at each batch's end."""
    clock = Clock()
    pace = Pace(clock)
    clock.now = 30.0  # the arms opened: the first count
    assert pace.left(0, 12) == ""
    shown = []
    for second in range(31, 61):
        clock.now = float(second)
        done = 4 * ((second - 30) // 10)
        if 0 < done < 12:
            shown.append((second, done, seconds(pace.left(done, 12))))
    at_first_batch = [left for second, done, left in shown if second == 40][0]
    assert at_first_batch == pytest.approx(20, abs=1)  # 8 rows at 2.5 s a row, not 80 s with the opening in it
    while_in_flight = [left for second, done, left in shown if 40 <= second < 50]
    assert all(b <= a for a, b in zip(while_in_flight, while_in_flight[1:])), while_in_flight
    assert [left for second, _, left in shown if second == 50][0] == pytest.approx(10, abs=1)
    # the plain pace rose while the count stood still (what the user saw)
    plain = [seconds(time_left(4, 12, second - 30)) for second in range(40, 50)]
    assert plain[-1] > plain[0]


def test_an_overdue_batch_raises_the_estimate_only_as_far_as_the_wait_shows():
    """A batch due after 10 s that takes 50: the time left counts down to the moment it was due,
    then rises, each time to what the last rows would take at the pace if it finished now."""
    clock = Clock()
    pace = Pace(clock)
    pace.left(0, 12)
    clock.now = 10.0
    pace.left(4, 12)  # 2.5 s a row
    shown = {}
    for second in range(10, 60, 5):
        clock.now = float(second)
        shown[second] = seconds(pace.left(4, 12))
    assert [shown[s] for s in (10, 15, 20)] == [20, 15, 10]  # counted down: the batch was due at 20 s
    later = [shown[s] for s in range(25, 60, 5)]
    assert later == sorted(later) and later[-1] == pytest.approx(55 / 8 * 4, abs=1)


def test_attribution_reports_each_stage_and_each_drawing_in_order(hf_engine, tmp_path):
    """Every stage and every picture drawn moves the bar forward (drawing takes most of the run: a
    bar that sat at "drawing" for all of it looked stuck), and the last step comes just before the
    export is written."""
    from g4v.attribution.run import STAGES, AttributionSettings, run_attribution
    from tests.conftest import make_image

    steps = []
    run_attribution(hf_engine, make_image(120, 80, seed=2), "What colour is it?",
                    AttributionSettings(seeds=1, fractions=(0, 0.5), max_new_tokens=2), out_dir=tmp_path,
                    progress=lambda fraction, text: steps.append((fraction, text)))
    fractions = [fraction for fraction, _ in steps]
    assert fractions == sorted(fractions) and len(set(fractions)) == len(fractions)
    drawing = [text for _, text in steps if text.startswith("drawing")]
    assert len(drawing) == 5 and fractions[-1] == STAGES["writing the export"]
    assert sum(1 for fraction in fractions if fraction >= STAGES["drawing"]) == 6  # the drawings, then the export


def sent_at(sent: list, moment: float, timeout: float = 5.0) -> tuple:
    """The first (fraction, line) sent once the clock read ``moment``, waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for now, fraction, line in list(sent):
            if now == moment:
                return fraction, line
        time.sleep(0.005)
    raise AssertionError(f"nothing sent at {moment} s: {sent}")


def test_a_lasting_stage_counts_its_time_left_down_and_stops_with_the_run():
    """A quarter of the run done in 10 s: "about 30 s left", and while that stage lasts the same
    stage is sent again with the time left counted down (25 s at 15 s, 20 s at 20 s) instead of one
    frozen estimate, and said to take longer once that is well spent; the next stage is estimated
    afresh; nothing is sent after the run ends, refused or not."""
    clock = Clock()
    sent = []

    def progress(fraction, desc):
        sent.append((clock.now, fraction, desc))

    with live_progress(progress, every=0.01, clock=clock) as tell:
        clock.now = 10.0
        tell(0.25, "starting vLLM")
        assert sent_at(sent, 10.0) == (0.25, "starting vLLM, about 30 s left")
        for moment, left in ((15.0, 25), (20.0, 20)):
            clock.now = moment
            assert sent_at(sent, moment) == (0.25, f"starting vLLM, about {left} s left")
        clock.now = 41.0  # spent by a second: still about 1 s (a short run's estimates are rough)
        assert sent_at(sent, 41.0) == (0.25, "starting vLLM, about 1 s left")
        clock.now = 45.0
        assert sent_at(sent, 45.0) == (0.25, f"starting vLLM, {OVERDUE}")
        clock.now = 50.0
        tell(0.8, "drawing")  # 50 s for 80 %
        assert (50.0, 0.8, "drawing, about 12 s left") in sent  # (the ticker may resend the last stage at 50 s first)
    ended = len(sent)
    time.sleep(0.1)
    assert len(sent) == ended
    with pytest.raises(ValueError):
        with live_progress(progress, every=0.01, clock=clock) as tell:
            tell(0.5, "drawing")
            raise ValueError("refused")
    ended = len(sent)
    time.sleep(0.1)
    assert len(sent) == ended


@pytest.mark.parametrize("scale", [{}, {"deepstack0": 0.0}])
def test_deepstack_reports_each_stage_and_each_drawing_in_order(hf_engine, tmp_path, scale):
    """Deepstack's bar showed only the seconds: every stage and every picture drawn moves it forward,
    the run with levels changed only when one is asked for, and the last step comes just before
    the export is written."""
    from g4v.inspect.run import FIGURE_FILES, STAGES, run_inspection
    from tests.conftest import make_image

    steps = []
    run_inspection(hf_engine, make_image(120, 80, seed=2), "What colour is it?", scale=scale, out_dir=tmp_path,
                   make_zip=False, progress=lambda fraction, text: steps.append((fraction, text)))
    fractions = [fraction for fraction, _ in steps]
    assert fractions == sorted(fractions) and len(set(fractions)) == len(fractions)
    assert (STAGES["changed levels"] in fractions) == bool(scale)
    drawing = [text for _, text in steps if text.startswith("drawing")]
    assert len(drawing) == len(FIGURE_FILES) and fractions[-1] == STAGES["writing the export"]
    assert sum(1 for fraction in fractions if STAGES["drawing"] <= fraction < 1) == len(FIGURE_FILES) + 1
