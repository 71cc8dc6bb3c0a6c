"""``exo``: start a node."""

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
from loguru import logger

from exo.api.errors import ApiError
from exo.api.main import ApiSettings
from exo.api.serving import ensure_serving
from exo.cli_progress import ProgressPrinter, progress_line
from exo.cluster.config import DEFAULT_DISCOVERY_PORT, DEFAULT_NODE_TIMEOUT_S, ClusterConfig
from exo.main import Node, NodeConfig
from exo.shared.constants import EXO_DEFAULT_API_PORT
from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.models.model_cards import ModelCard
from exo.shared.models.registry import CardUnavailable
from exo.utils.heap import freeze_long_lived
from exo.worker.download.local import card_from_path
from exo.worker.download.model_dirs import models_dirs_from_env, parse_memory, scan_models_dir

DEFAULT_LISTEN = "tcp/0.0.0.0:7447"
LOAD_TIMEOUT_S = 24 * 3600.0
"""How long the start model may take to download and load (a large model, a slow link)."""
PUBLIC_SECRET = "exo-public-cluster"


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(os.environ.get("EXO_DATA_DIR", Path(base) / "exo"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="exo",
        description="Run a node of an exo cluster: pool this machine with others to serve "
        "large language models through OpenAI-, Claude- and Ollama-compatible APIs.",
    )
    p.add_argument("--api-host", default=os.environ.get("EXO_API_HOST", "127.0.0.1"),
                   help="address the HTTP API listens on (default: 127.0.0.1, this machine only)")
    p.add_argument("--api-port", type=int, default=int(os.environ.get("EXO_API_PORT", EXO_DEFAULT_API_PORT)),
                   help=f"port of the HTTP API (default: {EXO_DEFAULT_API_PORT})")
    p.add_argument("--data-dir", type=Path, default=_default_data_dir(),
                   help="where the node keeps its id, caches and models (default: %(default)s)")
    p.add_argument("--model", default=str(EMBEDDED_MODEL_ID),
                   help="model to place and load at start: a known model name, a GGUF file or a "
                   "Hugging Face model folder (default: the embedded %(default)s); "
                   "'none' to start without one")
    p.add_argument("--api-key", default=os.environ.get("EXO_API_KEY"),
                   help="require this key on every API request (or set EXO_API_KEY)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from this origin (repeatable; default: none)")
    p.add_argument("--image-url-fetch", action="store_true",
                   help="fetch http(s) image URLs named in requests (default: off, a 400)")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1)),
                   help="CPU threads for this node's runners, shared among them (default: all cores)")
    p.add_argument("--models-dir", action="append", default=[], type=Path, metavar="DIR",
                   help="a folder of models to serve (GGUF files, Hugging Face folders or a "
                   "Hugging Face cache; read only; repeatable; or EXO_MODELS_DIRS, "
                   "separated by ':')")
    p.add_argument("--memory-limit", default=os.environ.get("EXO_MEMORY_LIMIT"), metavar="SIZE",
                   help="the most memory placement may use on this node, in bytes or with a "
                   "unit (8GB, 512MB): one machine can act as a small one")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="DEBUG, INFO, WARNING or ERROR, any case (default: %(default)s)")
    cluster = p.add_argument_group(
        "cluster",
        "Nodes that share a secret and reach each other form one cluster: give other "
        "nodes' endpoints with --peer (or --listen for them to connect), or find them by "
        "multicast (on by default: --discovery-interface). Across subnets, where multicast "
        "does not reach, one node runs with --router and the others --connect to it. With "
        "multicast off and no peers, the node runs alone.",
    )
    cluster.add_argument("--peer", action="append", default=[], metavar="ENDPOINT",
                         help="another node's cluster endpoint to connect to, e.g. "
                         "tcp/192.168.1.7:7447 (repeatable)")
    cluster.add_argument("--connect", action="append", default=[], metavar="ENDPOINT",
                         help="join through a router node (one started with --router), e.g. "
                         "tcp/10.1.0.5:7447: all of this node's cluster traffic goes "
                         "through it, so nodes on other subnets reach this one (repeatable: "
                         "the first that answers)")
    cluster.add_argument("--router", action="store_true",
                         help="also route for the nodes that --connect to this one (they may "
                         "sit on other subnets and share no multicast domain)")
    cluster.add_argument("--listen", action="append", default=[], metavar="ENDPOINT",
                         help=f"cluster endpoint to listen on (repeatable; default: {DEFAULT_LISTEN})")
    cluster.add_argument("--secret", default=os.environ.get("EXO_SECRET"),
                         help="the cluster secret: only nodes that share it talk to each other "
                         "(or set EXO_SECRET; default: a public one, with a warning)")
    cluster.add_argument("--discovery-interface", metavar="IFACE",
                         default=os.environ.get("EXO_DISCOVERY_INTERFACE", "auto"),
                         help="find other nodes by multicast on this interface ('auto': zenoh "
                         "chooses; 'none': no multicast; or set EXO_DISCOVERY_INTERFACE; "
                         "default: %(default)s)")
    cluster.add_argument("--discovery-port", type=int, default=DEFAULT_DISCOVERY_PORT,
                         help="UDP port of multicast discovery (default: %(default)s)")
    cluster.add_argument("--force-master", action="store_true",
                         help="make this node the master once it has caught up")
    cluster.add_argument("--node-timeout", type=float, default=DEFAULT_NODE_TIMEOUT_S,
                         metavar="SECONDS",
                         help="a node silent this long is gone; a dead process is noticed at "
                         "once (default: %(default)s)")
    return p


def _models_from_dirs(dirs: Sequence[Path]) -> list[ModelCard]:
    cards: list[ModelCard] = []
    for folder in dirs:
        try:
            found = scan_models_dir(folder)
        except (ValueError, OSError) as e:
            raise SystemExit(f"exo: --models-dir: {e}") from e
        logger.info(f"{folder}: {len(found)} model(s): {', '.join(c.model_id for c in found)}")
        cards.extend(found)
    return cards


def cluster_config(args: argparse.Namespace) -> ClusterConfig | None:
    """The cluster options as a config; None for a node alone (no peer, no listen
    endpoint, no multicast)."""
    interface: str = args.discovery_interface
    multicast = interface != "none"
    if not multicast and not args.peer and not args.connect and not args.listen \
            and not args.router:
        return None
    if args.node_timeout <= 0:
        raise SystemExit("exo: --node-timeout must be positive")
    if not 0 < args.discovery_port < 65536:
        raise SystemExit("exo: --discovery-port must be between 1 and 65535")
    for option, endpoints in (
        ("--peer", args.peer), ("--connect", args.connect), ("--listen", args.listen)
    ):
        for endpoint in endpoints:
            problem = endpoint_problem(endpoint)
            if problem is not None:
                raise SystemExit(
                    f"exo: {option} {endpoint!r} is not a cluster endpoint ({problem}); "
                    f"expected PROTOCOL/HOST:PORT, e.g. tcp/192.168.1.7:7447"
                )
    if args.connect and (args.peer or args.router):
        raise SystemExit("exo: --connect joins through a router: it does not combine with "
                         "--peer or --router")
    secret = args.secret
    if not secret:
        logger.warning("no --secret (or EXO_SECRET): using the public default secret; any "
                       "exo node that reaches this one can join its cluster")
        secret = PUBLIC_SECRET
    return ClusterConfig(
        secret=secret,
        listen=args.listen or [DEFAULT_LISTEN],
        peers=args.peer,
        connect=args.connect,
        multicast=multicast,
        multicast_interface=None if interface == "auto" else interface,
        multicast_port=args.discovery_port,
        force_master=args.force_master,
        node_timeout_s=args.node_timeout,
        # Tests that route every link through proxies turn gossip off (EXO_CLUSTER_GOSSIP=0).
        gossip=os.environ.get("EXO_CLUSTER_GOSSIP", "1") != "0",
        router=args.router,
    )


_PROTOCOLS = ("tcp", "udp", "tls", "quic")


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is not a zenoh endpoint we accept (None: it is fine)."""
    protocol, slash, address = endpoint.partition("/")
    if not slash or protocol not in _PROTOCOLS:
        return f"the protocol must be one of {', '.join(_PROTOCOLS)}"
    address = address.split("#", 1)[0]
    host, colon, port = address.rpartition(":")
    if not colon or not host.strip("[]"):
        return "no host and port"
    if not port.isdigit() or not 0 <= int(port) < 65536:
        return f"bad port {port!r}"
    return None


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if not 0 < args.api_port < 65536:
        raise SystemExit(f"exo: --api-port must be between 1 and 65535, got {args.api_port}")
    if args.threads < 1:
        raise SystemExit("exo: --threads must be at least 1")
    logger.remove()
    logger.add(sys.stderr, level=args.log_level, backtrace=False, diagnose=False)
    models = _models_from_dirs([*args.models_dir, *models_dirs_from_env()])
    memory_limit = None
    if args.memory_limit:
        try:
            memory_limit = parse_memory(args.memory_limit)
        except ValueError as e:
            raise SystemExit(f"exo: --memory-limit: {e}") from e
    if args.model != "none" and (Path(args.model).suffix == ".gguf" or Path(args.model).is_dir()):
        try:
            card = card_from_path(Path(args.model))
        except ValueError as e:
            raise SystemExit(f"exo: {e}") from e
        models.append(card)
        args.model = card.model_id
    config = NodeConfig(
        models=models,
        data_dir=args.data_dir,
        api=ApiSettings(
            host=args.api_host,
            port=args.api_port,
            api_key=args.api_key,
            cors_origins=args.cors_origin,
            image_url_fetch=args.image_url_fetch,
        ),
        runner_threads=args.threads,
        cluster=cluster_config(args),
        memory_limit=memory_limit,
        models_dirs=[*args.models_dir, *models_dirs_from_env()],
    )
    problem = None
    with contextlib.suppress(KeyboardInterrupt):
        problem = anyio.run(_run, config, None if args.model == "none" else args.model)
    if problem is not None:
        raise SystemExit(problem)
    print("exo: stopped", file=sys.stderr)


async def _run(config: NodeConfig, model: str | None) -> str | None:
    """Run the node; returns why it stopped when it could not run (a SystemExit raised
    in a task becomes a message, not a traceback)."""
    try:
        await _serve(config, model)
    except SystemExit as e:
        return str(e.code)
    except BaseExceptionGroup as group:
        found = _system_exit(group)
        if found is None:
            raise
        return str(found.code)
    return None


def _system_exit(group: BaseExceptionGroup[BaseException]) -> SystemExit | None:
    for e in group.exceptions:
        if isinstance(e, SystemExit):
            return e
        if isinstance(e, BaseExceptionGroup):
            found = _system_exit(e)  # pyright: ignore[reportUnknownArgumentType]
            if found is not None:
                return found
    return None


async def _serve(config: NodeConfig, model: str | None) -> None:
    node = Node(config)
    card = None if model is None else await _resolve_card(node, model)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, tg.cancel_scope, node)
        tg.start_soon(node.run)
        await node.started.wait()
        freeze_long_lived()  # the node's startup objects: out of full collections
        print(f"exo: node {node.node_id}", file=sys.stderr)
        print(f"exo: API at http://{config.api.host}:{node.api_port}/v1  "
              f"(OpenAI, Claude /v1/messages, Ollama /api)", file=sys.stderr)
        if node.cluster is not None:
            print(f"exo: cluster endpoints {' '.join(node.cluster.listen_endpoints)}",
                  file=sys.stderr)
        if card is not None:
            await _load_model(node, card)


async def _resolve_card(node: Node, name: str) -> ModelCard:
    """The card of `--model`: known here, or built from the hub; else exit with why."""
    card = node.registry.resolve(name)
    if card is None and node.registry.hub_name(name) is not None:
        try:
            card = await anyio.to_thread.run_sync(node.registry.fetch, name)
        except CardUnavailable as e:
            raise SystemExit(f"exo: {e.message}") from None
    if card is None:
        known = ", ".join(c.model_id for c in node.model_cards())
        raise SystemExit(f"exo: unknown model {name!r} (known: {known}; a hub repo: org/repo or "
                         "org/repo:QUANT; or 'none' to start without one)")
    return card


async def _stop_on_signal(scope: anyio.CancelScope, node: Node) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for sig in signals:
            name = signal.Signals(sig).name
            print(f"\nexo: {name}, stopping", file=sys.stderr)
            # Streaming clients hear why their stream ends (a second signal stops at once).
            with anyio.move_on_after(3.5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_cancel_on_next, signals, tg.cancel_scope)
                    await node.end_open_requests(f"the node is shutting down ({name})")
                    tg.cancel_scope.cancel()
            scope.cancel()
            return


async def _cancel_on_next(signals: AsyncIterator[int], scope: anyio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return


async def _load_model(node: Node, card: ModelCard) -> None:
    """Place the model (as the API does: ``ensure_serving``) and show its download and
    loading progress until it serves, or why it cannot."""
    # Placement needs to know this node's memory: wait for its first report.
    await node.wait_for_state(lambda s: node.node_id in s.nodes, timeout=60)
    await node.wait_ready()
    printer = ProgressPrinter(sys.stderr, sys.stderr.isatty())
    async with anyio.create_task_group() as tg:

        async def show_progress() -> None:
            while True:
                printer.show(progress_line(card.model_id, node.state()))
                await _next_change(node)

        tg.start_soon(show_progress)
        try:
            await ensure_serving(node, card, timeout_s=LOAD_TIMEOUT_S)
        except ApiError as e:
            printer.show(f"failed: {e.message}")
        else:
            printer.show(progress_line(card.model_id, node.state()))
        tg.cancel_scope.cancel()


async def _next_change(node: Node) -> None:
    current = node.state().last_event_applied_idx
    await node.wait_for_state(lambda s: s.last_event_applied_idx != current, timeout=3600)


if __name__ == "__main__":
    main()
