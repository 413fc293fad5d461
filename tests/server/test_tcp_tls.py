"""The daemon's optional TCP listener: TLS with a certificate made here, and a bearer token."""

import datetime
import ipaddress
import sys
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.daemon_util import free_port, serve_refused, start_daemon, stop_daemon
from tests.server.test_daemon import request
from tiled.runtime.cpu_levels import host_level
from tiled.v1 import compile_pb2 as cpb
from tiled.v1 import compile_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import elementwise


def self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tiled-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return cert_pem


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory):
    base = tmp_path_factory.mktemp("tls")
    cert_pem = self_signed(base)
    (base / "token").write_text("s3cret-token\n")
    port = free_port()
    d = start_daemon(base, "--workers", "1", "--tcp", f"127.0.0.1:{port}",
                     "--tls-cert", str(base / "cert.pem"), "--tls-key", str(base / "key.pem"),
                     "--token-file", str(base / "token"))
    d.update(port=port, cert=cert_pem)
    yield d
    stop_daemon(d)


def tls_stub(d, token=None):
    creds = grpc.ssl_channel_credentials(root_certificates=d["cert"])
    if token is not None:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(token))
    channel = grpc.secure_channel(f"127.0.0.1:{d['port']}", creds)
    return channel, compile_pb2_grpc.CompilerStub(channel)


def test_tls_with_token_compiles(tls_daemon):
    channel, stub = tls_stub(tls_daemon, token="s3cret-token")
    with channel:
        r = stub.Compile(request(elementwise.add(block=128), inline_limit=1), timeout=120)
        assert r.artifact_size > 0 and r.resolved_target == f"cpu:{host_level().name}"
        chunks = stub.GetArtifact(cpb.GetArtifactRequest(sha256=r.artifact_sha256), timeout=30)
        assert sum(len(c.data) for c in chunks) == r.artifact_size


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_missing_or_wrong_token_is_unauthenticated(tls_daemon, token):
    channel, stub = tls_stub(tls_daemon, token=token)
    with channel:
        for call in (lambda: stub.Capabilities(cpb.CapabilitiesRequest(), timeout=30),
                     lambda: list(stub.GetArtifact(cpb.GetArtifactRequest(sha256="0" * 64),
                                                   timeout=30))):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_plaintext_to_the_tls_port_fails(tls_daemon):
    with grpc.insecure_channel(f"127.0.0.1:{tls_daemon['port']}") as channel:
        with pytest.raises(grpc.RpcError) as e:
            compile_pb2_grpc.CompilerStub(channel).Capabilities(cpb.CapabilitiesRequest(),
                                                                timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_unix_socket_needs_no_token(tls_daemon):
    caps = tls_daemon["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=60)
    assert caps.local_target == "cpu"


def test_thin_clients_use_tls_ca_and_token_file(tls_daemon, tmp_path):
    import asyncio

    from tiled import config
    from tiled.client import Client
    from tiled.client.aio import AsyncClient
    from tiled.errors import TiledError

    ca = tmp_path / "ca.pem"
    ca.write_bytes(tls_daemon["cert"])
    address = f"127.0.0.1:{tls_daemon['port']}"
    with config.override(tls_ca=str(ca), token_file=str(tls_daemon["base"] / "token")):
        with Client(address, timeout_s=120) as client:
            k = client.compile(elementwise.add(block=128), "cpu")
            assert k.resolved_target == f"cpu:{host_level().name}"

        async def via_aio():
            async with AsyncClient(address, timeout_s=120) as client:
                return (await client.capabilities()).local_target

        assert asyncio.run(via_aio()) == "cpu"
    with config.override(tls_ca=str(ca)):  # TLS but no token: refused with a clear error
        with Client(address, timeout_s=30, retries=0) as client:
            with pytest.raises(TiledError, match="token"):
                client.capabilities()
    with config.override(token_file=str(tls_daemon["base"] / "token")):
        with pytest.raises(TiledError, match="plaintext"):
            Client(address)


# -- what `tiled serve` refuses to start with (issue 10, finding 9) ---------------------------

def test_empty_token_file_is_refused(tmp_path):
    self_signed(tmp_path)
    tls = ("--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"))
    for text in ("", " \n\t\n"):
        (tmp_path / "token").write_text(text)
        message = serve_refused("--socket", str(tmp_path / "s.sock"), "--tcp",
                                f"127.0.0.1:{free_port()}", *tls, "--token-file",
                                str(tmp_path / "token"))
        assert "is empty" in message
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize("tls", [True, False])
def test_tcp_without_a_token_is_refused(tmp_path, tls):
    self_signed(tmp_path)
    args = ("--tls-cert", str(tmp_path / "cert.pem"), "--tls-key",
            str(tmp_path / "key.pem")) if tls else ()
    message = serve_refused("--socket", str(tmp_path / "s.sock"), "--tcp",
                            f"127.0.0.1:{free_port()}", *args)
    assert "needs --token-file" in message and "--insecure-no-auth" in message


def test_token_without_tls_is_refused(tmp_path):
    (tmp_path / "token").write_text("s3cret-token\n")
    message = serve_refused("--socket", str(tmp_path / "s.sock"), "--tcp",
                            f"127.0.0.1:{free_port()}", "--token-file", str(tmp_path / "token"))
    assert "needs --tls-cert and --tls-key" in message and "plaintext" in message


def test_tcp_flags_without_tcp_are_refused(tmp_path):
    (tmp_path / "token").write_text("s3cret-token\n")
    message = serve_refused("--socket", str(tmp_path / "s.sock"), "--token-file",
                            str(tmp_path / "token"))
    assert "only apply to --tcp" in message


def test_insecure_no_auth_serves_plaintext_tcp_with_a_loud_warning(tmp_path):
    port = free_port()
    d = start_daemon(tmp_path, "--workers", "1", "--tcp", f"127.0.0.1:{port}",
                     "--insecure-no-auth")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            caps = compile_pb2_grpc.CompilerStub(channel).Capabilities(
                cpb.CapabilitiesRequest(), timeout=60)
            assert caps.local_target == "cpu"
    finally:
        log = stop_daemon(d)
    warning = next(line for line in log.splitlines() if "INSECURE" in line)
    assert '"WARNING"' in warning and "no token" in warning and "plaintext" in warning


def test_token_interceptor_compares_in_constant_time(monkeypatch):
    """hmac.compare_digest decides, on bytes (a str would refuse non-ASCII text)."""
    import hmac

    from tiled.server.app import _TokenInterceptor

    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))

    class Details:
        def __init__(self, value):
            self.invocation_metadata = [("authorization", value)]

    interceptor = _TokenInterceptor("s3cret")
    assert interceptor.intercept_service(lambda d: "ok", Details("Bearer s3cret")) == "ok"
    for wrong in ("Bearer s3cre", "Bearer s3creu", "Bearer s3crét", ""):
        assert interceptor.intercept_service(lambda d: "ok", Details(wrong)) != "ok"
    assert all(isinstance(a, bytes) and b == b"Bearer s3cret" for a, b in calls)
