"""Forward TCP ports from one address to another: ``python -m tests.hosts.forward LISTEN=TARGET ...``
with each side ``host:port``. The test hosts reach the machine's Postgres and Redis, which listen on
loopback only, through the root namespace's address on their bridge."""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def _handler(target_host: str, target_port: int):  # noqa: ANN202
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def main(pairs: list[str]) -> None:
    servers = []
    for pair in pairs:
        listen, target = pair.split("=")
        (lhost, lport), (thost, tport) = listen.rsplit(":", 1), target.rsplit(":", 1)
        servers.append(await asyncio.start_server(_handler(thost, int(tport)), lhost, int(lport)))
    print("forwarding", " ".join(pairs), flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
