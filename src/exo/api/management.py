"""exo's own endpoints: state, models, instances and their placement, health, metrics."""

from collections.abc import Sequence
from typing import Any

import anyio
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import Field

from exo.api.errors import ApiError
from exo.api.generation_service import GenerationService
from exo.api.serving import submit_and_wait
from exo.api.task_params import ApiModel
from exo.master.placement import PlacementPreview, model_holders, placement_previews
from exo.shared.models import catalogue
from exo.shared.models.model_cards import ModelCard
from exo.shared.models.registry import CardUnavailable, ModelRegistry
from exo.shared.types.commands import (
    DeleteInstance,
    DownloadAction,
    DownloadActionKind,
    PlaceInstance,
)
from exo.shared.types.common import NodeId
from exo.shared.types.state import State
from exo.shared.types.state_queries import instances_of
from exo.shared.types.worker.instances import InstanceId, Sharding, instance_is_serving
from exo.utils import metrics

COMMAND_WAIT_S = 45.0
"""How long placing or deleting an instance waits for the master to apply it (longer
than a command waits for a master: with none, that definite 503 comes first)."""


class PlaceInstanceRequest(ApiModel):
    model: str
    sharding: Sharding = "pipeline"
    min_nodes: int = Field(default=1, ge=1)


class DownloadRequest(ApiModel):
    model: str = Field(min_length=1)
    node_id: str | None = None


class AddModelRequest(ApiModel):
    model: str = Field(min_length=1, description="org/repo or org/repo:QUANT")


def downloads_of(state: State, card: ModelCard) -> dict[str, Any]:
    """Per node: the model's download progress (completed: where its files are)."""
    return {
        node_id: progress.model_dump(mode="json")
        for node_id, models in state.downloads.items()
        if (progress := models.get(card.model_id)) is not None
    }


async def search_hub(registry: ModelRegistry, query: str, limit: int) -> list[dict[str, Any]]:
    try:
        found = await anyio.to_thread.run_sync(registry.search, query, limit)
    except CardUnavailable as e:
        if e.status is None:
            raise ApiError(503, e.message, code="hub_unavailable",
                           headers={"Retry-After": "10"}) from e
        raise ApiError(e.status, e.message, code="hub_offline") from e
    return [{"id": repo} for repo in found]


def choose_preview(
    previews: Sequence[PlacementPreview], sharding: Sharding, min_nodes: int
) -> PlacementPreview | str:
    """The placement the master will make (the fewest nodes from ``min_nodes`` up), or
    why there is none."""
    candidates = sorted(
        (p for p in previews if p.sharding == sharding and p.node_count >= min_nodes),
        key=lambda p: p.node_count,
    )
    for preview in candidates:
        if preview.valid:
            return preview
    if not candidates:
        nodes = max((p.node_count for p in previews), default=0)
        return f"min_nodes is {min_nodes} but the cluster has {nodes} node(s)"
    reasons = "; ".join(f"on {p.node_count} node(s): {p.reason}" for p in candidates)
    return f"no {sharding} placement fits: {reasons}"


def instance_view(state: State, instance_id: InstanceId) -> dict[str, Any]:
    instance = state.instances[instance_id]
    runners = {
        rid: state.runners[rid].model_dump(mode="json")
        for rid in instance.shard_assignments.runner_to_shard
        if rid in state.runners
    }
    return {
        "instance": instance.model_dump(mode="json"),
        "runners": runners,
        "serving": instance_is_serving(instance, state.runners),
    }


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()
    handle = service.handle

    @api.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/metrics")
    async def metrics_text() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=metrics.CONTENT_TYPE)

    @api.get("/state")
    async def state() -> JSONResponse:
        return JSONResponse(handle.state().model_dump(mode="json"))

    @api.get("/node_id")
    async def node_id() -> str:
        return str(handle.node_id)

    @api.get("/models")
    async def models() -> list[dict[str, Any]]:
        current = handle.state()
        return [
            {**card.model_dump(mode="json"), "downloads": downloads_of(current, card)}
            for card in service.model_cards()
        ]

    @api.post("/models/add")
    async def add_model(body: AddModelRequest) -> dict[str, Any]:
        card = await service.fetch_card(catalogue.hub_name(body.model) or body.model)
        return card.model_dump(mode="json")

    @api.get("/models/catalogue")
    async def models_catalogue() -> list[dict[str, Any]]:
        return [entry.model_dump(mode="json") for entry in catalogue.listing()]

    @api.get("/models/search")
    async def search_models(
        q: str = Query(min_length=1), limit: int = Query(default=20, ge=1, le=100)
    ) -> list[dict[str, Any]]:
        return await search_hub(service.registry, q, limit)

    async def download_action(action: DownloadActionKind, model: str, node: str | None) -> dict[str, Any]:
        card = await service.resolve_model_async(model)
        if card.hub is None:
            raise ApiError(400, f"{card.model_id} is not a hub model: it has nothing to download",
                           param="model")
        node_id = NodeId(node) if node else handle.node_id
        if node_id not in handle.state().nodes:
            raise ApiError(404, f"no node {node_id} in the cluster", param="node_id")
        command = DownloadAction(action=action, node_id=node_id, model_card=card)
        await service.send(command)
        return {"message": f"download {action}", "model": card.model_id, "node_id": node_id,
                "command_id": command.command_id}

    @api.post("/download/start")
    async def download_start(body: DownloadRequest) -> dict[str, Any]:
        return await download_action("start", body.model, body.node_id)

    @api.post("/download/cancel")
    async def download_cancel(body: DownloadRequest) -> dict[str, Any]:
        return await download_action("cancel", body.model, body.node_id)

    @api.delete("/download/{node_id}/{model:path}")
    async def download_delete(node_id: str, model: str) -> dict[str, Any]:
        return await download_action("delete", model, node_id)

    @api.get("/instance/previews")
    async def previews(model: str = Query(min_length=1)) -> dict[str, Any]:
        card = service.resolve_model(model)
        current = handle.state()
        found = placement_previews(
            card, current.nodes, current.topology, current.instances,
            model_holders(current, card.model_id),
        )
        return {
            "model": card.model_id,
            "previews": [p.model_dump(mode="json") for p in found],
        }

    @api.post("/place_instance")
    async def place_instance(body: PlaceInstanceRequest) -> dict[str, Any]:
        card = await service.resolve_model_async(body.model)
        current = handle.state()
        found = placement_previews(
            card, current.nodes, current.topology, current.instances,
            model_holders(current, card.model_id),
        )
        chosen = choose_preview(found, body.sharding, body.min_nodes)
        if isinstance(chosen, str):
            raise ApiError(409, f"cannot place {card.model_id}: {chosen}")
        command = PlaceInstance(
            model_id=card.model_id, sharding=body.sharding, min_nodes=body.min_nodes,
            model_card=card if card.hub is not None else None,
        )
        before = {i.instance_id for i in instances_of(current, card.model_id)}
        await submit_and_wait(
            handle, command,
            lambda s: any(i.instance_id not in before for i in instances_of(s, card.model_id)),
            timeout_s=COMMAND_WAIT_S, what=f"cannot place {card.model_id}",
        )
        return {
            "message": "placing instance",
            "command_id": command.command_id,
            "model": card.model_id,
            "sharding": body.sharding,
            "node_count": chosen.node_count,
            "memory_per_node": chosen.memory_per_node,
        }

    @api.get("/instance/{instance_id}")
    async def get_instance(instance_id: str) -> dict[str, Any]:
        current = handle.state()
        iid = InstanceId(instance_id)
        if iid not in current.instances:
            raise ApiError(404, f"no instance {instance_id}")
        return instance_view(current, iid)

    @api.delete("/instance/{instance_id}")
    async def delete_instance(instance_id: str) -> dict[str, Any]:
        iid = InstanceId(instance_id)
        if iid not in handle.state().instances:
            raise ApiError(404, f"no instance {instance_id}")
        command = DeleteInstance(instance_id=iid)
        await submit_and_wait(
            handle, command, lambda s: iid not in s.instances, timeout_s=COMMAND_WAIT_S,
            what=f"cannot delete instance {instance_id}",
        )
        return {
            "message": "deleting instance",
            "instance_id": iid,
            "command_id": command.command_id,
        }

    return api
