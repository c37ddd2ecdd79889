"""The upstream pool's sockets (apps/engines/vllm_socket.py), on asyncio's loop and on uvloop (the
API's): reads, a reader slower than the server, deadlines, a connection reset or refused, TLS, and
the same through httpx's client on the pool."""

from __future__ import annotations

import asyncio
import datetime
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from apps.engines.vllm_pool import UpstreamTransport
from apps.engines.vllm_socket import HIGH_WATER, AsyncioBackend

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[Any]], Any]:
    if request.param == "uvloop":
        return uvloop.run
    return asyncio.run


async def _serve(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ssl_context)
    return server, server.sockets[0].getsockname()[1]


async def _read_all(stream: httpcore.AsyncNetworkStream, *, pause: float = 0.0) -> bytes:
    got = bytearray()
    while data := await stream.read(65536, timeout=5):
        got += data
        if pause:
            await asyncio.sleep(pause)
    return bytes(got)


def test_a_reader_slower_than_the_server_gets_every_byte_in_order(run):
    body = bytes(range(256)) * (4 * HIGH_WATER // 256)  # four times what is buffered before reading pauses

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(5)
        writer.write(body)
        await writer.drain()
        writer.close()

    async def main() -> bytes:
        server, port = await _serve(handler)
        async with server:
            stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
            await stream.write(b"hello", timeout=5)
            await asyncio.sleep(0.2)  # the server has written it all: the buffer is at its high water
            got = await _read_all(stream, pause=0.001)
            assert stream.get_extra_info("is_readable")  # ended: what httpcore reads as closed
            await stream.aclose()
            return got

    assert run(main()) == body


def test_a_read_past_its_deadline_is_a_read_timeout_and_the_connection_still_reads(run):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        await asyncio.sleep(0.3)
        writer.write(b"late")
        await writer.drain()
        writer.close()

    async def main() -> bytes:
        server, port = await _serve(handler)
        async with server:
            stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
            assert not stream.get_extra_info("is_readable")  # idle and open
            await stream.write(b"x", timeout=5)
            with pytest.raises(httpcore.ReadTimeout):
                await stream.read(10, timeout=0.05)
            got = await _read_all(stream)
            await stream.aclose()
            with pytest.raises(httpcore.ReadError):  # closed here: never read as the peer's clean end
                await stream.read(10, timeout=1)
            return got

    assert run(main()) == b"late"


def test_a_reset_connection_is_a_read_error_and_a_refused_one_a_connect_error(run):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        writer.transport.abort()

    async def main() -> None:
        server, port = await _serve(handler)
        async with server:
            stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
            await stream.write(b"x", timeout=5)
            with pytest.raises(httpcore.ReadError) as reset:
                await stream.read(10, timeout=5)
            assert isinstance(reset.value.__cause__, ConnectionError)
            with pytest.raises(httpcore.WriteError):
                await stream.write(b"more", timeout=5)
            await stream.aclose()
        with pytest.raises(httpcore.ConnectError) as refused:
            await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)  # the server is gone
        assert isinstance(refused.value.__cause__, OSError)
        with pytest.raises(httpcore.ConnectTimeout):
            await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=0)

    run(main())


def _certificate(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_tls_carries_the_bytes_and_an_untrusted_server_is_a_connect_error(run, tmp_path):
    cert, key = _certificate(tmp_path)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    body = b"y" * (3 * HIGH_WATER)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readexactly(4)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return  # the untrusted client's handshake
        writer.write(body)
        await writer.drain()
        writer.close()

    async def main() -> None:
        server, port = await _serve(handler, server_side)
        async with server:
            trusted = ssl.create_default_context(cafile=str(cert))
            plain = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
            stream = await plain.start_tls(trusted, server_hostname="localhost", timeout=5)
            assert stream.get_extra_info("ssl_object") is not None
            await stream.write(b"ping", timeout=5)
            assert await _read_all(stream, pause=0.001) == body
            await stream.aclose()
            plain = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
            with pytest.raises(httpcore.ConnectError):
                await plain.start_tls(ssl.create_default_context(), server_hostname="localhost", timeout=5)

    run(main())


def test_httpx_on_the_pool_reads_answers_and_maps_a_stalled_read_to_its_read_timeout(run):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            if b"/stall" in head.split(b"\r\n")[0]:
                await asyncio.sleep(1)
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    async def main() -> None:
        server, port = await _serve(handler)
        async with server:
            limits = httpx.Limits(max_connections=4, max_keepalive_connections=4, keepalive_expiry=30)
            async with httpx.AsyncClient(transport=UpstreamTransport(limits)) as client:
                for _ in range(3):  # one connection, reused
                    answer = await client.get(f"http://127.0.0.1:{port}/ok", timeout=5)
                    assert answer.status_code == 200 and answer.text == "ok"
                with pytest.raises(httpx.ReadTimeout):
                    await client.get(f"http://127.0.0.1:{port}/stall", timeout=httpx.Timeout(5, read=0.1))
                answer = await client.get(f"http://127.0.0.1:{port}/ok", timeout=5)
                assert answer.text == "ok"

    run(main())
