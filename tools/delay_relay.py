#!/usr/bin/python3
"""A TCP relay that delays every byte by a fixed time in each direction: a stand-in for netem on
kernels without sch_netem, so a test can give a link the seeds' WiFi round trip (3 ms each way).
usage: delay_relay.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS"""
import asyncio, sys, time


async def pump(reader, writer, delay):
    queue = asyncio.Queue()

    async def deliver():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await queue.put((time.monotonic() + delay, data))
    finally:
        await queue.put((0, None))
        await task


async def main():
    lhost, lport = sys.argv[1].rsplit(":", 1)
    thost, tport = sys.argv[2].rsplit(":", 1)
    delay = float(sys.argv[3]) / 1000.0

    async def handle(cr, cw):
        try:
            sr, sw = await asyncio.open_connection(thost, int(tport))
        except OSError:
            cw.close()
            return
        await asyncio.gather(pump(cr, sw, delay), pump(sr, cw, delay), return_exceptions=True)

    server = await asyncio.start_server(handle, lhost, int(lport))
    print("relay ready", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
