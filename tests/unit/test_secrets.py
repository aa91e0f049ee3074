"""The API key a deploy sends to the host's `--config` file: a key that is there but unusable
(empty, binary, several lines, control characters, readable by every user) stops the deploy with
exit 2 before any play, naming the file or variable and never the key."""

from __future__ import annotations

import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.errors import InputError
from orchestrator.hosts import deploy, secrets
from orchestrator.profile import model as profile_mod

KEY = "s3cr3t-key"


def keyed_profile(tmp_path: Path, ref: str) -> Path:
    prof = tmp_path / "keyed.yml"
    prof.write_text(f"extends: cg_5tok\napi_key: {ref}\n")
    return prof


def key_of(tmp_path: Path, ref: str) -> str:
    return secrets.api_key(profile_mod.load(str(keyed_profile(tmp_path, ref))))


def key_file(folder: Path, content: bytes, mode: int = 0o600) -> Path:
    path = folder / "api.key"
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user can enter (pytest's tmp_path is 0700, so nothing in it is readable by others)."""
    folder = Path(tempfile.mkdtemp(prefix="orch-key-"))
    folder.chmod(0o755)
    if not all(p.stat().st_mode & stat.S_IXOTH for p in folder.parents):
        pytest.skip(f"{folder.parent} is not open to other users here")
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty: the server would start with no API key"),
        (b" \n\n", "is empty"),
        (b"s3cr\x00et\n", "holds NUL bytes"),
        (b"\xff\xfe" + KEY.encode(), "is not UTF-8 text"),
        (f"{KEY}\nsecond line\n".encode(), "holds 2 lines: the key must be one line"),
        (f"{KEY}\r\nsecond\r\n".encode(), "holds 2 lines"),
        (f"s3cr\x1b[31m{KEY}".encode(), r"holds '\x1b' at position 5: the key must be printable ASCII"),
        (f"{KEY}\tx".encode(), r"holds '\t'"),
        (f"{KEY}é".encode(), "holds a non-ASCII character"),
    ],
)
def test_an_unusable_key_file_is_an_error_naming_it(tmp_path: Path, content: bytes, problem: str) -> None:
    path = key_file(tmp_path, content)
    with pytest.raises(InputError) as caught:
        key_of(tmp_path, f"{{file: {path}}}")
    message = str(caught.value)
    assert message.startswith(f"api_key.file: {path} ") and problem in message
    assert KEY not in message


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        (f"{KEY}\nsecond", "holds 2 lines"),
        (f"\x1b[31m{KEY}", r"holds '\x1b' at position 1"),
        (f"{KEY}\udcff", "is not UTF-8 text"),  # how os.environ holds a byte that is not UTF-8
    ],
)
def test_an_unusable_key_variable_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("ORCH_TEST_KEY", value)
    with pytest.raises(InputError) as caught:
        key_of(tmp_path, "{env: ORCH_TEST_KEY}")
    message = str(caught.value)
    assert message.startswith("api_key.env: $ORCH_TEST_KEY ") and problem in message
    assert KEY not in message


def test_a_key_loses_the_blanks_around_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = key_file(tmp_path, f"{KEY}\r\n".encode())
    assert key_of(tmp_path, f"{{file: {path}}}") == KEY
    monkeypatch.setenv("ORCH_TEST_KEY", f" {KEY}\n")
    assert key_of(tmp_path, "{env: ORCH_TEST_KEY}") == KEY


@pytest.mark.parametrize(("mode", "verb"), [(0o644, "read"), (0o604, "read"), (0o602, "written")])
def test_a_key_file_every_user_can_read_or_write_is_refused(open_dir: Path, mode: int, verb: str) -> None:
    path = key_file(open_dir, KEY.encode(), mode)
    with pytest.raises(InputError, match=f"can be {verb} by any user on this machine: chmod o-"):
        key_of(open_dir, f"{{file: {path}}}")
    path.chmod(0o640)  # the owner's group may share it
    assert key_of(open_dir, f"{{file: {path}}}") == KEY


def test_a_symlink_into_a_secrets_mount_is_followed(open_dir: Path) -> None:
    # As a secrets manager's mount: 0644 files, in a folder only its owner may enter.
    mount = open_dir / "mount"
    mount.mkdir(mode=0o700)
    target = key_file(mount, f"{KEY}\n".encode(), 0o644)
    link = open_dir / "key-link"
    link.symlink_to(target)
    assert key_of(open_dir, f"{{file: {link}}}") == KEY
    mount.chmod(0o755)  # now anyone can reach the file the link points to
    with pytest.raises(InputError, match=f"api_key.file: {link} can be read by any user.*chmod o-r {target}"):
        key_of(open_dir, f"{{file: {link}}}")


def test_a_missing_key_file_or_variable_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match="does not exist on this machine"):
        key_of(tmp_path, f"{{file: {tmp_path / 'nope'}}}")
    monkeypatch.delenv("ORCH_TEST_KEY", raising=False)
    with pytest.raises(InputError, match=r"\$ORCH_TEST_KEY is not set"):
        key_of(tmp_path, "{env: ORCH_TEST_KEY}")


@pytest.fixture
def no_play(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(deploy, "run_playbook", lambda *a, **k: pytest.fail("a play ran"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n")
    return inv


def test_deploy_with_an_empty_key_file_stops_before_any_play(tmp_path: Path, no_play: Path) -> None:
    path = key_file(tmp_path, b"\n")
    prof = keyed_profile(tmp_path, f"{{file: {path}}}")
    done = CliRunner().invoke(cli, ["deploy", "-i", str(no_play), "-p", str(prof)])
    assert done.exit_code == 2, done.output
    assert done.output == f"error: api_key.file: {path} is empty: the server would start with no API key\n"


def test_deploy_with_a_two_line_key_variable_stops_before_any_play(
    tmp_path: Path, no_play: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_TEST_KEY", f"{KEY}\n{KEY}")
    prof = keyed_profile(tmp_path, "{env: ORCH_TEST_KEY}")
    done = CliRunner().invoke(cli, ["deploy", "-i", str(no_play), "-p", str(prof)])
    assert done.exit_code == 2, done.output
    assert "api_key.env: $ORCH_TEST_KEY holds 2 lines" in done.output and KEY not in done.output


@pytest.mark.parametrize(
    ("field", "where"),
    [
        ("api_key: {file: '~nosuchuser/key'}", "api_key.file"),
        ("service: {environment_files: ['~nosuchuser/env']}", "service.environment_files[0]"),
        ("secret_env: {TOKEN: {file: '~nosuchuser/t'}}", "secret_env.TOKEN.file"),
    ],
)
def test_a_home_of_a_user_this_machine_lacks_is_one_line(
    tmp_path: Path, no_play: Path, field: str, where: str
) -> None:
    """Path.expanduser raises RuntimeError for `~nosuchuser`: it was an internal error."""
    prof = tmp_path / "home.yml"
    prof.write_text(f"extends: cg_5tok\n{field}\n")
    done = CliRunner().invoke(cli, ["deploy", "-i", str(no_play), "-p", str(prof)])
    assert done.exit_code == 2, done.output
    user = "'~nosuchuser/" + field.split("~nosuchuser/", 1)[1].split("'", 1)[0] + "'"
    assert (
        done.output == f"error: {where}: {user}: this machine has no user 'nosuchuser'; give the full path\n"
    )


def test_secret_config_quotes_the_key_for_yaml(tmp_path: Path) -> None:
    path = key_file(tmp_path, b'a"b\\c\n')
    prof = profile_mod.load(str(keyed_profile(tmp_path, f"{{file: {path}}}")))
    assert secrets.secret_config(prof) == 'api-key: "a\\"b\\\\c"\n'
