"""wardend's settings reach the launcher typed, from its options, never from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.daemon import cli
from jobwarden.daemon.config import LaunchSettings, SlurmOptions
from jobwarden.daemon.launch import registry
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.launch.local import LocalLauncher
from jobwarden.daemon.launch.slurm.launcher import SlurmLauncher
from jobwarden.daemon.launch.slurm.script import SlurmSettings


def parse(*argv: str) -> SlurmOptions:
    """The Slurm options wardend's command line gives."""
    return cli.slurm_options(cli.parser().parse_args(["--root", "/nonexistent", *argv]))


class TestSlurmOptions:
    """--slurm-* as typed settings."""

    def test_every_option_is_carried(self) -> None:
        """Partition, account, time, signal lead and extra options, the extra split as a shell."""
        options = parse(
            "--slurm-partition=debug",
            "--slurm-account=lab",
            "--slurm-time=10",
            "--slurm-signal-lead=30",
            "--slurm-extra=--qos=low --constraint='cpu fast'",
        )
        assert options == SlurmOptions(
            "debug", "lab", "10", 30, ("--qos=low", "--constraint=cpu fast")
        )

    def test_defaults_are_none_and_a_minute(self) -> None:
        """Nothing given: no partition, account or limit; SIGTERM 60 s before the limit."""
        assert parse() == SlurmOptions()

    def test_unbalanced_quotes_are_refused_by_name(self) -> None:
        """Extra options a shell could not split are an error naming the option."""
        with pytest.raises(LauncherError, match="--slurm-extra"):
            parse("--slurm-extra=--comment='open")

    def test_a_negative_signal_lead_is_refused(self) -> None:
        """The lead is seconds before the limit: below zero means nothing."""
        with pytest.raises(LauncherError, match="--slurm-signal-lead"):
            parse("--slurm-signal-lead=-1")


class TestRetiredEnvironment:
    """The variables an earlier wardend read are refused, not silently ignored."""

    def test_nothing_set_starts(self) -> None:
        """No JOBWARDEN_SLURM_* variable: no refusal."""
        assert cli.retired_environment({"JOBWARDEN_ROOT": "/r"}) is None

    def test_each_variable_is_named_with_its_option(self) -> None:
        """The refusal names every variable set and the option that replaces it."""
        refusal = cli.retired_environment(
            {"JOBWARDEN_SLURM_TIME": "5", "JOBWARDEN_SLURM_PARTITION": "debug"}
        )
        assert refusal is not None
        assert "JOBWARDEN_SLURM_PARTITION (use --slurm-partition)" in refusal
        assert "JOBWARDEN_SLURM_TIME (use --slurm-time)" in refusal

    def test_wardend_exits_2_before_touching_its_root(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """main refuses at once, with status 2 and the reason on stderr."""
        monkeypatch.setenv("JOBWARDEN_SLURM_SIGNAL_S", "30")
        root = f"{tmp_path}/root"
        assert cli.main(["--root", root]) == 2
        assert "JOBWARDEN_SLURM_SIGNAL_S (use --slurm-signal-lead)" in capsys.readouterr().err
        assert not Path(root).exists()


class TestLaunchers:
    """registry.load hands each launcher the daemon's settings."""

    def test_spares_off_is_one_setting(self) -> None:
        """warm_spares=False gives a local launcher with no spare pool."""
        launcher = registry.load("local", LaunchSettings(warm_spares=False))
        assert isinstance(launcher, LocalLauncher)
        assert launcher.spares is None

    def test_spares_are_on_by_default(self) -> None:
        """The default local launcher keeps warm spares."""
        launcher = registry.load("local")
        assert isinstance(launcher, LocalLauncher)
        assert launcher.spares is not None

    def test_the_slurm_launcher_takes_its_options(self) -> None:
        """The Slurm launcher's sbatch settings are the daemon's --slurm-* options."""
        options = SlurmOptions(partition="p", account="a", time_limit="7", signal_lead_s=9)
        launcher = registry.load("slurm", LaunchSettings(name="slurm", slurm=options))
        assert isinstance(launcher, SlurmLauncher)
        assert launcher.slurm == SlurmSettings(
            partition="p", account="a", time_limit="7", signal_lead_s=9
        )
