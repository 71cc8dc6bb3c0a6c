"""A router in a process of its own, for tests: prints its listen endpoints as one JSON
line, then runs until its stdin closes. Its lease is loopback_config's (1 s).

    python -m exo.routing.tests.node_process NODE_ID SECRET PEER...
"""

import json
import sys

import anyio
import anyio.to_thread

from exo.routing import Router, loopback_config


async def main(node_id: str, secret: str, peers: list[str]) -> None:
    async with Router(loopback_config(node_id, secret, peers=peers)) as router:
        print(json.dumps(router.listen_endpoints), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3:])
