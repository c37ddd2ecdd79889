"""Webhook receivers for the tests: real servers on loopback that misbehave on purpose."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path


class RawReceiver:
    """A TCP server on 127.0.0.1 that reads each request (head and body) and hands the socket to
    ``respond``, which writes whatever it likes. ``finished`` gets one entry per connection: True
    when ``respond`` wrote everything, False when the client hung up first; ``sent`` the bytes it
    managed to write."""

    def __init__(self, respond: Callable[[socket.socket], None]) -> None:
        self.respond, self.finished, self.sent = respond, [], []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(body) < length:
                body += conn.recv(65536)
            counter = _Counting(conn)
            try:
                self.respond(counter)  # type: ignore[arg-type]
            except OSError:
                self.finished.append(False)
            else:
                self.finished.append(True)
            self.sent.append(counter.sent)

    def close(self) -> None:
        self._stop = True
        self.listener.close()


class _Counting:
    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.sent = conn, 0

    def sendall(self, data: bytes) -> None:
        self.conn.sendall(data)
        self.sent += len(data)


def trickle(text: bytes, *, every_s: float) -> Callable[[socket.socket], None]:
    """Write ``text`` one byte every ``every_s`` seconds: never a read long enough to time out."""

    def respond(conn: socket.socket) -> None:
        for i in range(len(text)):
            conn.sendall(text[i : i + 1])
            time.sleep(every_s)

    return respond


def huge_body(conn: socket.socket) -> None:
    """A 200 with a chunked body of 512 MiB (a client that reads it all gets it all)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
    for _ in range(8192):
        conn.sendall(chunk)
    conn.sendall(b"0\r\n\r\n")


def self_signed_certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A certificate for ``name`` (and the key), which a client trusts through SSL_CERT_FILE."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def tls_server_context(cert: Path, key: Path, seen_sni: list[str | None]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    def record(sock: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, ctx: ssl.SSLContext) -> None:
        seen_sni.append(server_name)

    context.sni_callback = record  # type: ignore[assignment]
    return context
