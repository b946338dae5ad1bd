"""CURVE security of §9: the server's key pair, ZAP, and who may do what.

Keys are z85 text, as `zmq.auth` writes them in certificate files (`NAME.key`
holds a public key, `NAME.key_secret` the pair). A `KeyPolicy` is an immutable
picture of the key directories; `Security.reload()` (SIGHUP) builds a new one
and swaps it in, so the ZAP thread and the serving loop never see half a
reload. The role decision itself is `zns.core.keys.KeyPolicy.check`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
import zmq.auth

from zns.core.errors import KeyFileError, NoPermission
from zns.core.keys import BROKER_NAMES, KeyPolicy
from zns.core.schema import AnyRequest
from zns.drivers.io_errors import configured

if TYPE_CHECKING:  # imported by `start` only: zmq.auth.thread imports asyncio and ssl, some
    # megabytes in every process of a server that runs without CURVE
    from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger("zns")

ZAP_DOMAIN = "zns"
# The followers' endpoint (--followers): its own domain, so that only the keys of
# --followers-keys get in there (and --clients any lets no key in there).
FOLLOWERS_DOMAIN = "zns-followers"


def read_certificate(path: str | os.PathLike[str]) -> tuple[str, str | None, dict[str, str]]:
    """(public key, secret key or None, metadata) of one `zmq.auth` certificate file."""
    with configured(f"cannot read certificate {path}: ", KeyFileError):
        public, secret = zmq.auth.load_certificate(path)
    metadata: dict[str, str] = {}
    section = ""
    # zmq.auth.load_certificate skips the metadata section; it is ZPL, one level deep.
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            section = line.strip()
        elif section == "metadata" and "=" in line:
            name, value = line.split("=", 1)
            metadata[name.strip()] = value.strip().strip("'\"")
    return _key_text(public, path), _key_text(secret, path) if secret else None, metadata


def _key_text(key: bytes, path: str | os.PathLike[str]) -> str:
    if len(key) != 40:
        raise KeyFileError(f"certificate {path}: a CURVE key is 40 z85 characters, got {len(key)}")
    return key.decode("ascii")


def _public_keys(directory: str | None) -> dict[str, dict[str, str]]:
    """Public key -> metadata of every `*.key` certificate in `directory`."""
    if not directory:
        return {}
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise KeyFileError(f"key directory {path} does not exist or is not a directory")
    keys = {}
    for cert in sorted(path.glob("*.key")):
        public, _, metadata = read_certificate(cert)
        keys[public] = metadata
    return keys


def _key_names(*directories: str | None) -> dict[str, str]:
    """Public key -> its name (NAME of the NAME.key certificate) in these directories."""
    names = {}
    for directory in directories:
        if directory:
            for cert in sorted(Path(directory).expanduser().glob("*.key")):
                names[read_certificate(cert)[0]] = cert.stem
    return names


def load_policy(
    brokers_keys: str | None, admins_keys: str | None, clients_keys: str | None, clients: str,
) -> KeyPolicy:
    if clients not in ("any", "listed"):
        raise KeyFileError(f"--clients must be 'any' or 'listed', not {clients!r}")
    brokers = {}
    for key, metadata in _public_keys(brokers_keys).items():
        bound = metadata.get(BROKER_NAMES)
        brokers[key] = None if bound is None else frozenset(
            n.strip() for n in bound.split(",") if n.strip()
        )
    return KeyPolicy(
        brokers=brokers,
        admins=frozenset(_public_keys(admins_keys)),
        clients=frozenset(_public_keys(clients_keys)),
        clients_any=clients == "any",
    )


class Security:
    """The server side of CURVE: apply it to sockets, run ZAP, authorize requests."""

    def __init__(
        self,
        curve_secret: str,
        brokers_keys: str | None = None,
        admins_keys: str | None = None,
        clients_keys: str | None = None,
        clients: str = "any",
        followers_keys: str | None = None,
    ) -> None:
        public, secret, _ = read_certificate(Path(curve_secret).expanduser())
        if secret is None:
            raise KeyFileError(
                f"{curve_secret} holds no secret key: give the NAME.key_secret file "
                f"that `zns keygen` wrote"
            )
        self.public_key, self._secret_key = public, secret
        self._dirs = (brokers_keys, admins_keys, clients_keys, clients)
        self._followers_keys = followers_keys
        self.policy = self._load()
        self.followers = frozenset(_public_keys(followers_keys))
        self._names = _key_names(*self._dirs[:3])
        self._follower_names = _key_names(followers_keys)
        self._auth: ThreadAuthenticator | None = None

    def start(self, ctx: zmq.Context) -> None:
        """Start the ZAP handler; one per context (it binds a fixed inproc endpoint)."""
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("zns.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self)
        if self._followers_keys is not None:
            self._auth.configure_curve_callback(FOLLOWERS_DOMAIN, credentials_provider=self)
        self._log_policy("loaded")

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def apply(self, sock: zmq.Socket, domain: str = ZAP_DOMAIN) -> None:
        """Make `sock` a CURVE server checked by ZAP in `domain`; call before bind."""
        sock.curve_server = True
        sock.curve_secretkey = self._secret_key.encode()
        sock.curve_publickey = self.public_key.encode()
        sock.zap_domain = domain.encode()

    def reload(self) -> bool:
        """Re-read the key directories; on any error keep the current policy."""
        try:
            self.policy = self._load()  # one assignment: the ZAP thread sees old or new
            self.followers = frozenset(_public_keys(self._followers_keys))
            self._names = _key_names(*self._dirs[:3])
            self._follower_names = _key_names(self._followers_keys)
        except KeyFileError as exc:
            log.error("keys not reloaded, the previous ones stay in force: %s", exc)
            return False
        self._log_policy("reloaded")
        return True

    def _load(self) -> KeyPolicy:
        # Peer NameServers (§10) connect with this server's own key pair (a cluster's
        # NameServers share one): it is always a client key.
        policy = load_policy(*self._dirs)
        return replace(policy, clients=policy.clients | {self.public_key})

    def peer_client(self, ctx: zmq.Context) -> None:
        """Make sockets created from now on in `ctx` CURVE clients with this server's key
        pair, of peers that have the same public key."""
        apply_client_keys(ctx, (self.public_key.encode(), self.public_key.encode(),
                                self._secret_key.encode()))

    # ZAP (called from the authenticator thread) ---------------------------

    def callback(self, domain: str, key: bytes) -> bool:
        text = key.decode("ascii")
        if domain == FOLLOWERS_DOMAIN:
            allowed = text in self.followers
            if not allowed:
                log.warning("refused a follower's CURVE handshake from unlisted key %s", text)
            return allowed
        allowed = self.policy.accepts(text)
        if not allowed:
            log.warning("refused a CURVE handshake from unknown key %s", text)
        return allowed

    # the NameService hook --------------------------------------------------

    def authorize(self, peer_key: str | None, request: AnyRequest) -> None:
        try:
            self.policy.check(peer_key, request)
        except NoPermission as exc:
            log.warning("no_permission for key %s: %s", peer_key, exc)
            raise

    def key_name(self, peer_key: str) -> str | None:
        """The name of a listed key (its certificate's file name, without `.key`), for
        audit lines; None for a key no directory lists (--clients any)."""
        return self._names.get(peer_key)

    def follower_name(self, key: str) -> str | None:
        """The name of a key of --followers-keys (its file name without `.key`)."""
        return self._follower_names.get(key)

    def check_keyless(self, request: AnyRequest) -> None:
        """The RocketMQ remoting listener's hook: its requests carry no key."""
        try:
            self.policy.check_keyless(request)
        except NoPermission as exc:
            log.warning("no_permission for a request without a key: %s", exc)
            raise

    def _log_policy(self, verb: str) -> None:
        p = self.policy
        log.info(
            "CURVE on (server key %s): %s %d broker, %d admin, %d client keys; clients: %s",
            self.public_key, verb, len(p.brokers), len(p.admins), len(p.clients),
            "any key" if p.clients_any else "listed keys only",
        )


def write_keypair(directory: str | os.PathLike[str], name: str,
                  broker_names: str | None = None) -> tuple[str, str]:
    """`zns keygen`: NAME.key (public) and NAME.key_secret in `directory`.

    With `broker_names`, both files carry the metadata that binds a broker key
    to those names (zmq.auth writes metadata into the secret file only, but it
    is the public file that goes into the server's `--brokers-keys` directory).
    """
    os.makedirs(directory, exist_ok=True)
    metadata = {BROKER_NAMES: f'"{broker_names}"'} if broker_names else None
    public_file, secret_file = zmq.auth.create_certificates(directory, name, metadata)
    if metadata:
        text = Path(public_file).read_text(encoding="utf-8")
        line = f"    {BROKER_NAMES} = {metadata[BROKER_NAMES]}\n"
        Path(public_file).write_text(text.replace("metadata\n", "metadata\n" + line, 1),
                                     encoding="utf-8")
    os.chmod(secret_file, 0o600)
    return public_file, secret_file


def client_keys(server_key: str, keypair_file: str | None = None) -> tuple[bytes, bytes, bytes]:
    """(server public, own public, own secret) for a CURVE client.

    `server_key` is z85 text or a certificate file; without `keypair_file` a fresh
    key pair is made, which a server started with `--clients any` accepts for client ops.
    """
    if os.path.exists(server_key):
        server_key = read_certificate(server_key)[0]
    if len(server_key) != 40:
        raise KeyFileError(f"server key {server_key!r}: neither a certificate file nor 40 z85 "
                           f"characters")
    if not keypair_file:
        public_b, secret_b = zmq.curve_keypair()
        return server_key.encode(), public_b, secret_b
    public, secret, _ = read_certificate(Path(keypair_file).expanduser())
    if secret is None:
        raise KeyFileError(f"{keypair_file} holds no secret key (give NAME.key_secret)")
    return server_key.encode(), public.encode(), secret.encode()


def apply_client_keys(target: zmq.Socket | zmq.Context, keys: tuple[bytes, bytes, bytes]) -> None:
    """On a socket (before connect), or on a context: every socket it makes from now on."""
    server, public, secret = keys
    target.setsockopt(zmq.CURVE_SERVERKEY, server)
    target.setsockopt(zmq.CURVE_PUBLICKEY, public)
    target.setsockopt(zmq.CURVE_SECRETKEY, secret)


def curve_client(sock: zmq.Socket, server_key: str, keypair_file: str | None = None) -> None:
    """Make `sock` a CURVE client (call before connect); see `client_keys`."""
    apply_client_keys(sock, client_keys(server_key, keypair_file))


def curve_context(server_key: str, keypair_file: str | None = None,
                  context: zmq.Context | None = None) -> zmq.Context:
    """A context whose sockets are CURVE clients of a NameServer: hand it to
    `BrokerAgent(..., context=)`, `RouteClient`, `AsyncRouteClient` or `call*`."""
    ctx = context or zmq.Context()
    apply_client_keys(ctx, client_keys(server_key, keypair_file))
    return ctx
