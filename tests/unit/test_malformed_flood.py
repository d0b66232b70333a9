"""A flood of lines that are no events costs the daemon's log a few records, not one a line."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from jobwarden.daemon.supervise import attempt as malformed
from jobwarden.events import Malformed
from jobwarden.states import JobState
from tests.scripted import Line
from tests.unit.rig import Rig, play

FLOOD = 5000


def test_a_flood_of_malformed_lines_is_logged_first_then_summarised(tmp_path: Path) -> None:
    """5,000 stray lines: each kept and counted, the first 20 logged, the rest in summaries."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("noisy")
        run = rig.worker(record).run()
        lines = [Line(f"print {n} from the task") for n in range(FLOOD)]
        rig.launcher.plan("noisy", [*run[:2], *lines, *run[2:]])
        with capture_logs() as logs:
            await rig.launched(record)
            await rig.until_settled("noisy")
        assert record.state is JobState.COMPLETED
        assert rig.stats.malformed_event_lines == FLOOD
        one_by_one = [r for r in logs if r["event"] == "event.malformed"]
        summaries = [r for r in logs if r["event"] == "event.malformed_summary"]
        assert len(one_by_one) == malformed.FIRST_LINES
        assert 1 <= len(summaries) <= 2
        assert len(one_by_one) + sum(s["lines"] for s in summaries) == FLOOD
        assert summaries[-1]["total"] == FLOOD
        kept = (rig.root.attempt("noisy", 1) / "events.jsonl").read_bytes()
        assert kept.count(b" from the task\n") == FLOOD

    play(tmp_path, scenario)


def test_a_summary_comes_at_most_every_interval_and_at_the_end() -> None:
    """Past the first lines, one record per SUMMARY_EVERY_S, and the rest when flushed."""
    now = [0.0]
    lines = malformed.MalformedLines("j", 1, clock=lambda: now[0])
    with capture_logs() as logs:
        for n in range(malformed.FIRST_LINES + 3):
            lines.note(Malformed("x", "not JSON", n + 1))
        now[0] = malformed.SUMMARY_EVERY_S / 2
        lines.note(Malformed("x", "not JSON", 100))
        now[0] = malformed.SUMMARY_EVERY_S * 1.5
        lines.note(Malformed("x", "not JSON", 101))
        now[0] += 1.0
        lines.note(Malformed("x", "too long", 102))
        lines.flush()
        lines.flush()
    summaries = [(r["lines"], r["last_line"]) for r in logs if r["event"] != "event.malformed"]
    assert summaries == [(1, 21), (4, 101), (1, 102)]
