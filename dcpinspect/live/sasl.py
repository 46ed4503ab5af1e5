"""SASL mechanisms as Couchbase's memcached uses them (kv_engine docs/sasl.md): PLAIN and SCRAM.

Pure, stdlib only.  SCRAM follows RFC 5802 with Couchbase's mechanism names
(``SCRAM-SHA512``, ``SCRAM-SHA256``, ``SCRAM-SHA1``) and no channel binding
(the GS2 header is always ``n,,``).

>>> users = {"Administrator": "password"}
>>> client = ScramClient("SCRAM-SHA256", "Administrator", "password")
>>> server = ScramServer("SCRAM-SHA256", users)
>>> server_first = server.first(client.first())
>>> server_final = server.final(client.final(server_first))
>>> client.verify(server_final), server.user
(True, 'Administrator')
>>> check_plain(plain_payload("Administrator", "password"), users)
'Administrator'
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping

__all__ = [
    "MAX_ITERATIONS",
    "MECHANISMS",
    "SCRAM_HASHES",
    "SaslError",
    "ScramClient",
    "ScramServer",
    "check_plain",
    "plain_payload",
]

#: Mechanism name -> hashlib digest name.
SCRAM_HASHES: dict[str, str] = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}

#: What the simulator advertises in SASL_LIST_MECHS, strongest first.
MECHANISMS: tuple[str, ...] = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")

#: The highest PBKDF2 iteration count a :class:`ScramClient` accepts from a server (the simulator announces 4096,
#: Couchbase Server 4096 by default); more would block the caller for minutes (2**31-1: half an hour).
MAX_ITERATIONS = 100_000

_GS2_HEADER = "n,,"
_DIGITS = re.compile(r"[0-9]+")


class SaslError(Exception):
    """An authentication exchange failed (bad message, unknown user, wrong proof)."""


def plain_payload(user: str, password: str) -> bytes:
    """The PLAIN initial message ``authzid NUL user NUL password`` (empty authzid)."""
    return b"\0" + user.encode() + b"\0" + password.encode()


def check_plain(payload: bytes, users: Mapping[str, str]) -> str | None:
    """Validate a PLAIN message; returns the user name if the password matches, else ``None``."""
    parts = payload.split(b"\0")
    if len(parts) != 3:
        return None
    authzid, user_b, password_b = parts
    try:
        user, password, authz = user_b.decode(), password_b.decode(), authzid.decode()
    except UnicodeDecodeError:
        return None
    if authz and authz != user:
        return None
    want = users.get(user)
    if want is None or not hmac.compare_digest(want.encode(), password.encode()):
        return None
    return user


def _hash_name(mech: str) -> str:
    try:
        return SCRAM_HASHES[mech.upper()]
    except KeyError:
        raise SaslError(f"unsupported mechanism {mech!r}") from None


def _nonce() -> str:
    return base64.b64encode(secrets.token_bytes(18)).decode()


def _saslname(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


def _unsaslname(name: str) -> str:
    out = name.replace("=2C", ",").replace("=3D", "=")
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise SaslError("bad saslname escaping")
    return out


def _attributes(message: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise SaslError("malformed SCRAM attribute")
        attrs.setdefault(part[0], part[2:])
    return attrs


def _decode(message: bytes) -> str:
    try:
        return message.decode()
    except UnicodeDecodeError:
        raise SaslError("SCRAM message is not UTF-8") from None


def _b64decode(text: str, what: str = "SCRAM message") -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SaslError(f"bad base64 in {what}") from None


class _Keys:
    """The RFC 5802 key derivations for one hash."""

    def __init__(self, hash_name: str) -> None:
        self.hash_name = hash_name

    def hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash_name).digest()

    def h(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def salted(self, password: str, salt: bytes, iterations: int) -> bytes:
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode(), salt, iterations)


class ScramClient:
    """The client side of one SCRAM exchange.

    Args:
        mech: ``SCRAM-SHA512``, ``SCRAM-SHA256`` or ``SCRAM-SHA1``.
        user: user name.
        password: password (never logged or repr'd).
        nonce: client nonce (random if ``None``; fixed only for test vectors).
    """

    def __init__(self, mech: str, user: str, password: str, nonce: str | None = None) -> None:
        self.mech = mech.upper()
        self._keys = _Keys(_hash_name(mech))
        self.user = user
        self._password = password
        self._nonce = nonce or _nonce()
        self._client_first_bare = f"n={_saslname(user)},r={self._nonce}"
        self._auth_message: bytes | None = None
        self._salted: bytes | None = None

    def __repr__(self) -> str:
        return f"ScramClient({self.mech!r}, {self.user!r})"

    def first(self) -> bytes:
        """The client-first message (sent as the SASL_AUTH value)."""
        return (_GS2_HEADER + self._client_first_bare).encode()

    def final(self, server_first: bytes) -> bytes:
        """The client-final message with the proof (sent as the SASL_STEP value).

        Raises:
            SaslError: the server-first message is malformed (an attribute missing, bad base64, an empty
                salt, an iteration count outside 1..:data:`MAX_ITERATIONS`) or its nonce does not extend ours.
        """
        text = _decode(server_first)
        attrs = _attributes(text)
        if "m" in attrs:
            raise SaslError("malformed server-first message (mandatory extension m= not supported)")
        missing = [a for a in ("r", "s", "i") if a not in attrs]
        if missing:
            raise SaslError(f"malformed server-first message (no {', '.join(a + '=' for a in missing)})")
        nonce = attrs["r"]
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslError("server nonce does not extend the client nonce")
        count = attrs["i"]
        if not _DIGITS.fullmatch(count):
            raise SaslError("bad iteration count (not a number)")
        if len(count) > 12 or int(count) > MAX_ITERATIONS:
            shown = count if len(count) <= 20 else f"{count[:12]}... ({len(count)} digits)"
            raise SaslError(f"iteration count {shown} above the limit {MAX_ITERATIONS}")
        iterations = int(count)
        if iterations <= 0:
            raise SaslError("bad iteration count 0")
        salt = _b64decode(attrs["s"], "the salt")
        if not salt:
            raise SaslError("empty salt")
        without_proof = f"c={base64.b64encode(_GS2_HEADER.encode()).decode()},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        k = self._keys
        salted = k.salted(self._password, salt, iterations)
        client_key = k.hmac(salted, b"Client Key")
        signature = k.hmac(k.h(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._auth_message = auth_message
        self._salted = salted
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        """Check the server-final message; returns if it carries the expected server signature.

        Raises:
            SaslError: why not: out of order, malformed, a server error (``e=``), bad base64 or a wrong signature.
        """
        if self._auth_message is None or self._salted is None:
            raise SaslError("server-final before the client-final message")
        attrs = _attributes(_decode(server_final))
        if "e" in attrs:
            raise SaslError(f"the server reports an error: {attrs['e']}")
        if "v" not in attrs:
            raise SaslError("malformed server-final message (no v=)")
        got = _b64decode(attrs["v"], "the server signature")
        k = self._keys
        want = k.hmac(k.hmac(self._salted, b"Server Key"), self._auth_message)
        if not hmac.compare_digest(got, want):
            raise SaslError("the server's signature does not verify")

    def verify(self, server_final: bytes) -> bool:
        """True iff the server-final message carries the expected server signature (:meth:`check` says why not)."""
        try:
            self.check(server_final)
        except SaslError:
            return False
        return True


class ScramServer:
    """The server side of one SCRAM exchange against a table of plain-text passwords.

    Args:
        mech: ``SCRAM-SHA512``, ``SCRAM-SHA256`` or ``SCRAM-SHA1``.
        users: user name -> password.
        iterations: PBKDF2 iteration count announced to the client.
        nonce: the server's nonce part (random if ``None``).
        salt: the salt (random per exchange if ``None``; fixed only for test vectors).

    After a successful :meth:`final`, :attr:`user` holds the authenticated user.
    """

    def __init__(
        self, mech: str, users: Mapping[str, str], iterations: int = 4096, nonce: str | None = None, salt: bytes | None = None
    ) -> None:
        self.mech = mech.upper()
        self._keys = _Keys(_hash_name(mech))
        self._users = users
        self.iterations = iterations
        self._server_nonce = nonce or _nonce()
        self._salt = salt if salt is not None else secrets.token_bytes(16)
        self._pending_user: str | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self.user: str | None = None

    def __repr__(self) -> str:
        return f"ScramServer({self.mech!r})"

    def first(self, client_first: bytes) -> bytes:
        """Answer the client-first message with the server-first message.

        Raises:
            SaslError: malformed message, channel binding requested, or unknown user.
        """
        text = _decode(client_first)
        if not text.startswith(_GS2_HEADER):
            raise SaslError("unsupported GS2 header (channel binding / authzid)")
        bare = text[len(_GS2_HEADER) :]
        attrs = _attributes(bare)
        if "m" in attrs or "n" not in attrs or not attrs.get("r"):
            raise SaslError("malformed client-first message")
        user = _unsaslname(attrs["n"])
        if user not in self._users:
            raise SaslError("unknown user")
        self._pending_user = user
        self._client_first_bare = bare
        self._nonce = attrs["r"] + self._server_nonce
        self._server_first = f"r={self._nonce},s={base64.b64encode(self._salt).decode()},i={self.iterations}"
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """Check the client proof; returns the server-final message (``v=signature``).

        Raises:
            SaslError: out of order, malformed, nonce mismatch, or wrong proof (wrong password).
        """
        if self._pending_user is None:
            raise SaslError("client-final before client-first")
        text = _decode(client_final)
        head, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise SaslError("client-final without proof")
        attrs = _attributes(head)
        if attrs.get("r") != self._nonce:
            raise SaslError("nonce mismatch")
        if attrs.get("c") != base64.b64encode(_GS2_HEADER.encode()).decode():
            raise SaslError("channel binding mismatch")
        proof = _b64decode(proof_b64)
        k = self._keys
        salted = k.salted(self._users[self._pending_user], self._salt, self.iterations)
        auth_message = f"{self._client_first_bare},{self._server_first},{head}".encode()
        client_key = k.hmac(salted, b"Client Key")
        signature = k.hmac(k.h(client_key), auth_message)
        if len(proof) != len(signature):
            raise SaslError("bad proof length")
        recovered = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(k.h(recovered), k.h(client_key)):
            raise SaslError("authentication failed")
        self.user = self._pending_user
        server_signature = k.hmac(k.hmac(salted, b"Server Key"), auth_message)
        return f"v={base64.b64encode(server_signature).decode()}".encode()
