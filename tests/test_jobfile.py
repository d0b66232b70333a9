"""Job files: one frozen Job out of a good file, every problem listed for a bad one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from jobwarden.errors import JobFileError
from jobwarden.hashing import config_hash
from jobwarden.jobfile import MAX_JOB_FILE_BYTES, load_job
from jobwarden.jobwarnings import job_warnings


def problems_of(path: Path, text: str) -> list[str]:
    """The problems listed for a job file holding ``text``."""
    path.write_text(text)
    with pytest.raises(JobFileError) as caught:
        load_job(path)
    return caught.value.problems


def test_minimal_file_gets_the_lesson_defaults(tmp_path: Path) -> None:
    """A file naming only id and task is the lesson's default job."""
    spec = tmp_path / "j.toml"
    spec.write_text('id = "demo"\ntask = "linreg"\n')
    job = load_job(spec)
    assert job.train_fields() == {
        "seed": 3,
        "learning_rate": 0.04,
        "momentum": 0.8,
        "batch_size": 8,
    }
    assert (job.run.steps, job.run.checkpoint_every, job.run.keep_checkpoints) == (8, 2, 3)
    assert job.run.resume == "auto"
    assert job.checkpoint == "demo"
    assert not job.faults.active()


def test_job_is_frozen(tmp_path: Path) -> None:
    """The parsed job cannot be changed after validation."""
    spec = tmp_path / "j.toml"
    spec.write_text('id = "demo"\ntask = "linreg"\n')
    job = load_job(spec)
    with pytest.raises(ValidationError):
        job.run.steps = 9  # type: ignore[misc]


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    """Unknown fields, wrong types, ranges, NaN and a bad id are all reported together."""
    found = problems_of(
        tmp_path / "bad.toml",
        """
id = "a/b"
task = "linreg"
colour = "blue"
[train]
learning_rate = nan
momentum = true
batch_size = 100
[run]
steps = 0
[faults]
fail_afterr = 3
""",
    )
    expected_fields = [
        "id",
        "colour",
        "train.learning_rate",
        "train.momentum",
        "train.batch_size",
        "run.steps",
        "faults.fail_afterr",
    ]
    for name in expected_fields:
        assert any(p.startswith(f"{name}:") for p in found), (name, found)
    assert len(found) == len(expected_fields)
    assert any("unknown field" in p and "colour" in p for p in found)
    assert any("finite" in p for p in found)


def test_unknown_task_names_the_known_ones(tmp_path: Path) -> None:
    """An unknown task is one problem that lists the registered tasks."""
    found = problems_of(tmp_path / "t.toml", 'id = "x"\ntask = "resnet"\n')
    assert found == ["task: unknown task 'resnet' (known: dp_mlp, linreg, mlp, sharded_mlp)"]


@pytest.mark.parametrize("name", ["../up", "a/b", "..", ".", "x" * 65, ""])
def test_checkpoint_names_that_are_not_one_safe_segment_are_refused(
    tmp_path: Path, name: str
) -> None:
    """A checkpoint name with a separator, '..' or out of length is refused."""
    found = problems_of(tmp_path / "c.toml", f'id = "x"\ntask = "linreg"\ncheckpoint = "{name}"\n')
    assert [p.split(":")[0] for p in found] == ["checkpoint"]


def test_json_job_files_are_accepted(tmp_path: Path) -> None:
    """The same schema in JSON."""
    spec = tmp_path / "j.json"
    spec.write_text('{"id": "j", "task": "mlp", "train": {"width": 8}, "run": {"steps": 3}}')
    job = load_job(spec)
    assert (job.task, job.train_fields()["width"], job.run.steps) == ("mlp", 8, 3)


def test_syntax_errors_and_oversized_files_are_refused(tmp_path: Path) -> None:
    """Bad TOML and a file over the size limit each get one clear problem."""
    assert problems_of(tmp_path / "s.toml", 'id = "x\n')[0].startswith("syntax:")
    big = 'id = "x"\ntask = "linreg"\n' + "#" * MAX_JOB_FILE_BYTES
    assert "over the" in problems_of(tmp_path / "b.toml", big)[0]


def test_faults_that_could_never_fire_are_refused(tmp_path: Path) -> None:
    """A fault past the last step, or a commit crash at a step with no commit, is a mistake."""
    found = problems_of(
        tmp_path / "f.toml",
        'id = "x"\ntask = "linreg"\n[faults]\nfail_after = 9\ncrash_in_commit = 3\n',
    )
    assert found == [
        "faults.fail_after: 9 is past run.steps = 8; the fault would never fire",
        "faults.crash_in_commit: step 3 is not a checkpoint step (checkpoint_every = 2, steps = 8)",
    ]


def test_operational_fields_do_not_change_the_config_hash(tmp_path: Path) -> None:
    """steps, faults and resume policy are not training fields; learning_rate is."""
    a, b, c = tmp_path / "a.toml", tmp_path / "b.toml", tmp_path / "c.toml"
    a.write_text('id = "x"\ntask = "linreg"\n')
    b.write_text(
        'id = "x"\ntask = "linreg"\n[run]\nsteps = 20\nresume = "require"\n'
        "[faults]\nfail_after = 3\n"
    )
    c.write_text('id = "x"\ntask = "linreg"\n[train]\nlearning_rate = 0.05\n')
    ja, jb, jc = load_job(a), load_job(b), load_job(c)
    assert config_hash(ja.task, ja.train_fields()) == config_hash(jb.task, jb.train_fields())
    assert config_hash(ja.task, ja.train_fields()) != config_hash(jc.task, jc.train_fields())


def test_a_misspelled_field_names_the_one_meant(tmp_path: Path) -> None:
    """An unknown field close to a real one says which, in every section and in [train]."""
    found = problems_of(
        tmp_path / "j.toml",
        'id = "x"\ntask = "linreg"\ncheckpiont = "c"\n[run]\nstepz = 3\n'
        "[supervision]\nstal_timeout_s = 3\n[train]\nlearning_rat = 0.1\n",
    )
    assert sorted(found) == [
        "checkpiont: unknown field; did you mean 'checkpoint'? (found 'c')",
        "run.stepz: unknown field; did you mean 'steps'? (found 3)",
        "supervision.stal_timeout_s: unknown field; did you mean 'stall_timeout_s'? (found 3)",
        "train.learning_rat: unknown field; did you mean 'learning_rate'? (found 0.1)",
    ]
    far = problems_of(tmp_path / "k.toml", 'id = "x"\ntask = "linreg"\n[run]\nzzz = 1\n')
    assert far == ["run.zzz: unknown field (found 1)"]


def test_supervision_defaults_are_safe_for_real_models(tmp_path: Path) -> None:
    """The stall timeout is automatic and the rss limit off unless a job sets them."""
    spec = tmp_path / "j.toml"
    spec.write_text('id = "demo"\ntask = "linreg"\n')
    sup = load_job(spec).supervision
    assert (sup.stall_timeout_s, sup.max_rss_mb) == (None, None)
    assert (sup.startup_timeout_s, sup.max_restarts, sup.stop_grace_s) == (60.0, 3, 30.0)


def test_settings_that_cannot_work_are_warned_about(tmp_path: Path) -> None:
    """A stall timeout under the job's own step delay, a tiny startup timeout or rss
    limit: each warned about, naming the field; a sane file gets no warning."""
    spec = tmp_path / "j.toml"
    spec.write_text(
        'id = "w"\ntask = "linreg"\n[faults]\nstep_delay_s = 6\n'
        "[supervision]\nstall_timeout_s = 5\nstartup_timeout_s = 2\nmax_rss_mb = 100\n"
    )
    warned = job_warnings(load_job(spec))
    assert [w.split(" = ")[0] for w in warned] == [
        "supervision.stall_timeout_s",
        "supervision.startup_timeout_s",
        "supervision.max_rss_mb",
    ]
    spec.write_text('id = "w"\ntask = "linreg"\n[supervision]\nstall_timeout_s = 30\n')
    assert job_warnings(load_job(spec)) == []


def test_submit_prints_the_warnings(tmp_path: Path) -> None:
    """`wardenctl submit` says the warning on stderr before it asks the daemon."""
    spec = tmp_path / "w.toml"
    spec.write_text(
        'id = "w"\ntask = "linreg"\n[faults]\nstep_delay_s = 6\n'
        "[supervision]\nstall_timeout_s = 5\n"
    )
    wardenctl = Path(sys.executable).parent / "wardenctl"
    done = subprocess.run(
        [wardenctl, "--socket", tmp_path / "none.sock", "submit", spec],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "warning: supervision.stall_timeout_s = 5 is not longer than" in done.stderr
    assert done.returncode != 0  # no daemon there
