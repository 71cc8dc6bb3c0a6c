"""``exo``: start a node."""

import argparse
import os
import signal
import sys
from pathlib import Path

import anyio
from loguru import logger

from exo.api.main import ApiSettings
from exo.main import Node, NodeConfig
from exo.shared.constants import EXO_DEFAULT_API_PORT
from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.models.local import card_from_path
from exo.shared.types.worker.runners import (
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
)


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
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1)),
                   help="CPU threads for this node's runner (default: all cores)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if not 0 < args.api_port < 65536:
        raise SystemExit(f"exo: --api-port must be between 1 and 65535, got {args.api_port}")
    if args.threads < 1:
        raise SystemExit("exo: --threads must be at least 1")
    logger.remove()
    logger.add(sys.stderr, level=args.log_level, backtrace=False, diagnose=False)
    models = []
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
        ),
        runner_threads=args.threads,
    )
    try:
        anyio.run(_run, config, None if args.model == "none" else args.model)
    except KeyboardInterrupt:
        pass
    print("exo: stopped", file=sys.stderr)


async def _run(config: NodeConfig, model: str | None) -> None:
    node = Node(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, tg.cancel_scope)
        tg.start_soon(node.run)
        await node.started.wait()
        print(f"exo: node {node.node_id}", file=sys.stderr)
        print(f"exo: API at http://{config.api.host}:{node.api_port}/v1  "
              f"(OpenAI, Claude /v1/messages, Ollama /api)", file=sys.stderr)
        if model is not None:
            await _load_model(node, model)


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for sig in signals:
            print(f"\nexo: {signal.Signals(sig).name}, stopping", file=sys.stderr)
            scope.cancel()
            return


async def _load_model(node: Node, name: str) -> None:
    """Place the model and show its loading progress until it serves."""
    from exo.shared.types.commands import PlaceInstance

    card = node.registry.resolve(name)
    if card is None:
        known = ", ".join(c.model_id for c in node.model_cards())
        print(f"exo: unknown model {name!r} (known: {known})", file=sys.stderr)
        return
    # Placement needs to know this node's memory: wait for its first report.
    await node.wait_for_state(lambda s: node.node_id in s.nodes, timeout=60)
    await node.send_command(PlaceInstance(model_id=card.model_id))
    shown = ""
    while True:
        state = await node.wait_for_state(lambda s: True, timeout=3600)
        statuses = [
            state.runners.get(rid)
            for inst in state.instances.values()
            if inst.shard_assignments.model_id == card.model_id
            for rid in inst.shard_assignments.runner_to_shard
        ]
        line = _progress_line(card.model_id, statuses)
        if line != shown:
            end = "\n" if line.startswith(("ready", "failed")) else ""
            print(f"\r\x1b[2K{line}" if sys.stderr.isatty() else line, end=end or "\n",
                  file=sys.stderr, flush=True)
            shown = line
        if line.startswith("ready"):
            return
        await _next_change(node)


async def _next_change(node: Node) -> None:
    current = node.state().last_event_applied_idx
    await node.wait_for_state(lambda s: s.last_event_applied_idx != current, timeout=3600)


def _progress_line(model_id: str, statuses: list[object]) -> str:
    if statuses and all(isinstance(s, (RunnerReady, RunnerRunning)) for s in statuses):
        return f"ready: {model_id}"
    for s in statuses:
        if isinstance(s, RunnerFailed):
            return f"failed: {model_id}: {s.error_message} (retrying)"
    loading = [s for s in statuses if isinstance(s, RunnerLoading)]
    if loading:
        done = sum(s.layers_loaded for s in loading)
        total = sum(s.total_layers for s in loading) or 1
        width = 30
        filled = width * done // total
        return f"loading {model_id} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} layers"
    return f"starting {model_id} ..."


if __name__ == "__main__":
    main()
