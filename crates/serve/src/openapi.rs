//! The OpenAPI document served at `/v1/openapi.json` (what DESIGN.md §9's table says, in
//! OpenAPI 3.1). A test checks that every route of the router is in it.

/// The document.
pub(crate) const DOCUMENT: &str = r##"{
  "openapi": "3.1.0",
  "info": {"title": "keel host API", "version": "1",
    "description": "keel serve: sessions, turns, SSE events from the ledger, remote approvals. Every route but /v1/health needs Authorization: Bearer TOKEN. Errors are {\"error\": {\"code\", \"message\"}}; a body that is not valid JSON or not of the documented shape is 400 bad_request, one over the size limit 413 payload_too_large, one without a JSON content type 415 unsupported_media_type."},
  "components": {
    "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    "schemas": {
      "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
      "Scope": {"oneOf": [{"type": "string", "description": "all, or TOOL,TOOL"}, {"type": "array", "items": {"type": "string"}}]},
      "CreateSession": {"type": "object", "required": ["workspace"], "additionalProperties": false, "properties": {
        "workspace": {"type": "string", "description": "absolute path inside the host's workspace roots"},
        "model": {"type": "string", "description": "openai:MODEL | openai-responses:MODEL | anthropic:MODEL | scripted:PATH"},
        "base_url": {"type": "string"},
        "envelope": {"type": "object", "additionalProperties": false, "properties": {"reads": {"$ref": "#/components/schemas/Scope"}, "writes": {"$ref": "#/components/schemas/Scope"}, "forbid": {"$ref": "#/components/schemas/Scope"}}},
        "mode": {"enum": ["live", "shadow", "plan"]},
        "approval": {"enum": ["ask", "auto", "sandboxed", "deny"], "description": "ask (default): consent is asked over this API"}}},
      "Turn": {"type": "object", "required": ["input"], "additionalProperties": false, "properties": {
        "input": {"type": "string"}, "max_steps": {"type": "integer", "minimum": 1}, "max_tokens": {"type": "integer", "minimum": 1},
        "max_cost_usd": {"type": "number"}, "max_time": {"type": "string", "description": "500ms, 90s, 10m, 2h"}}},
      "Started": {"type": "object", "properties": {"turn_id": {"type": ["string", "null"]}, "run_id": {"type": ["string", "null"]}}},
      "Session": {"type": "object", "properties": {"session_id": {"type": "string", "description": "as POST /v1/sessions answers it"}, "id": {"type": "string", "description": "the same as session_id (kept for older clients)"}, "workspace": {"type": "string"}, "model": {"type": "string"}, "title": {"type": "string"},
        "state": {"enum": ["idle", "running", "interrupted", "completed", "failed", "suspended", "cancelled", "denied", "sealed"]}, "active_here": {"type": "boolean"},
        "created_at": {"type": "string"}, "updated_at": {"type": "string"}, "last_seq": {"type": "integer"}, "parent": {"type": ["string", "null"]},
        "usage": {"type": "object", "description": "token counts include keel's estimates where the provider reported none: estimated_tokens of them; estimated is true when any figure is an estimate", "properties": {"input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}, "estimated_tokens": {"type": "integer"}, "estimated": {"type": "boolean"}, "responses": {"type": "integer"}, "responses_without_usage": {"type": "integer"}}},
        "cost_usd": {"type": ["number", "null"]}}},
      "Pending": {"type": "object", "properties": {"call_id": {"type": "string"}, "tool": {"type": "string"}, "access": {"enum": ["read", "write"]}, "arguments": {}, "requested_seq": {"type": "integer"}}},
      "Answer": {"type": "object", "required": ["answer"], "additionalProperties": false, "properties": {"answer": {"enum": ["allow_once", "allow_session", "allow_exact", "deny"]}}}
    },
    "responses": {
      "Error": {"description": "failure", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    },
    "parameters": {
      "id": {"name": "id", "in": "path", "required": true, "schema": {"type": "string", "format": "uuid"}}
    }
  },
  "security": [{"bearer": []}],
  "paths": {
    "/v1/health": {"get": {"security": [], "summary": "liveness, no token", "responses": {"200": {"description": "{status: ok, version}"}}}},
    "/v1/openapi.json": {"get": {"summary": "this document", "responses": {"200": {"description": "OpenAPI 3.1"}}}},
    "/v1/sessions": {
      "post": {"summary": "create a session", "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CreateSession"}}}},
        "responses": {"201": {"description": "{session_id}"}, "400": {"$ref": "#/components/responses/Error"}, "401": {"$ref": "#/components/responses/Error"}, "403": {"$ref": "#/components/responses/Error"}, "413": {"$ref": "#/components/responses/Error"}}},
      "get": {"summary": "sessions, newest first", "responses": {"200": {"description": "{sessions: [Session]}"}}}},
    "/v1/sessions/{id}": {"get": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "one session", "responses": {"200": {"description": "Session", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Session"}}}}, "404": {"$ref": "#/components/responses/Error"}}}},
    "/v1/sessions/{id}/turns": {"post": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "a new turn; answers once its run started",
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Turn"}}}},
      "responses": {"202": {"description": "Started", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Started"}}}}, "400": {"$ref": "#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}, "423": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Error"}}}},
    "/v1/sessions/{id}/input": {"post": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "steering: input for the active run, joined at its next step boundary (never mid-call); answers once its input_joined event is durable. 409 no_active_run: start a turn instead; 409 run_ending: the run ended first and the input was not recorded",
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": {"input": {"type": "string", "minLength": 1}}, "required": ["input"], "additionalProperties": false}}}},
      "responses": {"200": {"description": "{joined: true, seq}: the seq of the input_joined event"}, "400": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/sessions/{id}/plan/approve": {"post": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "approve the plan of a session in plan mode (plan_approved), then start the live turn that carries it out; 409 not_planning when there is no plan to approve (not plan mode, no plan-mode turn completed yet, or approved already)",
      "responses": {"202": {"description": "{approved_seq, turn_id, run_id}"}, "404": {"$ref": "#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}, "423": {"$ref": "#/components/responses/Error"}}}},
    "/v1/sessions/{id}/resume": {"post": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "resume the last turn with a new run", "responses": {"202": {"description": "Started"}, "409": {"$ref": "#/components/responses/Error"}, "423": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Error"}}}},
    "/v1/sessions/{id}/cancel": {"post": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "cancel the active run", "responses": {"202": {"description": "cancelling"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/sessions/{id}/seal": {"post": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "seal: the session never runs agent code again", "requestBody": {"required": false, "content": {"application/json": {"schema": {"type": "object", "properties": {"reason": {"type": "string"}}}}}}, "responses": {"200": {"description": "{sealed: true, reason, seq}"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/sessions/{id}/events": {"get": {"parameters": [{"$ref": "#/components/parameters/id"}, {"name": "after", "in": "query", "schema": {"type": "integer"}}, {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}}],
      "summary": "SSE: id = ledger seq, event = kind, data = RuntimeEvent JSON; replays after the seq given, then follows; `: ping` comments; permission_pending and question_pending events (no id) re-send pending requests and questions; a final dropped event when the host drops a slow client",
      "responses": {"200": {"description": "text/event-stream"}}}},
    "/v1/sessions/{id}/permissions": {"get": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "pending permission requests", "responses": {"200": {"description": "[Pending]", "content": {"application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/Pending"}}}}}}}},
    "/v1/sessions/{id}/permissions/{call_id}": {"post": {"parameters": [{"$ref": "#/components/parameters/id"}, {"name": "call_id", "in": "path", "required": true, "schema": {"type": "string"}}],
      "summary": "answer a request: the first answer wins; the same again is 200, a different one 409",
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Answer"}}}},
      "responses": {"200": {"description": "{answer, by, settled_seq}"}, "202": {"description": "accepted, not recorded yet"}, "400": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/sessions/{id}/questions": {"get": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "an MCP server's pending questions (elicitation): [{question, call_id, tool, server, message (the server's words: untrusted), schema, requested_seq}]", "responses": {"200": {"description": "[Question]"}}}},
    "/v1/sessions/{id}/questions/{question}": {"post": {"parameters": [{"$ref": "#/components/parameters/id"}, {"name": "question", "in": "path", "required": true, "description": "the question field of elicitation_requested, as it is: CALL.qN (e.g. call_1_1.q1), only URL-unreserved characters (A-Z a-z 0-9 _ - . ~)", "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.~-]+$"}}],
      "summary": "answer a question: accept with content that fits its form, decline or cancel; recorded as elicitation_answered",
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["action"], "additionalProperties": false, "properties": {"action": {"enum": ["accept", "decline", "cancel"]}, "content": {"type": "object"}}}}}},
      "responses": {"200": {"description": "{question, action, by, answered_seq}"}, "202": {"description": "accepted, not recorded yet"}, "400": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}, "422": {"$ref": "#/components/responses/Error"}}}},
    "/v1/schedules": {
      "post": {"summary": "add a schedule: every DURATION or a cron expression in a zone, into a session or a new session per fire; the host fires it, each slot once",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["task"], "additionalProperties": false, "properties": {
          "every": {"type": "string", "description": "90s, 10m, 1h (at least 1s)"},
          "cron": {"type": "string", "description": "5 or 6 fields"},
          "tz": {"type": "string", "description": "IANA zone for cron (default UTC)"},
          "session_id": {"type": "string"},
          "workspace": {"type": "string", "description": "absolute path inside the host's workspace roots (a new session per fire)"},
          "model": {"type": "string"},
          "task": {"type": "string"},
          "approval": {"enum": ["ask", "auto", "sandboxed", "deny"], "description": "new sessions only; default deny"},
          "max_steps": {"type": "integer", "minimum": 1},
          "max_cost_usd": {"type": "number"},
          "overlap": {"enum": ["skip", "buffer", "allow"]},
          "catch_up": {"type": "string", "description": "window for slots missed while no host ran (default 5m, at least 5s)"}}}}}},
        "responses": {"201": {"description": "{schedule_id}"}, "400": {"$ref": "#/components/responses/Error"}, "403": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"}}},
      "get": {"summary": "schedules this host admits, with their last fire", "responses": {"200": {"description": "[{schedule_id, created_at, paused, when, target, task, overlap, catch_up_ms, last_fire?}]"}}}},
    "/v1/schedules/{id}": {"delete": {"parameters": [{"$ref": "#/components/parameters/id"}], "summary": "remove a schedule (its fires stay as history)",
      "responses": {"200": {"description": "{schedule_id, removed}"}, "404": {"$ref": "#/components/responses/Error"}}}},
    "/v1/wakes/{wake_id}": {"post": {"parameters": [{"name": "wake_id", "in": "path", "required": true, "schema": {"type": "string"}}],
      "summary": "wake a run parked on wait: the first payload wins and the run resumes once; again, 200 with the first result",
      "requestBody": {"required": false, "content": {"application/json": {"schema": {"type": "object", "additionalProperties": false, "properties": {"payload": {"description": "text (or JSON, sent as its text), at most 64 KiB; the run sees it fenced as untrusted data"}}}}}},
      "responses": {"200": {"description": "{wake_id, session_id, payload, by, received_at}"}, "400": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"}, "413": {"$ref": "#/components/responses/Error"}}}},
    "/v1/web/logins": {"post": {"summary": "a new one-time login link for the web timeline (GET /), good once for five minutes (bearer token, or a logged-in browser's cookie with its CSRF header)",
      "responses": {"201": {"description": "{path: /login?token=SECRET, expires_in_s}"}, "401": {"$ref": "#/components/responses/Error"}}}}
  }
}"##;
