"""The pure parts of a program's spare: the handoff line, its key and slot, its check."""

from __future__ import annotations

import io
from pathlib import Path

from jobwarden.daemon.launch.base import LaunchSpec
from jobwarden.daemon.launch.program_spares import program_key, slot_of
from jobwarden.jobfile import job_from_mapping
from jobwarden.sdk.distributed import COORDINATOR_ENV, PROCESS_ID_ENV
from jobwarden.sdk.settings import RUN_FILE_ENV
from jobwarden.sdk.spare import Handoff, SpareWait


def command_spec(env: dict[str, str], sdk: bool = True, folder: str = "a/1") -> LaunchSpec:
    """Attempt spec of a command job ``user`` running ``train.py``."""
    job = job_from_mapping({"id": "user", "command": ["python", "train.py"], "sdk": sdk}, "job")
    return LaunchSpec("user", 1, Path(folder), ["python", "train.py"], env, job=job)


class TestHandoff:
    def test_the_line_reads_back_as_written(self) -> None:
        """A handoff survives its one JSON line: run file, stderr, folder and environment."""
        sent = Handoff(Path("r/run.json"), Path("r/stderr.log"), Path("r"), {"A": "1"})
        assert sent == Handoff.parse(sent.line())

    def test_no_folder_means_the_jobs_own_workdir(self) -> None:
        """A job with a workdir: the spare is told no folder to move into."""
        sent = Handoff(Path("run.json"), Path("stderr.log"), None, {})
        assert Handoff.parse(sent.line()).cwd is None


class TestKey:
    def test_what_an_attempt_sets_anew_is_not_part_of_the_key(self) -> None:
        """Two attempts differing only in run file and coordinator share a spare."""
        first = command_spec({"X": "1", RUN_FILE_ENV: "a/1/run.json", COORDINATOR_ENV: "h:1"})
        second = command_spec({"X": "1", RUN_FILE_ENV: "a/2/run.json", COORDINATOR_ENV: "h:2"})
        assert program_key(first) == program_key(second) is not None

    def test_a_changed_environment_changes_the_key(self) -> None:
        """Another value of the job's env: another program, never handed the old spare."""
        assert program_key(command_spec({"X": "1"})) != program_key(command_spec({"X": "2"}))

    def test_a_plain_program_has_no_key(self) -> None:
        """sdk = false: nothing marks the restore point, no spare."""
        assert program_key(command_spec({}, sdk=False)) is None

    def test_each_member_has_its_own_slot(self) -> None:
        """Member 1's slot is its own; a single process is member 0."""
        assert [slot_of(command_spec({PROCESS_ID_ENV: "1"})), slot_of(command_spec({}))] == [
            "user/1",
            "user/0",
        ]


class TestChanged:
    def test_an_edited_source_is_named(self, tmp_path: Path) -> None:
        """A source edited after the spare started: it differs from a cold start."""
        source = tmp_path / "train.py"
        source.write_text("a = 1\n")
        spare = SpareWait(io.StringIO(), [source], [])
        source.write_text("a = 2\n")
        assert spare.changed(None) == ["sources changed since the spare started (train.py)"]

    def test_a_file_held_under_the_checkpoint_directory_is_named(self, tmp_path: Path) -> None:
        """A file the spare holds open under the checkpoint directory refuses the handoff."""
        checkpoints = tmp_path / "ck"
        checkpoints.mkdir()
        spare = SpareWait(io.StringIO(), [], [])
        with (checkpoints / "mine").open("a"):
            problems = spare.changed(checkpoints)
        assert [f"holds {checkpoints / 'mine'} open before run.restore()"] == problems

    def test_an_unchanged_spare_has_no_problem(self, tmp_path: Path) -> None:
        """Same sources, same data files, nothing held: handed."""
        source, data = tmp_path / "train.py", tmp_path / "data.bin"
        source.write_text("a = 1\n")
        data.write_bytes(b"123")
        spare = SpareWait(io.StringIO(), [source], [data])
        assert spare.changed(tmp_path / "ck") == []
