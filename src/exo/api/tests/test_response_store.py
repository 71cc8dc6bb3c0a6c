"""Stored Responses: continue with previous_response_id, retrieve, delete; bounded; on disk."""

from pathlib import Path

import openai
import pytest

from exo.api.response_store import ResponseStore
from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import TEXT, ScriptedNode, ServedApp
from exo.shared.types.text_generation import InputMessage


def oa(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10)


def test_continue_retrieve_delete(serve: ServeFn, node: ScriptedNode, tmp_path: Path) -> None:
    server = serve(node, data_dir=str(tmp_path))
    client = oa(server)
    first = client.responses.create(model="m1", input="Hi, I am Ana.", instructions="be kind")
    assert first.model_dump()["store"] is True
    second = client.responses.create(
        model="m1", input="What is my name?", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    sent = node.generations[-1].task_params.input
    assert [(m.role, m.content) for m in sent] == [
        ("user", "Hi, I am Ana."),
        ("assistant", TEXT),
        ("user", "What is my name?"),
    ]
    # Streamed responses are stored too, and chains go on.
    with client.responses.stream(
        model="m1", input="And now?", previous_response_id=second.id
    ) as stream:
        third = stream.get_final_response()
    client.responses.create(model="m1", input="last", previous_response_id=third.id)
    assert len(node.generations[-1].task_params.input) == 7
    assert client.responses.retrieve(first.id).output_text == TEXT
    deleted = client.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m1", input="x", previous_response_id=first.id)
    assert (tmp_path / "responses.sqlite").exists()
    unstored = client.responses.create(model="m1", input="secret", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_store_is_bounded_and_survives_a_restart(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path, limit=3)
    for i in range(5):
        store.put({"id": f"resp_{i}", "output": []}, [InputMessage(role="user", content=str(i))])
    assert store.get("resp_0") is None and store.get("resp_1") is None
    again = ResponseStore(tmp_path, limit=3)
    assert again.get("resp_4") == {"id": "resp_4", "output": []}
    assert again.conversation("resp_4") == [InputMessage(role="user", content="4")]
