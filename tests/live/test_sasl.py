"""PLAIN and SCRAM (RFC 5802 / RFC 7677) as the simulator and the client use them."""

from __future__ import annotations

import base64
import doctest

import pytest

from dcpinspect.live import sasl
from dcpinspect.live.sasl import MECHANISMS, SaslError, ScramClient, ScramServer, check_plain, plain_payload

USERS = {"Administrator": "password", "we,ird=user": "sëcret"}


def test_plain_roundtrip_and_rejects() -> None:
    assert plain_payload("Administrator", "password") == b"\0Administrator\0password"
    assert check_plain(plain_payload("Administrator", "password"), USERS) == "Administrator"
    assert check_plain(plain_payload("Administrator", "wrong"), USERS) is None
    assert check_plain(plain_payload("nobody", "password"), USERS) is None
    assert check_plain(b"no separators", USERS) is None
    assert check_plain(b"Administrator\0Administrator\0password", USERS) == "Administrator"
    assert check_plain(b"other\0Administrator\0password", USERS) is None


@pytest.mark.parametrize("mech", [m for m in MECHANISMS if m.startswith("SCRAM")])
@pytest.mark.parametrize("user", sorted(USERS))
def test_scram_roundtrip(mech: str, user: str) -> None:
    client = ScramClient(mech, user, USERS[user])
    server = ScramServer(mech, USERS, iterations=64)
    server_first = server.first(client.first())
    server_final = server.final(client.final(server_first))
    assert client.verify(server_final)
    assert server.user == user


@pytest.mark.parametrize("mech", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_wrong_password(mech: str) -> None:
    client = ScramClient(mech, "Administrator", "not-the-password")
    server = ScramServer(mech, USERS, iterations=64)
    client_final = client.final(server.first(client.first()))
    with pytest.raises(SaslError):
        server.final(client_final)
    assert server.user is None


def test_scram_unknown_user_and_bad_messages() -> None:
    server = ScramServer("SCRAM-SHA256", USERS, iterations=64)
    with pytest.raises(SaslError):
        server.first(ScramClient("SCRAM-SHA256", "nobody", "x").first())
    with pytest.raises(SaslError):
        server.first(b"p=tls-unique,,n=Administrator,r=abc")
    with pytest.raises(SaslError):
        server.first(b"\xff\xfe")
    with pytest.raises(SaslError):
        server.final(b"c=biws,r=x,p=AAAA")  # before first
    with pytest.raises(SaslError):
        ScramServer("CRAM-MD5", USERS)


def test_scram_server_signature_mismatch_is_not_verified() -> None:
    client = ScramClient("SCRAM-SHA1", "Administrator", "password")
    server = ScramServer("SCRAM-SHA1", USERS, iterations=64)
    server.final(client.final(server.first(client.first())))
    assert not client.verify(b"v=" + base64.b64encode(b"x" * 20))
    assert not client.verify(b"e=other-error")


def test_scram_client_rejects_foreign_nonce() -> None:
    client = ScramClient("SCRAM-SHA256", "user", "pencil", nonce="abc")
    with pytest.raises(SaslError):
        client.final(b"r=zzz123,s=QSXCR+Q6sek8bf92,i=4096")


def test_rfc7677_scram_sha256_vector() -> None:
    # RFC 7677 §3: user "user", password "pencil".
    client = ScramClient("SCRAM-SHA256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server = ScramServer(
        "SCRAM-SHA256",
        {"user": "pencil"},
        iterations=4096,
        nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="),
    )
    server_first = server.first(client.first())
    assert server_first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    client_final = client.final(server_first)
    assert client_final == b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    server_final = server.final(client_final)
    assert server_final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert client.verify(server_final)


def test_rfc5802_scram_sha1_vector() -> None:
    # RFC 5802 §5: user "user", password "pencil".
    client = ScramClient("SCRAM-SHA1", "user", "pencil", nonce="fyko+d2lbbFgONRv9qkxdawL")
    server_first = b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"
    assert client.final(server_first) == b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    assert client.verify(b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=")


def test_mechanisms_strongest_first_and_secret_free_repr() -> None:
    assert MECHANISMS[0] == "SCRAM-SHA512" and MECHANISMS[-1] == "PLAIN"
    assert "password" not in repr(ScramClient("SCRAM-SHA1", "Administrator", "password"))


def test_module_doctest() -> None:
    assert doctest.testmod(sasl).failed == 0


# ---------------------------------------------------------------------------------------------------
# Hostile server messages (the client side): every malformed message is a SaslError saying why,
# and an iteration count the client would spend minutes on is refused before any hashing.


@pytest.mark.parametrize("count", ["100001", str(2**31 - 1), "1" + "0" * 30, "9" * 5000])
def test_scram_client_refuses_iteration_counts_above_the_limit(count: str) -> None:
    client = ScramClient("SCRAM-SHA512", "user", "pencil", nonce="abc")
    with pytest.raises(SaslError, match=f"above the limit {sasl.MAX_ITERATIONS}"):
        client.final(f"r=abcdef,s=QUJDRA==,i={count}".encode())


def test_scram_client_accepts_the_limit_and_the_usual_count() -> None:
    assert sasl.MAX_ITERATIONS == 100_000
    server = ScramServer("SCRAM-SHA1", USERS, iterations=4096)
    client = ScramClient("SCRAM-SHA1", "Administrator", "password")
    assert client.verify(server.final(client.final(server.first(client.first()))))


def test_scram_client_check_says_why_the_server_final_is_refused() -> None:
    client = ScramClient("SCRAM-SHA256", "Administrator", "password")
    with pytest.raises(SaslError, match="before the client-final"):
        client.check(b"v=AAAA")
    server = ScramServer("SCRAM-SHA256", USERS, iterations=64)
    good = server.final(client.final(server.first(client.first())))
    client.check(good)
    for bad, why in [(b"e=other-error", "reports an error"), (b"x=1", "no v="), (b"v=!!", "bad base64"), (b"v=AAAA", "does not verify")]:
        with pytest.raises(SaslError, match=why):
            client.check(bad)
        assert not client.verify(bad)


#: the official SDK's (C++ core) client nonce: 8 bytes as sign-extended hex words joined by spaces
SDK_NONCE = "0x54 0x27 0xfffffffa 0x68 0xffffffb1 0x0d 0x27 0x1d"


@pytest.mark.parametrize("mech", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_server_takes_the_sdks_spaced_nonce_and_answers_like_kv_engine(mech: str) -> None:
    """Attributes are split on ',' only; the server-first holds exactly r, s, i (4096 iterations)."""
    client = ScramClient(mech, "Administrator", "password", nonce=SDK_NONCE)
    server = ScramServer(mech, {"Administrator": "password"})
    first = server.first(client.first())
    attrs = [a.split("=", 1) for a in first.decode().split(",")]
    assert [k for k, _ in attrs] == ["r", "s", "i"] and attrs[0][1].startswith(SDK_NONCE) and attrs[2][1] == "4096"
    final = server.final(client.final(first))
    assert client.verify(final) and server.user == "Administrator"
    wrong = ScramServer(mech, {"Administrator": "password"})
    impostor = ScramClient(mech, "Administrator", "nope", nonce=SDK_NONCE)
    with pytest.raises(SaslError):
        wrong.final(impostor.final(wrong.first(impostor.first())))
