"""A job's lines in one order (`api.joblines`), by the stamps kept beside stdout."""

from __future__ import annotations

from pathlib import Path

from jobwarden.daemon.api import joblines
from jobwarden.daemon.api.reading import last_lines
from jobwarden.daemon.store.evidence import EvidenceFile
from jobwarden.daemon.store.stamps import Stamper, read_stamps, stamps_path


def stamped(path: Path, lines: list[bytes], first: float = 100.0) -> None:
    """Write ``lines`` to ``path`` and stamp line n at ``first + n``."""
    stdout = EvidenceFile(path)
    stamps = Stamper(stdout)
    at = 0
    for number, line in enumerate(lines):
        stdout.write(line + b"\n")
        at += len(line) + 1
        stamps.add(at, first + number)
    stamps.close()
    stdout.close()


def snapshot(tmp_path: Path, live: bool = False, horizon: float = 1e12) -> joblines.Snapshot:
    """A job of one attempt, its events under ``tmp_path``."""
    folder = tmp_path / "job"
    (folder / "attempts" / "1").mkdir(parents=True)
    return joblines.Snapshot(
        "job", folder, tmp_path / "wardend.log", 1, 0.0, True, "events.jsonl", live, horizon
    )


class TestStamps:
    """The sidecar: one record per line, found by the line's end offset."""

    def test_the_stamps_of_the_last_lines_are_found(self, tmp_path: Path) -> None:
        """Of 10,000 stamped lines, the last three's stamps, by their end offsets."""
        path = tmp_path / "output.log"
        stamped(path, [b"line %d" % n for n in range(10_000)])
        lines, _ = last_lines(path, 3)
        found = read_stamps(path, [end for _, end in lines])
        assert [found[e] for _, e in lines] == [9_997 + 100.0, 9_998 + 100.0, 9_999 + 100.0]
        assert stamps_path(path).stat().st_size == 16 * 10_000

    def test_a_file_without_stamps_has_none(self, tmp_path: Path) -> None:
        """A stdout file of an older daemon: no stamps, and no error."""
        path = tmp_path / "events.jsonl"
        path.write_bytes(b"{}\n")
        assert read_stamps(path, [3]) == {}


class TestOrder:
    """Lines placed by when the daemon read them, and cut at the request's moment."""

    def test_lines_are_placed_by_their_stamp_not_their_own_time(self) -> None:
        """A worker line read after a daemon record comes after it, whatever its own time."""
        worker = [
            {"event": "ready", "time": 1.0, "read": 5.0},
            {"event": "failed", "time": 1.0, "read": 7.0},
        ]
        ours = [{"event": "job.transition", "time": 6.0, "origin": "wardend"}]
        merged = [item["event"] for item in joblines.merge(worker, ours)]
        assert merged == ["ready", "job.transition", "failed"]

    def test_a_line_after_the_request_waits_for_the_next_answer(self) -> None:
        """Lines up to the horizon are given; the cursor is the start of the first left out."""
        entries = [({"read": 1.0}, 0), ({"read": 2.0}, 10), ({"read": 9.0}, 20)]
        assert joblines.cut(entries, 5.0, 30) == ([{"read": 1.0}, {"read": 2.0}], 20)
        assert ([item for item, _ in entries], 30) == joblines.cut(entries, 10.0, 30)

    def test_an_unstamped_line_of_a_live_attempt_waits(self, tmp_path: Path) -> None:
        """A line whose stamp is not yet written is left for later while the attempt runs,
        and given at its own time once it has ended."""
        path = tmp_path / "job" / "attempts" / "1" / "events.jsonl"
        job = snapshot(tmp_path, live=True)
        stamped(path, [b'{"event": "ready", "time": 1.0}'])
        with path.open("ab") as stream:
            stream.write(b'{"event": "failed", "time": 2.0}\n')
        items, offset = joblines.worker_tail(job, 10, None, joblines.Choice())
        assert ([i["event"] for i in items], offset) == (["ready"], 32)
        ended = snapshot(tmp_path / "later")
        ended_path = tmp_path / "later" / "job" / "attempts" / "1" / "events.jsonl"
        ended_path.write_bytes(path.read_bytes())
        stamps_path(ended_path).write_bytes(stamps_path(path).read_bytes())
        items, _ = joblines.worker_tail(ended, 10, None, joblines.Choice())
        assert [i["event"] for i in items] == ["ready", "failed"]

    def test_kinds_are_shell_patterns(self) -> None:
        """`incident.*` keeps an incident's records; no kinds keep every line."""
        choice = joblines.Choice(kinds=("incident.*", "failed"))
        kept = [k for k in ("incident.opened", "failed", "progress") if choice.wants({"event": k})]
        assert kept == ["incident.opened", "failed"]
        assert joblines.Choice().wants({"event": "progress"})
