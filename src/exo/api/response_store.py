"""Stored Responses: ``previous_response_id``, ``GET`` and ``DELETE /v1/responses/{id}``.

Each response is kept with its conversation (the input messages and the answer as an
assistant turn), so a later request can continue from it. SQLite in the node's data
directory (in memory without one), at most ``limit`` responses: the oldest go first."""

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, cast

from pydantic import TypeAdapter

from exo.shared.types.text_generation import InputMessage, ToolCall

_MESSAGES = TypeAdapter(list[InputMessage])


def answer_message(output: list[dict[str, Any]]) -> InputMessage | None:
    """A response's output items as one assistant turn (text and calls)."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in output:
        if item.get("type") == "message":
            for part in cast(list[dict[str, Any]], item.get("content", [])):
                texts.append(str(part.get("text", "")))
        elif item.get("type") == "function_call":
            calls.append(
                ToolCall(
                    id=str(item["call_id"]),
                    name=str(item["name"]),
                    arguments=str(item["arguments"]),
                )
            )
    if not texts and not calls:
        return None
    return InputMessage(role="assistant", content="".join(texts), tool_calls=calls)


class ResponseStore:
    def __init__(self, data_dir: Path | None, limit: int = 1000) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        if data_dir is not None:
            data_dir.mkdir(parents=True, exist_ok=True)
        where = str(data_dir / "responses.sqlite") if data_dir is not None else ":memory:"
        self._db = sqlite3.connect(where, check_same_thread=False)
        with self._db:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, stored REAL, "
                "body TEXT, conversation TEXT)"
            )

    def put(self, response: dict[str, Any], conversation: list[InputMessage]) -> None:
        answer = answer_message(cast(list[dict[str, Any]], response.get("output", [])))
        messages = [*conversation, *([answer] if answer is not None else [])]
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                (
                    response["id"],
                    time.time(),
                    json.dumps(response),
                    _MESSAGES.dump_json(messages).decode(),
                ),
            )
            self._db.execute(
                "DELETE FROM responses WHERE id NOT IN "
                "(SELECT id FROM responses ORDER BY stored DESC LIMIT ?)",
                (self._limit,),
            )

    def get(self, response_id: str) -> dict[str, Any] | None:
        row = self._row(response_id, "body")
        return cast(dict[str, Any], json.loads(row)) if row is not None else None

    def conversation(self, response_id: str) -> list[InputMessage] | None:
        row = self._row(response_id, "conversation")
        return _MESSAGES.validate_json(row) if row is not None else None

    def delete(self, response_id: str) -> bool:
        with self._lock, self._db:
            cursor = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            return cursor.rowcount > 0

    def _row(self, response_id: str, column: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {column} FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
        return cast(str, row[0]) if row is not None else None
