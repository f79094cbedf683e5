"""A scripted OpenAI-compatible chat server (stdlib only): each request's reply is the next step of a script,
chosen by how many tool results the conversation already holds, so concurrent rollouts each follow it."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def scripted_chat_server(script: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    """Serve POST /v1/chat/completions: the script's calls one a turn, then a text answer. Yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert not body.get("stream"), "the scripted server does not stream"
            done = sum(1 for m in body["messages"] if m.get("role") == "tool")
            if done < len(script):
                name, arguments = script[done]
                call = {"name": name, "arguments": json.dumps(arguments)}
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function", "function": call}],
                }
                finish = "tool_calls"
            else:
                message, finish = {"role": "assistant", "content": "Done."}, "stop"
            reply = {
                "id": "chatcmpl-" + uuid.uuid4().hex,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        thread.join(5)
