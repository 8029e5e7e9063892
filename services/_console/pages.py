"""The console's HTML, rendered on the server: the inbox of held calls, the turns, a turn, and the refusals.

Every value from customers, models, tools and people goes through `esc`: nothing they wrote is ever read as markup.
The page has no inline script or style (its Content-Security-Policy allows neither); the script refreshes a page's
live part by parsing the fragment with DOMParser, which runs no script.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from roundtrip._console.auth import CSRF_FIELD, Identity
from roundtrip._console.timeline import customer_words, last_model_text, result_value, texts

POLL_MS = 1500
FILTERS = ("status", "outcome", "customer", "max_age_min", "agent", "conversation", "lane", "version")  # /turns?...
STATUS_COLOURS = {
    "running": "#0b7285",
    "stuck": "#c92a2a",
    "waiting": "#1864ab",
    "awaiting": "#e67700",
    "ending": "#862e9c",
    "ended": "#868e96",
}

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#212529;background:#f8f9fa}
header{background:#212529;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:center}
header a{color:#fff;text-decoration:none}header .who{margin-left:auto;opacity:.8}
main{padding:1em 1.2em;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff}td,th{border-bottom:1px solid #dee2e6;padding:.4em .5em;
text-align:left;vertical-align:top}th{background:#f1f3f5}
.card{background:#fff;border:1px solid #dee2e6;border-radius:6px;padding:.8em 1em;margin:0 0 1em}
.card h3{margin:.1em 0 .4em}pre{background:#f1f3f5;padding:.5em;overflow:auto;max-height:24em;margin:.3em 0;
white-space:pre-wrap;overflow-wrap:anywhere}
blockquote.words{margin:.3em 0;padding:.4em .8em;border-left:4px solid #1864ab;background:#e7f5ff;white-space:pre-wrap}
.said{white-space:pre-wrap;margin:.3em 0}details>summary{cursor:pointer;color:#1864ab}
.step{background:#fff;border:1px solid #dee2e6;border-radius:6px;padding:.6em 1em;margin:0 0 .8em}
.step h4{margin:.1em 0 .4em}.facts{color:#495057;font-size:13px}.call{border-top:1px dashed #dee2e6;padding:.4em 0}
.v-approved{color:#2b8a3e;font-weight:600}.v-rejected{color:#c92a2a;font-weight:600}
.v-held{color:#e67700;font-weight:600}.ending{font-weight:600}
.muted{color:#868e96}.notice{padding:.6em 1em;border-radius:6px;margin:0 0 1em}
.ok{background:#d3f9d8}.bad{background:#ffe3e3}.warn{background:#fff3bf}
button{padding:.35em .9em;border-radius:4px;border:1px solid #adb5bd;cursor:pointer}
button.approve{background:#2b8a3e;color:#fff;border-color:#2b8a3e}button.deny{background:#c92a2a;color:#fff;
border-color:#c92a2a}input[type=text]{width:22em;padding:.3em}.status{font-weight:600}
.countdown{font-weight:600;color:#e67700}form.filters{margin:0 0 1em}
form.filters input,form.filters select{margin-right:.6em}.error{color:#c92a2a}
""" + "".join(f".st-{status}{{color:{colour}}}" for status, colour in STATUS_COLOURS.items())

SCRIPT = """
(function(){
  function tick(){document.querySelectorAll('[data-expires]').forEach(function(el){
    var left=Math.round(parseFloat(el.dataset.expires)-Date.now()/1000);
    el.textContent=left>0?Math.floor(left/60)+' min '+(left%60)+' s left':'deadline passed';});}
  function refresh(){var box=document.getElementById('live');if(!box){return;}
    fetch(box.dataset.src,{credentials:'same-origin',cache:'no-store'}).then(function(r){
      if(!r.ok){throw new Error('HTTP '+r.status);}return r.text();}).then(function(text){
      var parsed=new DOMParser().parseFromString(text,'text/html').body.firstElementChild;
      var fresh=parsed?document.importNode(parsed,true):null;
      document.getElementById('offline').hidden=true;
      if(!fresh||fresh.dataset.version===(box.firstElementChild||{dataset:{}}).dataset.version){return;}
      var typed={};box.querySelectorAll('input[name=reason]').forEach(function(i){typed[i.form.action]=i.value;});
      var opened={};box.querySelectorAll('details[data-key]').forEach(function(d){opened[d.dataset.key]=d.open;});
      box.replaceChildren(fresh);
      box.querySelectorAll('details[data-key]').forEach(function(d){
        if(d.dataset.key in opened){d.open=opened[d.dataset.key];}});
      box.querySelectorAll('input[name=reason]').forEach(function(i){if(typed[i.form.action]){i.value=typed[i.form.action];}});
      tick();}).catch(function(){document.getElementById('offline').hidden=false;});}
  tick();setInterval(tick,1000);setInterval(refresh,POLL);
})();
""".replace("POLL", str(POLL_MS))


def _status_class(status: str) -> str:
    return f"st-{status}" if status in STATUS_COLOURS else ""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def pretty(value: Any) -> str:
    return esc(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str))


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


def page(title: str, body: str, identity: Identity | None) -> str:
    who = (
        f'<span class="who">{esc(identity.name)} ({esc(identity.role or "no role")})</span>'
        if identity
        else '<span class="who">not signed in</span>'
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · roundtrip console</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="stylesheet" href="/static/console.css"></head><body>'
        f'<header><strong>roundtrip console</strong><a href="/approvals">Approvals</a><a href="/turns">Turns</a>'
        f'<a href="/versions">Versions</a><a href="/dead-letters">Dead letters</a>{who}'
        f'</header><main><div id="offline" class="notice bad" hidden>The console cannot reach its server; '
        f"what you see may be out of date.</div>{body}</main><script src='/static/console.js'></script></body></html>"
    )


def live(src: str, fragment: str) -> str:
    """A part of the page the script refreshes from `src`."""
    return f'<div id="live" data-src="{esc(src)}">{fragment}</div>'


def notice(text: str, kind: str) -> str:
    return f'<div class="notice {esc(kind)}" role="status">{esc(text)}</div>'


def trace_link(template: str | None, trace_id: str) -> str:
    """A link to the trace where the deployment's tracing UI shows it; else the command that prints it."""
    if not trace_id:
        return ""
    if not template:
        return f"<code>{esc(trace_id)}</code> (<code>roundtrip trace {esc(trace_id)}</code>)"
    href = template.replace("{trace_id}", quote(trace_id, safe=""))
    return f'<a href="{esc(href)}" target="_blank" rel="noopener">trace {esc(trace_id[:8])}…</a>'


LONG_RESULT = 1200  # characters: a longer result is collapsed, a click away


def result_html(value: Any, key: str) -> str:
    """A tool result as it reads best: JSON pretty-printed, text as text, wrapped; a long one collapsed."""
    shown = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)
    block = f'<pre class="result">{esc(shown)}</pre>'
    if len(shown) <= LONG_RESULT:
        return block
    lines = shown.count("\n") + 1
    return (
        f'<details data-key="{esc(key)}"><summary>{lines} lines, {len(shown)} characters: show</summary>{block}'
        "</details>"
    )


def words(texts: list[str]) -> str:
    return "".join(f'<blockquote class="words">{esc(t)}</blockquote>' for t in texts) or (
        '<span class="muted">(no words of the customer in this turn)</span>'
    )


def history_html(messages: list[dict[str, Any]], key: str) -> str:
    """The conversation's earlier turns, collapsed: the customer's words and the model's text of each."""
    if not messages:
        return ""
    lines = [
        f'<p><strong>{"customer" if m.get("role") == "user" else "model"}:</strong></p><p class="said">{esc(text)}</p>'
        for m in messages
        if (text := texts(m))
    ]
    return (
        f'<details class="history" data-key="{esc(key)}"><summary>Earlier in this conversation '
        f"({len(messages)} messages)</summary>{''.join(lines)}</details>"
    )


def _decide_form(approval_id: str, csrf: str) -> str:
    action = f"/approvals/{quote(approval_id)}/decide"
    return (
        f'<form method="post" action="{esc(action)}" class="decide">'
        f'<input type="hidden" name="{CSRF_FIELD}" value="{esc(csrf)}">'
        f'<input type="text" name="reason" maxlength="500" placeholder="reason (the model reads it on a deny)">'
        ' <button class="approve" name="decision" value="approve">Approve</button>'
        ' <button class="deny" name="decision" value="deny">Deny</button></form>'
    )


def approval_card(
    row: Any, request: Any, identity: Identity, csrf: str, trace_template: str | None, sent: str | None
) -> str:
    """One held call as a person decides it: what the customer asked, what the model said, the exact call and the
    entity it resolves to, why a person must decide, the countdown to the deadline, and the decision form."""
    if sent:
        action = f'<p class="notice warn">{esc(sent)}</p>'
    elif identity.may_decide:
        action = _decide_form(row.approval_id, csrf)
    else:
        action = '<p class="muted">You may look, not decide (viewer).</p>'
    history = request.turn.history_messages
    said = last_model_text(request.messages)
    results = (
        "".join(
            result_html(result_value(r.get("content")), f"{row.approval_id}-r{i}")
            for i, r in enumerate(request.results)
        )
        or '<span class="muted">none</span>'
    )
    return (
        f'<div class="card approval" id="{esc(row.approval_id)}" data-approval="{esc(row.approval_id)}">'
        f"<h3>{esc(request.call.name)} for {esc(row.customer_id)} "
        f'<span class="countdown" data-expires="{row.expires_at:.3f}"></span></h3>'
        f'<p><strong>The customer asked:</strong></p><div class="customer">'
        f"{words(customer_words(request.messages[history:]))}</div>"
        f"<p><strong>The model said (step {request.step}):</strong></p>"
        + (f'<p class="said model-text">{esc(said)}</p>' if said else '<p class="muted">(nothing, only the call)</p>')
        + f"<p><strong>Why a person decides:</strong> {esc(row.reason)}</p><p><strong>The call:</strong></p>"
        f'<pre class="input">{pretty(request.call.input)}</pre><p><strong>Resolved for this customer:</strong></p>'
        f"<pre>{pretty(request.entities)}</pre><p><strong>Results of the step so far:</strong></p>{results}"
        + history_html(request.messages[:history], f"{row.approval_id}-history")
        + f'<p class="muted">approval <code>{esc(row.approval_id)}</code> · requested {esc(when(row.requested_at))} · '
        f"deadline {esc(when(row.expires_at))} · "
        f'<a href="/turns/{quote(row.turn_id)}">turn {esc(row.turn_id)}</a> · '
        f"{trace_link(trace_template, request.turn.trace_id)}</p>{action}</div>"
    )


def inbox(cards: list[str], version: str, trouble: str | None) -> str:
    body = "".join(cards) or '<p class="muted" id="empty">No call is waiting for a person.</p>'
    warning = notice(trouble, "bad") if trouble else ""
    return f'<div data-version="{esc(version)}">{warning}<h2>Waiting for a person ({len(cards)})</h2>{body}</div>'


def refusal(message: str, back: str) -> str:
    return f'{notice(message, "bad")}<p><a href="{esc(back)}">Back</a></p>'


def turn_filters(given: Mapping[str, str]) -> str:
    """The turn list's filters, filled in as `given` (the page's query) has them."""
    status, outcome, customer, max_age_min, agent, conversation, lane, version = (given.get(k, "") for k in FILTERS)
    options = "".join(
        f'<option value="{s}"{" selected" if s == status else ""}>{s or "any status"}</option>'
        for s in ("", *STATUS_COLOURS)
    )
    lanes = "".join(
        f'<option value="{s}"{" selected" if s == lane else ""}>{s or "any lane"}</option>'
        for s in ("", "interactive", "batch")
    )
    return (
        f'<form class="filters" method="get" action="/turns"><select name="status">{options}</select>'
        f'<select name="lane">{lanes}</select>'
        f'<input type="text" name="version" placeholder="agent version (v2, default)" value="{esc(version)}">'
        f'<input type="text" name="outcome" placeholder="outcome (end_turn, cancelled…)" value="{esc(outcome)}">'
        f'<input type="text" name="customer" placeholder="customer" value="{esc(customer)}">'
        f'<input type="text" name="conversation" placeholder="conversation" value="{esc(conversation)}">'
        f'<input type="text" name="max_age_min" placeholder="started within minutes" value="{esc(max_age_min)}">'
        f'<input type="text" name="agent" placeholder="agent (digest)" value="{esc(agent)}">'
        "<button>Filter</button></form>"
    )


def turns_table(rows: list[Any], version: str, trouble: str | None, now: float) -> str:
    cells = []
    for r in rows:
        tokens = r.input_tokens + r.cache_creation_input_tokens + r.cache_read_input_tokens
        cells.append(
            f'<tr data-turn="{esc(r.turn_id)}"><td><a href="/turns/{quote(r.turn_id)}">{esc(r.turn_id)}</a></td>'
            f'<td class="status {_status_class(r.status)}">{esc(r.shown_status)}</td>'
            f'<td class="lane">{esc(r.shown_lane)}</td><td class="version">{esc(r.shown_version)}</td>'
            f"<td>{esc(r.customer_id)}</td>"
            f'<td><a href="/turns?conversation={quote(r.conversation_id)}">{esc(r.conversation_id)}</a></td>'
            f"<td>{r.step}</td><td>{esc(r.outcome or '')}</td><td>{r.cost_usd:.4f}</td>"
            f"<td>{tokens}/{r.output_tokens}</td><td>{now - r.started_at:.0f}</td>"
            f"<td><code>{esc((r.agent_digest or '')[:12])}</code></td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "turn",
            "status",
            "lane",
            "version",
            "customer",
            "conversation",
            "steps",
            "outcome",
            "cost $",
            "tokens in/out",
            "age s",
            "agent",
        )
    )
    table = f"<table><tr>{head}</tr>{''.join(cells)}</table>" if cells else '<p class="muted">No turns.</p>'
    warning = notice(trouble, "bad") if trouble else ""
    return f'<div data-version="{esc(version)}">{warning}{table}</div>'


def approvals_history(rows: list[Any]) -> str:
    if not rows:
        return '<p class="muted">No call of this turn waited for a person.</p>'
    head = "".join(f"<th>{h}</th>" for h in ("approval", "tool", "why", "status", "decided by", "at", "their reason"))
    cells = "".join(
        f"<tr><td><code>{esc(r.approval_id)}</code></td><td>{esc(r.tool)}</td><td>{esc(r.reason)}</td>"
        f'<td class="status">{esc(r.status)}</td><td>{esc(r.decided_by or "")}</td><td>{esc(when(r.decided_at))}</td>'
        f"<td>{esc(r.decision_reason or '')}</td></tr>"
        for r in rows
    )
    return f"<table>{head and '<tr>' + head + '</tr>'}{cells}</table>"


def cancel_form(turn_id: str, csrf: str) -> str:
    return (
        f'<form method="post" action="/turns/{quote(turn_id)}/cancel" class="cancel">'
        f'<input type="hidden" name="{CSRF_FIELD}" value="{esc(csrf)}">'
        '<input type="text" name="reason" maxlength="500" placeholder="reason (recorded with the turn)">'
        ' <button class="deny">Cancel this turn</button></form>'
    )


def turn_summary(row: Any, trace_template: str | None, now: float) -> str:
    facts = [
        ("status", f'<span class="status {_status_class(row.status)}">{esc(row.shown_status)}</span>'),
        ("lane", esc(row.shown_lane)),
        ("version", esc(row.shown_version)),
        ("outcome", esc(row.outcome or "")),
        ("customer", esc(row.customer_id)),
        ("conversation", esc(row.conversation_id)),
        ("steps", str(row.step)),
        ("started", f"{esc(when(row.started_at))} ({now - row.started_at:.0f} s ago)"),
        ("ended", esc(when(row.ended_at))),
        (
            "tokens",
            f"{row.input_tokens} in, {row.output_tokens} out, cache {row.cache_creation_input_tokens} written / "
            f"{row.cache_read_input_tokens} read",
        ),
        ("cost", f"${row.cost_usd:.4f}"),
        ("trace", trace_link(trace_template, row.trace_id)),
    ]
    rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    return f'<table class="summary" data-status="{esc(row.status)}">{rows}</table>'


def _model_facts(model: Any) -> str:
    if model is None:
        return '<p class="facts muted">model call: its span has not arrived (spans are written in batches)</p>'
    cost = f" · ${model.cost_usd:.4f}" if model.cost_usd is not None else ""
    tries = f" ({model.attempts} attempts)" if model.attempts > 1 else ""
    return (
        f'<p class="facts model">model call {model.latency_ms:.0f} ms{tries} · tokens {model.input_tokens} in, '
        f"{model.output_tokens} out, cache {model.cache_read_tokens} read / {model.cache_write_tokens} written"
        f"{cost} · stop <code>{esc(model.stop_reason)}</code></p>"
    )


def _call_html(call: Any, approvals: list[Any], key: str) -> str:
    verdict = (
        f'<span class="verdict v-{esc(call.verdict)}">{esc(call.verdict)}</span>'
        if call.verdict
        else '<span class="muted">gate: not yet in the trace</span>'
    )
    by = f" by {esc(call.approved_by)}" if call.approved_by else ""
    reason = f" <span class='reason'>{esc(call.reason)}</span>" if call.reason else ""
    ran = f" · ran {call.ran_ms:.0f} ms" if call.ran_ms is not None else ""
    decided = "".join(
        f'<p class="facts approval">approval <code>{esc(a.approval_id)}</code>: {esc(a.status)}'
        + (f" by {esc(a.decided_by)} at {esc(when(a.decided_at))}" if a.decided_by else "")
        + (f": <span class='reason'>{esc(a.decision_reason)}</span>" if a.decision_reason else "")
        + "</p>"
        for a in approvals
        if a.tool_use_id == call.tool_use_id
    )
    if call.has_result:
        mark = '<span class="error">error</span>' if call.is_error else "result"
        result = f"<p>{mark}</p>{result_html(call.result, key)}"
    else:
        result = '<p class="muted">no result yet</p>'
    return (
        f'<div class="call" data-call="{esc(call.tool_use_id)}"><p><strong>{esc(call.name)}</strong> '
        f"{verdict}{by}{reason}{ran}</p>"
        + (f'<pre class="input">{pretty(call.input)}</pre>' if call.input is not None else "")
        + decided
        + result
        + "</div>"
    )


def timeline(tl: Any, approvals: list[Any], version: str, trouble: str | None) -> str:
    """The turn's steps (timeline.build), the customer's words first and the guard's ending last."""
    steps = []
    for step in tl.steps:
        said = f'<p class="said model-text">{esc(step.text)}</p>' if step.text else ""
        calls = "".join(_call_html(c, approvals, f"s{step.number}-{c.tool_use_id}") for c in step.calls)
        guard = f'<p class="facts">guard: {esc(step.decision)}</p>' if step.decision else ""
        steps.append(
            f'<div class="step" data-step="{step.number}"><h4>Step {step.number}</h4>'
            f"{_model_facts(step.model)}{said}{calls}{guard}</div>"
        )
    body = "".join(steps) or '<p class="muted">No step has been recorded yet.</p>'
    ending = f'<p class="ending">{esc(tl.ending)}</p>' if tl.ending else ""
    warning = notice(trouble, "warn") if trouble else ""
    return (
        f'<div data-version="{esc(version)}">{warning}{history_html(tl.history, "history")}'
        f'<h3>The customer</h3><div class="customer">{words(tl.customer)}</div>'
        f"<h3>Steps</h3>{body}{ending}</div>"
    )
