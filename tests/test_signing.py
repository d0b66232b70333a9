"""Keyed checkpoint signatures: the checksum catches accidents, the signature catches rewrites."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from jobwarden import files
from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import ChecksumMismatch, CorruptCheckpoint, SignatureMismatch
from jobwarden.checkpoint.lock import WriterLock
from jobwarden.checkpoint.signing import UnsafeSigningKey, load_key
from jobwarden.checkpoint.store import CheckpointStore, file_name
from jobwarden.worker.command import worker_argv
from tests import samples
from tests.daemon import Daemon, linreg_job
from tests.helpers import job

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """A private key file: ours, mode 0600, 32 bytes."""
    path = tmp_path / "signing.key"
    path.write_bytes(KEY)
    path.chmod(0o600)
    return path


def signed(path: Path, step: int = 2, key: bytes = KEY) -> Path:
    """Commit the sample state at ``path``, signed with ``key``."""
    state = samples.leaves()
    files.commit(path, format.encode(samples.manifest(state, step), state, key))
    return path


def forged(path: Path, keep_signature: bool) -> Path:
    """Rewrite a checkpoint's velocity as someone without the key would: checksum recomputed.

    ``keep_signature`` copies the old signature into the new header.
    """
    old = format.read(path)
    state = [(p, np.array(a)) for p, a in old.leaves()]
    state[1][1][0] += 1.0
    manifest = dataclasses.replace(old.manifest, created=old.manifest.created + 1)
    buffers = format.encode(manifest, state)
    if keep_signature:
        header = bytes(buffers[0])
        meta = json.loads(header[8:])
        meta["__metadata__"]["signature"] = old.signature
        text = json.dumps(meta, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        buffers[0] = memoryview(len(text).to_bytes(8, "little") + text)
    files.commit(path, buffers)
    return path


class TestFormat:
    """Signing in the container: stored beside the checksum, checked only with a key."""

    def test_signed_round_trip(self, tmp_path: Path) -> None:
        """A signed file verifies with its key and lists the signature among the checks."""
        checkpoint = format.read(signed(tmp_path / "f"), KEY)
        assert checkpoint.signature is not None
        assert checkpoint.signature.startswith("hmac-sha256:")
        assert checkpoint.checks == ("readable", "checksum", "signature", "schema")

    def test_signed_files_stay_readable_without_the_key(self, tmp_path: Path) -> None:
        """Without a key (inspect, other tools) a signed file reads as before."""
        path = signed(tmp_path / "f")
        checkpoint = format.read(path)
        assert checkpoint.checks == ("readable", "checksum", "schema")
        assert checkpoint.signature is not None
        assert sorted(load_file(str(path))) == ["key", "opt_state/velocity", "params"]

    def test_unsigned_file_is_refused_with_a_key(self, tmp_path: Path) -> None:
        """A reader holding a key refuses an unsigned file before reading its data."""
        state = samples.leaves()
        path = tmp_path / "f"
        files.commit(path, format.encode(samples.manifest(state), state))
        with pytest.raises(SignatureMismatch, match="unsigned"):
            format.read(path, KEY)

    def test_another_key_is_refused(self, tmp_path: Path) -> None:
        """Signed with one key, verified with another: refused."""
        with pytest.raises(SignatureMismatch, match="does not match"):
            format.read(signed(tmp_path / "f"), OTHER_KEY)

    @pytest.mark.parametrize("keep_signature", [False, True])
    def test_a_rewrite_without_the_key_is_a_signature_refusal(
        self, tmp_path: Path, keep_signature: bool
    ) -> None:
        """Data changed and checksum recomputed (signature dropped or kept): signature refusal."""
        path = forged(signed(tmp_path / "f"), keep_signature)
        assert format.read(path).manifest.step == 2  # the checksum alone accepts it
        with pytest.raises(SignatureMismatch) as caught:
            format.read(path, KEY)
        assert isinstance(caught.value, CorruptCheckpoint)

    def test_an_accident_is_still_a_checksum_refusal(self, tmp_path: Path) -> None:
        """A flipped data bit in a signed file is reported by the checksum, not the signature."""
        path = signed(tmp_path / "f")
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.raises(ChecksumMismatch):
            format.read(path, KEY)


class TestStore:
    """A store with a key signs every commit and passes over what its key does not verify."""

    def test_a_forged_newest_is_quarantined_and_the_older_used(self, tmp_path: Path) -> None:
        """The newest rewritten without the key: quarantined as checkpoint.signature."""
        ck = tmp_path / "ck"
        with WriterLock(ck) as lock:
            store = CheckpointStore(ck, lock, KEY)
            for step in (2, 4):
                state = samples.leaves()
                store.commit(step, samples.manifest(state, step), state)
        forged(ck / file_name(4), keep_signature=True)
        selection = CheckpointStore(ck, signing_key=KEY).select(samples.expected(samples.leaves()))
        assert selection.checkpoint is not None
        assert selection.checkpoint.manifest.step == 2
        assert "signature" in selection.checks
        assert [(s.file, s.code) for s in selection.skipped] == [
            (file_name(4), "checkpoint.signature")
        ]
        assert (ck / "quarantine" / file_name(4)).exists()


class TestKeyFile:
    """The key file must be a private regular file of ours."""

    def test_a_private_key_loads(self, key_file: Path) -> None:
        """Ours, 0600, 32 bytes: its bytes are the key."""
        assert load_key(key_file) == KEY

    @pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
    def test_a_key_others_can_read_is_refused(self, key_file: Path, mode: int) -> None:
        """Any group or other permission is refused, naming the mode."""
        key_file.chmod(mode)
        with pytest.raises(UnsafeSigningKey, match=f"mode {mode:04o}"):
            load_key(key_file)

    def test_a_key_of_another_user_is_refused(self, key_file: Path) -> None:
        """Owned by another uid: refused, naming the owner."""
        os.chown(key_file, 65534, 65534)
        with pytest.raises(UnsafeSigningKey) as caught:
            load_key(key_file)
        assert caught.value.evidence["owner"] == 65534

    def test_a_symlinked_key_is_refused(self, key_file: Path, tmp_path: Path) -> None:
        """A link to a good key is still refused: the key must be a regular file."""
        (tmp_path / "link").symlink_to(key_file)
        with pytest.raises(UnsafeSigningKey, match="symbolic link"):
            load_key(tmp_path / "link")

    def test_a_short_key_is_refused(self, key_file: Path) -> None:
        """Fewer than 16 bytes is refused."""
        key_file.write_bytes(b"short")
        with pytest.raises(UnsafeSigningKey, match="5 bytes"):
            load_key(key_file)


class TestWorker:
    """The worker's ``--signing-key``: signs, restores only what verifies, refuses a loose key."""

    def test_worker_argv_passes_the_key_file(self, tmp_path: Path) -> None:
        """worker_argv adds --signing-key with the file's path."""
        argv = worker_argv(tmp_path / "j", tmp_path / "ck", signing_key=tmp_path / "k")
        assert argv[-2:] == ["--signing-key", str(tmp_path / "k")]

    def test_a_loose_key_is_refused_before_the_directory_is_touched(
        self, tmp_path: Path, key_file: Path
    ) -> None:
        """A 0644 key: exit 6, worker.signing_key_unsafe, no checkpoint directory made."""
        key_file.chmod(0o644)
        done = subprocess.run(
            worker_argv(job(tmp_path / "j.toml", "s"), tmp_path / "ck", signing_key=key_file),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == UnsafeSigningKey.exit_status == 6
        assert json.loads(done.stdout.splitlines()[-1])["code"] == "worker.signing_key_unsafe"
        assert not (tmp_path / "ck").exists()

    @pytest.mark.slow
    def test_signed_run_resumes_and_passes_over_a_forgery(
        self, tmp_path: Path, key_file: Path, compile_cache: Path
    ) -> None:
        """Fail after 5, forge step 4, resume with the key: step 2 restored, forgery quarantined."""
        ck = tmp_path / "ck"

        def attempt(**faults: int) -> list[dict[str, object]]:
            spec = job(tmp_path / "s.toml", "signed", faults=faults)
            done = subprocess.run(
                worker_argv(spec, ck, compile_cache, key_file),
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )
            return [json.loads(line) for line in done.stdout.splitlines()]

        first = attempt(fail_after=5)
        assert first[-1]["code"] == "worker.injected_failure"
        assert format.read(ck / file_name(4), KEY).signature is not None
        forged(ck / file_name(4), keep_signature=True)
        events = attempt()
        (restored,) = [e for e in events if e["event"] == "restored"]
        assert restored["step"] == 2
        assert "signature" in restored["checks"]  # type: ignore[operator]
        assert [s["code"] for s in restored["skipped"]] == ["checkpoint.signature"]  # type: ignore[attr-defined]
        assert events[-1]["event"] == "completed"
        shown = subprocess.run(
            [sys.executable, "-m", "jobwarden.control.cli", "inspect", str(ck / file_name(8))],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr


@pytest.mark.slow
def test_wardend_signing_key_signs_every_attempt_and_shows_it(
    tmp_path: Path, key_file: Path, compile_cache: Path
) -> None:
    """wardend --signing-key: a crash recovers verified, every checkpoint is signed with the
    key, and the checkpoints command checks the signatures."""
    with Daemon(tmp_path / "root", compile_cache, "--signing-key", str(key_file)) as daemon:
        daemon.drop("s.toml", linreg_job("s", faults={"fail_after": 3}))
        assert daemon.wait("s")["state"] == "completed"
        (incident,) = daemon.incidents("s")
        rows = daemon.ask("checkpoints", job="s")
    assert incident["status"] == "verified"
    assert "signature" in incident["recovery_point"]["checks"]
    committed = [r for r in rows if r["where"] == "committed"]
    assert committed
    assert all(r["signed"] and r["verdict"]["ok"] for r in committed)
    for row in committed:
        assert format.read(Path(row["file"]), KEY).signature is not None


def test_wardend_refuses_a_loose_signing_key(tmp_path: Path, key_file: Path) -> None:
    """A key readable by others stops wardend at start with the key's error, before any job."""
    key_file.chmod(0o644)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "jobwarden.daemon", "--root", str(tmp_path / "root")),
            *("--signing-key", str(key_file)),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (UnsafeSigningKey.exit_status, 1) == (done.returncode, len(done.stderr.splitlines()))
    assert str(key_file) in done.stderr
