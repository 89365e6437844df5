// keel's web timeline: follows the session's SSE stream and answers approvals.
// Everything inserted here was rendered and escaped by the host (/web/sessions/ID/fragment);
// ledger text is never turned into markup in this script.
"use strict";

(function () {
  const KINDS = [
    "session_created", "session_sealed", "turn_started", "run_started", "run_composition",
    "model_requested", "model_response", "model_retry", "budget_exhausted", "compaction",
    "compaction_failed", "checkpoint", "gate_decision", "permission_requested",
    "permission_settled", "tool_attempt_prepared", "tool_result", "shadow_intent",
    "run_completed", "run_failed", "run_suspended", "run_cancelled", "run_denied",
    "boundary_revised", "permission_pending", "schedule_fired",
    "elicitation_requested", "elicitation_answered", "tools_changed",
  ];

  function live(text) {
    const badge = document.getElementById("live");
    if (badge) badge.textContent = text;
  }

  // Answers a pending approval: the form's action is the API's answer route.
  async function answer(form) {
    for (const button of form.parentElement.querySelectorAll("button")) button.disabled = true;
    let message;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Keel-Web": "1" },
        body: JSON.stringify({ answer: form.dataset.answer }),
      });
      const body = await response.json().catch(() => ({}));
      message = response.ok ? "answered: " + form.dataset.answer
        : "refused (" + response.status + "): " + ((body.error && body.error.message) || "");
    } catch (error) {
      message = "not sent: " + error;
    }
    const card = form.closest(".approval");
    if (card) {
      const note = document.createElement("p");
      note.className = "answered";
      note.textContent = message;
      card.appendChild(note);
    }
    refresh();
  }

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (form instanceof HTMLFormElement && form.classList.contains("answer")) {
      event.preventDefault();
      answer(form);
    }
  });

  const main = document.getElementById("session");
  if (!main || !main.dataset.session) return;
  const session = main.dataset.session;
  let lastSeq = Number(main.dataset.lastSeq || "0");
  let pending = null;

  // Fetches what was recorded after lastSeq, as the host rendered it.
  async function refresh() {
    if (pending) return pending;
    pending = (async () => {
      try {
        const response = await fetch("/web/sessions/" + session + "/fragment?after=" + lastSeq,
          { credentials: "same-origin" });
        if (!response.ok) { live("offline (" + response.status + ")"); return; }
        const part = await response.json();
        if (part.last_seq > lastSeq) {
          document.getElementById("timeline").insertAdjacentHTML("beforeend", part.entries);
          lastSeq = part.last_seq;
          main.dataset.lastSeq = String(lastSeq);
        }
        document.getElementById("approvals").innerHTML = part.approvals;
        document.getElementById("summary").innerHTML = part.summary;
      } finally {
        pending = null;
      }
    })();
    return pending;
  }

  const source = new EventSource("/v1/sessions/" + session + "/events?after=" + lastSeq);
  source.onopen = () => live("live");
  source.onerror = () => live("reconnecting…");
  for (const kind of KINDS) source.addEventListener(kind, () => refresh());
})();
