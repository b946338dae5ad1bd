"""§9's key files and the server side of CURVE (zns.drivers.security) without a server:
certificates, key directories, the policy they make, reloads, ZAP's decision, and the keys
that land on sockets and contexts. tests/test_security.py runs CURVE between live peers."""

from __future__ import annotations

import locale
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth.thread
from zmq.auth.thread import ThreadAuthenticator

from helpers import register_fields
from zns.core import schema
from zns.core.errors import KeyFileError, NoPermission
from zns.drivers.security import (
    ZAP_DOMAIN, Security, _public_keys, client_keys, curve_client,
    curve_context, load_policy, read_certificate, write_keypair,
)

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """Stands in for a socket or context: libzmq does not read CURVE keys back."""

    def __init__(self) -> None:
        self.options: dict[int, object] = {}

    def setsockopt(self, option: int, value: object) -> None:
        self.options[option] = value

    def keys(self) -> tuple[object, object, object]:
        return tuple(self.options[o] for o in (zmq.CURVE_SERVERKEY, zmq.CURVE_PUBLICKEY,
                                                 zmq.CURVE_SECRETKEY))


def dirs(root: Path) -> dict[str, Path]:
    made = {role: root / role for role in ("brokers", "admins", "clients")}
    for path in made.values():
        path.mkdir(parents=True)
    return made


def listed(directory: Path, name: str, broker_names: str | None = None) -> str:
    """A key pair made in `private/`, its public file copied into `directory`; its public key."""
    public_file, _ = write_keypair(directory.parent / "private", name, broker_names)
    (directory / f"{name}.key").write_text(Path(public_file).read_text())
    return read_certificate(public_file)[0]


def test_a_certificate_reads_as_keys_and_only_its_metadata_section(tmp_path):
    public_file, secret_file = write_keypair(tmp_path, "b1", "a, b")
    text = Path(public_file).read_text()
    # Comments, blank lines and another section's settings are not metadata.
    Path(public_file).write_text(text + "\n# a comment = no\n\nother\n    x = 'y'\n")
    public, secret, metadata = read_certificate(public_file)
    assert len(public) == 40 and secret is None
    assert metadata == {"broker_names": "a, b"}
    pair_public, pair_secret, pair_metadata = read_certificate(secret_file)
    assert pair_public == public and len(pair_secret) == 40
    assert pair_metadata == {"broker_names": "a, b"}
    assert (Path(secret_file).stat().st_mode & 0o777) == 0o600
    plain_public, _ = write_keypair(tmp_path, "c1")
    assert read_certificate(plain_public)[2] == {}


def test_a_hand_written_certificate_s_metadata_is_read_as_zpl(tmp_path):
    # Written by hand, not by zmq.auth: comments inside the section (one indented and
    # holding "="), a tab for an indent, a value holding "=", quotes and X at its ends.
    public = zmq.curve_keypair()[0].decode()
    cert = tmp_path / "hand.key"
    cert.write_text("# made by hand\n"
                    "metadata\n"
                    "    # note = an indented comment is not metadata\n"
                    "# a comment does not end the section\n"
                    "\tbroker_names = 'Xb1, b2X'\n"
                    "    url = \"http://h/?a=b\"\n"
                    "curve\n"
                    f'    public-key = "{public}"\n', encoding="utf-8")
    assert read_certificate(cert) == (
        public, None, {"broker_names": "Xb1, b2X", "url": "http://h/?a=b"})


def test_a_bad_certificate_is_a_key_file_error(tmp_path):
    with pytest.raises(KeyFileError, match=f"cannot read certificate {tmp_path / 'nope.key'}"):
        read_certificate(tmp_path / "nope.key")
    short = tmp_path / "short.key"
    short.write_text('curve\n    public-key = "abc"\n')
    with pytest.raises(KeyFileError,
                       match=f"certificate {short}: a CURVE key is 40 z85 characters, got 3"):
        read_certificate(short)
    public = zmq.curve_keypair()[0].decode()
    short_secret = tmp_path / "short.key_secret"
    short_secret.write_text(f'curve\n    public-key = "{public}"\n    secret-key = "abcd"\n')
    with pytest.raises(KeyFileError,
                       match=f"certificate {short_secret}: a CURVE key is 40 z85 characters, got 4"):
        read_certificate(short_secret)


@pytest.fixture
def ascii_locale() -> Iterator[None]:
    """The process's text encoding made ASCII (LANG=C without Python's UTF-8 mode)."""
    if sys.flags.utf8_mode:
        pytest.skip("Python's UTF-8 mode ignores the locale's encoding")
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


def test_key_files_are_utf_8_whatever_the_locale(tmp_path, ascii_locale):
    assert locale.getpreferredencoding(False) != "UTF-8"  # the fixture took effect
    public_file, secret_file = write_keypair(tmp_path, "b1", "brøker-1")
    for path in (public_file, secret_file):
        assert read_certificate(path)[2] == {"broker_names": "brøker-1"}


def test_a_key_directory_lists_its_public_certificates(tmp_path):
    assert _public_keys(None) == {} and _public_keys("") == {}
    with pytest.raises(KeyFileError, match="does not exist or is not a directory"):
        _public_keys(str(tmp_path / "missing"))
    roles = dirs(tmp_path)
    key = listed(roles["brokers"], "b1", "x")
    (roles["brokers"] / "stray.key_secret").write_text("not read")
    assert _public_keys(str(roles["brokers"])) == {key: {"broker_names": "x"}}


def test_the_policy_binds_broker_keys_to_names_and_lists_roles(tmp_path):
    roles = dirs(tmp_path)
    bound = listed(roles["brokers"], "bound", " a , b ,, ")
    free = listed(roles["brokers"], "free")
    admin = listed(roles["admins"], "admin")
    client = listed(roles["clients"], "client")
    policy = load_policy(*(str(roles[r]) for r in ("brokers", "admins", "clients")), "listed")
    assert policy.brokers == {bound: frozenset({"a", "b"}), free: None}
    assert policy.admins == frozenset({admin}) and policy.clients == frozenset({client})
    assert not policy.clients_any
    assert load_policy(None, None, None, "any").clients_any
    with pytest.raises(KeyFileError, match="--clients must be 'any' or 'listed', not 'some'"):
        load_policy(None, None, None, "some")


def test_security_needs_a_secret_and_counts_its_own_key_as_a_client(tmp_path):
    public_file, secret_file = write_keypair(tmp_path / "server", "server")
    with pytest.raises(KeyFileError, match=f"{public_file} holds no secret key"):
        Security(public_file)
    roles = dirs(tmp_path)
    security = Security(secret_file, str(roles["brokers"]), str(roles["admins"]),
                        str(roles["clients"]), "listed")
    assert security.public_key == read_certificate(public_file)[0]
    assert security.policy.clients == frozenset({security.public_key})  # peers use it
    assert not security.policy.clients_any


def test_apply_makes_a_curve_server_checked_by_zap(tmp_path):
    secret_file = write_keypair(tmp_path, "server")[1]
    security = Security(secret_file)
    sock = Recorder()
    security.apply(sock)
    assert sock.curve_server is True
    assert sock.curve_publickey == security.public_key.encode()
    assert sock.curve_secretkey == read_certificate(secret_file)[1].encode()
    assert sock.zap_domain == ZAP_DOMAIN.encode()


def test_a_reload_swaps_the_policy_or_keeps_the_old_one(tmp_path, caplog):
    roles = dirs(tmp_path)
    security = Security(write_keypair(tmp_path / "server", "server")[1], str(roles["brokers"]),
                        str(roles["admins"]), str(roles["clients"]), "any")
    admin = listed(roles["admins"], "admin")
    listed(roles["clients"], "client")
    with caplog.at_level(logging.INFO, logger="zns"):
        assert security.reload()
    assert admin in security.policy.admins
    assert f"CURVE on (server key {security.public_key}): reloaded 0 broker, 1 admin, 2 client " \
           "keys; clients: any key" in [r.getMessage() for r in caplog.records]
    before = security.policy
    (roles["admins"] / "broken.key").write_text("not a certificate")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zns"):
        assert not security.reload()
    assert security.policy is before
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][0].startswith(
        "keys not reloaded, the previous ones stay in force: cannot read certificate")
    assert "reloaded" not in caplog.text.replace("not reloaded", "")


def test_zap_refuses_unknown_keys_and_authorize_logs_a_refusal(tmp_path, caplog):
    roles = dirs(tmp_path)
    security = Security(write_keypair(tmp_path / "server", "server")[1], str(roles["brokers"]),
                        None, None, "listed")
    broker = listed(roles["brokers"], "b", "broker-a")
    security.reload()
    stranger = zmq.curve_keypair()[0]
    with caplog.at_level(logging.WARNING, logger="zns"):
        assert security.callback(ZAP_DOMAIN, broker.encode())
        assert "refused" not in caplog.text
        assert not security.callback(ZAP_DOMAIN, stranger)
    assert [r.getMessage() for r in caplog.records] == [
        f"refused a CURVE handshake from unknown key {stranger.decode()}"]
    register_a = schema.decode_request(schema.encode(
        {"op": "register_broker", **register_fields("broker-a")}))
    register_b = schema.decode_request(schema.encode(
        {"op": "register_broker", **register_fields("broker-b")}))
    security.authorize(broker, register_a)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zns"), pytest.raises(NoPermission) as info:
        security.authorize(broker, register_b)
    assert [r.getMessage() for r in caplog.records] == [
        f"no_permission for key {broker}: {info.value}"]


def test_start_runs_zap_and_stop_ends_it(tmp_path, ctx, caplog, monkeypatch):
    made: list[ThreadAuthenticator] = []

    class Recorded(ThreadAuthenticator):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(zmq.auth.thread, "ThreadAuthenticator", Recorded)  # imported when CURVE starts
    security = Security(write_keypair(tmp_path, "server")[1], clients="listed")
    security.stop()  # never started: nothing to stop
    with caplog.at_level(logging.INFO, logger="zns"):
        security.start(ctx)
    (auth,) = made
    assert auth.is_alive()
    assert auth.log.name == "zns.zap"  # ZAP's own log lines, under zns
    assert f"CURVE on (server key {security.public_key}): loaded 0 broker, 0 admin, 1 client " \
           "keys; clients: listed keys only" in [r.getMessage() for r in caplog.records]
    stopped: list[object] = []
    monkeypatch.setattr(auth, "stop", lambda real=auth.stop: stopped.append(real()))
    security.stop()
    assert not auth.is_alive() and len(stopped) == 1
    security.stop()  # twice: nothing left to stop
    assert len(stopped) == 1 and len(made) == 1


def test_peer_client_makes_the_context_s_sockets_clients_of_the_same_key(tmp_path):
    secret_file = write_keypair(tmp_path, "server")[1]
    security = Security(secret_file)
    ctx = Recorder()
    security.peer_client(ctx)
    public = security.public_key.encode()
    assert ctx.keys() == (public, public, read_certificate(secret_file)[1].encode())


def test_client_keys_from_text_a_file_or_a_fresh_pair(tmp_path):
    server_public_file, _ = write_keypair(tmp_path, "server")
    server_key = read_certificate(server_public_file)[0]
    own_public_file, own_secret_file = write_keypair(tmp_path, "me")
    own_public, own_secret, _ = read_certificate(own_secret_file)
    assert client_keys(server_key, own_secret_file) == (
        server_key.encode(), own_public.encode(), own_secret.encode())
    assert client_keys(server_public_file, own_secret_file)[0] == server_key.encode()
    fresh = client_keys(server_key)
    assert fresh[0] == server_key.encode() and len(fresh[1]) == len(fresh[2]) == 40
    assert fresh[1] != own_public.encode() and client_keys(server_key)[1] != fresh[1]
    assert zmq.curve_public(fresh[2]) == fresh[1]  # a pair, not two unrelated keys
    with pytest.raises(KeyFileError, match="server key 'short': neither a certificate file"):
        client_keys("short")
    with pytest.raises(KeyFileError, match=f"{own_public_file} holds no secret key"):
        client_keys(server_key, own_public_file)
    sock = Recorder()
    curve_client(sock, server_key, own_secret_file)
    assert sock.keys() == client_keys(server_key, own_secret_file)


def test_curve_context_keys_every_socket_it_makes(tmp_path):
    server_key = read_certificate(write_keypair(tmp_path, "server")[0])[0]
    _, own_secret_file = write_keypair(tmp_path, "me")
    target = Recorder()
    assert curve_context(server_key, own_secret_file, context=target) is target
    assert target.keys() == client_keys(server_key, own_secret_file)
    own = curve_context(server_key)
    try:
        assert isinstance(own, zmq.Context) and own is not zmq.Context.instance()
    finally:
        own.destroy(linger=0)
