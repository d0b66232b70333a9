"""A job file's [slurm] section: validated at intake (every problem listed), read back later."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.daemon.launch.slurm.script import SlurmSettings
from jobwarden.errors import JobFileError
from jobwarden.jobfile import job_from_bytes
from jobwarden.sections import SlurmSection, section_of
from tests.daemon import linreg_job


class TestSlurmSection:
    def test_a_good_section_is_accepted(self) -> None:
        """partition, time limit and nodes pass intake."""
        text = linreg_job("s", slurm={"partition": "debug", "time_limit": "1:30:00", "nodes": 1})
        job_from_bytes(text.encode(), "s.toml", "toml")

    def test_every_bad_field_is_listed(self) -> None:
        """A bad time, a bad partition, zero nodes and an unknown field: four problems."""
        slurm = {"partition": "a b", "time_limit": "soon", "nodes": 0, "ntasks": 2}
        with pytest.raises(JobFileError) as raised:
            job_from_bytes(linreg_job("s", slurm=slurm).encode(), "s.toml", "toml")
        message = str(raised.value)
        for field in ("slurm.partition", "slurm.time_limit", "slurm.nodes", "slurm.ntasks"):
            assert field in message

    def test_more_nodes_than_members_is_refused(self) -> None:
        """[slurm] nodes = 3 for 2 members: refused at intake, naming both numbers."""
        text = linreg_job("s", run={"processes": 2}, slurm={"nodes": 3})
        with pytest.raises(JobFileError) as raised:
            job_from_bytes(text.encode(), "s.toml", "toml")
        assert "[slurm] nodes = 3 is more than [run] processes = 2" in str(raised.value)

    def test_the_launcher_reads_the_kept_request(self, tmp_path: Path) -> None:
        """The section of jobs/<id>/request.toml, laid over the daemon's settings."""
        (tmp_path / "request.toml").write_text(linreg_job("s", slurm={"time_limit": "10"}))
        settings = SlurmSettings(partition="debug", time_limit="5").for_job(section_of(tmp_path))
        assert (settings.partition, settings.time_limit) == ("debug", "10")

    def test_no_section_keeps_the_daemons_settings(self, tmp_path: Path) -> None:
        """A request without [slurm]: None, and the settings stand."""
        (tmp_path / "request.toml").write_text(linreg_job("s"))
        assert section_of(tmp_path) is None
        assert SlurmSettings(nodes=2).for_job(None) == SlurmSettings(nodes=2)
        assert SlurmSection().nodes is None
