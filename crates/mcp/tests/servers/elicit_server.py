#!/usr/bin/env python3
"""A tiny stdio MCP server for keel's elicitation and tools/list_changed tests. Standard
library only.

Tools:
  ask           asks `elicitation/create` with the call's `message` and `schema` (a small
                form by default) and answers with what came back: `action=… content=…`,
                or `timed out` after `timeout` seconds (60) without an answer
  ask_later     answers at once, then asks a question while no call of it runs; the
                answer is kept for `unprompted`
  unprompted    what the question asked by `ask_later` got back
  add_tool      adds the tool `extra` and sends notifications/tools/list_changed
  remove_tool   removes `extra` and sends notifications/tools/list_changed
  extra         (only after add_tool) answers `extra ran`
"""
import json
import sys
import threading
import time

FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "description": "Your name"},
        "color": {"type": "string", "enum": ["red", "green"], "default": "red"},
    },
    "required": ["name"],
}

BASE_TOOLS = [
    {"name": "ask", "description": "Asks the user a question.",
     "inputSchema": {"type": "object", "properties": {
         "message": {"type": "string"}, "schema": {"type": "object"}}}},
    {"name": "ask_later", "description": "Asks a question after answering.",
     "inputSchema": {"type": "object"}},
    {"name": "unprompted", "description": "What the unprompted question got.",
     "inputSchema": {"type": "object"}},
    {"name": "add_tool", "description": "Adds the tool extra.",
     "inputSchema": {"type": "object"}},
    {"name": "remove_tool", "description": "Removes the tool extra.",
     "inputSchema": {"type": "object"}},
]
EXTRA = {"name": "extra", "description": "Only there after add_tool.",
         "inputSchema": {"type": "object"}}

state = {"extra": False, "unprompted": "none yet", "next_id": 1}
responses = {}
lock = threading.Lock()
arrived = threading.Condition(lock)
write_lock = threading.Lock()


def send(message):
    with write_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def tools():
    return BASE_TOOLS + ([EXTRA] if state["extra"] else [])


def text(request_id, body):
    send({"jsonrpc": "2.0", "id": request_id,
          "result": {"content": [{"type": "text", "text": body}]}})


def elicit(message, schema, timeout=60):
    with lock:
        ask_id = "ask-%d" % state["next_id"]
        state["next_id"] += 1
    send({"jsonrpc": "2.0", "id": ask_id, "method": "elicitation/create",
          "params": {"mode": "form", "message": message, "requestedSchema": schema}})
    deadline = time.time() + timeout
    with arrived:
        while ask_id not in responses:
            left = deadline - time.time()
            if left <= 0:
                return "timed out"
            arrived.wait(left)
        answer = responses.pop(ask_id)
    if "error" in answer:
        return "error=" + json.dumps(answer["error"])
    result = answer.get("result", {})
    return "action=%s content=%s" % (result.get("action"),
                                     json.dumps(result.get("content"), sort_keys=True))


def call(request_id, name, arguments):
    if name == "ask":
        body = elicit(arguments.get("message", "Who are you?"), arguments.get("schema", FORM),
                      timeout=arguments.get("timeout", 60))
        text(request_id, body)
    elif name == "ask_later":
        text(request_id, "asked later")

        def later():
            time.sleep(0.3)
            state["unprompted"] = elicit("A question no call asked for", FORM, timeout=10)
        threading.Thread(target=later, daemon=True).start()
    elif name == "unprompted":
        text(request_id, "unprompted: " + state["unprompted"])
    elif name in ("add_tool", "remove_tool"):
        state["extra"] = name == "add_tool"
        # The notification first, so keel lists the tools again while the call ends.
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        time.sleep(0.2)
        text(request_id, "extra is %s" % ("added" if state["extra"] else "removed"))
    elif name == "extra" and state["extra"]:
        text(request_id, "extra ran")
    else:
        send({"jsonrpc": "2.0", "id": request_id,
              "error": {"code": -32602, "message": "unknown tool " + name}})


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        message = json.loads(line)
        method = message.get("method")
        if method is None:
            with arrived:
                responses[message.get("id")] = message
                arrived.notify_all()
            continue
        request_id = message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "elicit", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools()}})
        elif method == "tools/call":
            # Each call on its own thread: a question's answer arrives on stdin meanwhile.
            threading.Thread(target=call, daemon=True, args=(
                request_id, params.get("name"), params.get("arguments") or {})).start()
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})


if __name__ == "__main__":
    main()
