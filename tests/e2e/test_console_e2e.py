"""The console in a real browser (issue 33): Debian's headless Chromium driven by Selenium against the session's fleet.

The console runs in the signed mode against a real OIDC issuer process (tests/oidc_issuer.py: discovery document,
JWKS, RS256 tokens). The browser is its own identity-aware proxy: it sends the token the issuer signed for the person
as `Authorization: Bearer` on every request (Chrome DevTools' Network.setExtraHTTPHeaders), as oauth2-proxy would;
the identity headers the development mode believes are sent too, and ignored. The gate holds cancellations above
50.00 EUR (Alice's pending ord_a1000003 is 87.00 EUR). What the server refuses is asked of it directly (httpx), never
left to a hidden button. The screenshots of docs/console.md are taken here.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome
from tests import oidc_issuer
from tests.e2e.test_approvals_e2e import _reset_shop, _spans, _status, _told_waiting, _waiting

ORDER = "ord_a1000003"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"
AUDIENCE = "roundtrip-console"
APPROVER: dict[str, str] = {}  # the headers a proxy sends for Alice, an approver (`signed` fills them)
VIEWER: dict[str, str] = {}  # and for Vic, a viewer
FORGED = {"X-Forwarded-Email": "mallory@example.com", "X-Forwarded-Groups": "roundtrip-approvers"}


@pytest.fixture(scope="module")
async def held_calls(fleet):
    async with fleet.reconfigured(("gate",), approval_cancel_above_cents=5000, approval_timeout_s=60):
        yield


def _token(issuer: oidc_issuer.Running, email: str, groups: list[str], **claims) -> str:
    person = {"sub": email.split("@")[0], "email": email, "aud": AUDIENCE, "groups": groups}
    lifetime = {"exp": int(time.time()) + 3600}  # the module's tests outlast the issuer's default 300 s
    return issuer.mint(**(person | lifetime | claims))


@pytest.fixture(scope="module")
async def signed(fleet):
    """The issuer's process, and the console restarted in the signed mode trusting it."""
    with oidc_issuer.running() as issuer:
        APPROVER.update(
            {"Authorization": f"Bearer {_token(issuer, 'alice@example.com', ['support', 'roundtrip-approvers'])}"}
        )
        VIEWER.update({"Authorization": f"Bearer {_token(issuer, 'vic@example.com', ['roundtrip-viewers'])}"})
        async with fleet.reconfigured(("console",), console_oidc_issuer=issuer.url, console_oidc_audience=AUDIENCE):
            yield issuer


@pytest.fixture(scope="module")
def browser(signed):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    assert shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER), "apt-get install chromium chromium-driver (.ci/run)"
    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1100",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {**FORGED, **APPROVER}})  # the proxy's token
    yield driver
    driver.quit()


def _url(settings, path: str = "/approvals") -> str:
    return f"http://localhost:{settings.console_port}{path}"


def _wait(driver, predicate, timeout: float = 30.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: predicate(d))


def _card(driver, approval_id: str):
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f'[data-approval="{approval_id}"]')
    return found[0] if found else None


def _signed_in(settings, headers: dict[str, str]) -> tuple[httpx.Client, str]:
    """An HTTP client as the person `headers` names, with the CSRF token the console gave it (cookie and form)."""
    client = httpx.Client(base_url=f"http://127.0.0.1:{settings.console_port}", headers=headers, timeout=10)
    page = client.get("/approvals")
    assert page.status_code == 200, page.text
    token = re.search(r"roundtrip_csrf=([^;]+)", page.headers["set-cookie"]).group(1)
    assert "HttpOnly" in page.headers["set-cookie"] and "Secure" in page.headers["set-cookie"]
    assert "samesite=strict" in page.headers["set-cookie"].lower()
    return client, token


def _post(client: httpx.Client, path: str, cookie: str | None, form: dict[str, str]) -> httpx.Response:
    return client.post(path, data=form, headers={"Cookie": f"roundtrip_csrf={cookie}"} if cookie else {})


async def test_a_held_call_appears_without_reload_an_approver_approves_it_and_it_runs_once(
    held_calls, browser, client, fleet, fleet_settings, shop_orders
):
    from selenium.webdriver.common.by import By

    settings = fleet_settings[0]
    _reset_shop(settings)
    await asyncio.to_thread(browser.get, _url(settings))
    browser.execute_script("window.notReloaded = true")
    request_id = await client.ask("cancel my last order", customer="cus_1001", persona="careful")
    request = await _waiting(client, request_id)
    approval_id, turn_id = request["approval_id"], request["turn"]["turn_id"]

    card = await asyncio.to_thread(_wait, browser, lambda d: _card(d, approval_id))  # the page asked for it by itself
    assert browser.execute_script("return window.notReloaded === true")
    text = card.text
    assert "cancel_order for cus_1001" in text and ORDER in text and "87.00 EUR" in text and "left" in text, text
    assert "trace" in text and f"turn {turn_id}" in text
    # the customer's own words beside the call, and what the model said at that step
    words = card.find_element(By.CSS_SELECTOR, ".customer").text
    assert words == "cancel my last order", words
    assert "The model said (step 2)" in text
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "console-inbox.png"))

    card.find_element(By.NAME, "reason").send_keys("customer confirmed by phone")
    card.find_element(By.CSS_SELECTOR, "button.approve").click()
    await asyncio.to_thread(_wait, browser, lambda d: "approved cancel_order for cus_1001" in d.page_source)
    reply = await client.reply(request_id)
    assert reply.outcome is Outcome.END_TURN and f"cancelled order {ORDER}" in reply.text
    assert _status(shop_orders, ORDER) == "cancelled"
    resumed = [
        b for b in client.of_turn(topics.TOOL_BATCHES, request_id) if any(c.get("approved_by") for c in b["calls"])
    ]
    assert len(resumed) == 1 and resumed[0]["calls"][0]["approved_by"] == "alice@example.com"  # the signed-in person
    assert len(await _spans(settings, reply.trace_id, "execute_tool cancel_order")) == 1  # run exactly once
    (span,) = await _spans(settings, reply.trace_id, "console.decide")
    assert span["attributes"]["roundtrip.decided_by"] == "alice@example.com"
    assert span["attributes"]["roundtrip.decision"] == "approve" and span["attributes"]["enduser.role"] == "approver"
    log = (fleet.sync.logs / "console.log").read_text()
    assert 'approve by="alice@example.com" role=approver via=token from="127.0.0.1"' in log
    assert f'approval="{approval_id}"' in log and '"customer confirmed by phone"' in log

    # a second decision, the approval ended: refused with the reason, nothing sent
    http, token = _signed_in(settings, APPROVER)
    again = _post(http, f"/approvals/{approval_id}/decide", token, {"csrf": token, "decision": "deny"})
    assert again.status_code == 409 and f"approval {approval_id} is approved by alice@example.com" in again.text
    assert len([d for d in client.seen[topics.APPROVAL_DECISIONS] if d["approval_id"] == approval_id]) == 1

    # the turn's page as a timeline: each step's model call with its latency and tokens, each call's verdict, the
    # results formatted, the approval's who and why, the guard's ending (the spans arrive in batches: read again)
    def timeline(driver):
        driver.get(_url(settings, f"/turns/{turn_id}"))
        steps = driver.find_elements(By.CSS_SELECTOR, ".step")
        facts = [s.find_elements(By.CSS_SELECTOR, ".facts.model") for s in steps]
        verdicts = driver.find_elements(By.CSS_SELECTOR, ".verdict")
        return len(steps) == 3 and all(facts) and len(verdicts) >= 2 and steps

    steps = await asyncio.to_thread(_wait, browser, timeline)
    for step in steps:
        model = step.find_element(By.CSS_SELECTOR, ".facts.model").text
        assert re.search(r"model call \d+ ms .*tokens \d+ in, \d+ out, cache \d+ read / \d+ written", model), model
    held = steps[1].find_element(By.CSS_SELECTOR, "[data-call] .verdict")
    assert held.text == "approved" and "by alice@example.com" in steps[1].text  # the gate's last word: the approval
    assert "customer confirmed by phone" in steps[1].text
    results = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "pre.result")]
    assert any(r.startswith(("{", "[")) and '\n  "' in r for r in results), results  # JSON, pretty-printed
    page = browser.find_element(By.TAG_NAME, "main").text
    assert "end_turn" in page and "The model finished its answer." in page
    assert f"cancelled order {ORDER}" in page  # every step, to the answer
    browser.save_screenshot(str(SHOTS / "console-turn.png"))
    await asyncio.to_thread(browser.get, _url(settings, "/turns?customer=cus_1001&outcome=end_turn"))
    assert turn_id in browser.find_element(By.TAG_NAME, "table").text
    lane = browser.find_element(By.CSS_SELECTOR, f'tr[data-turn="{turn_id}"] td.lane').text
    assert lane == "interactive"  # a chat turn (issue 55); the lane filter leaves it out of the batch lane's list
    await asyncio.to_thread(browser.get, _url(settings, "/turns?customer=cus_1001&lane=batch"))
    assert turn_id not in browser.find_element(By.TAG_NAME, "main").text


def test_every_refused_sign_in_is_refused_and_audited_and_the_page_allows_no_inline_script(
    signed, fleet, fleet_settings
):
    settings = fleet_settings[0]
    now = int(time.time())
    base = {"iss": signed.url, "aud": AUDIENCE, "email": "mallory@example.com", "groups": ["roundtrip-approvers"]}
    mallory = "mallory@example.com"
    forged = oidc_issuer.sign({**base, "exp": now + 300}, oidc_issuer.another_key())
    tokens = {
        "bad-signature": forged,
        "expired": _token(signed, mallory, ["roundtrip-approvers"], exp=now - 600),
        "wrong-audience": _token(signed, mallory, [], aud="another-app"),
        "wrong-issuer": _token(signed, mallory, [], iss="https://evil.example"),
    }
    attempts = {"no-token": FORGED} | {k: {"Authorization": f"Bearer {t}"} for k, t in tokens.items()}
    for reason, headers in attempts.items():
        answer = httpx.get(f"http://127.0.0.1:{settings.console_port}/approvals", headers=headers, timeout=10)
        assert answer.status_code == 401 and "mallory" not in answer.text, (reason, answer.text)
    log = (fleet.sync.logs / "console.log").read_text()
    for reason in attempts:
        assert f"refused sign-in: reason={reason} from='127.0.0.1'" in log, reason
    assert "claimed='mallory@example.com'" in log and "Bearer" not in log

    page = httpx.get(f"http://127.0.0.1:{settings.console_port}/approvals", headers=APPROVER, timeout=10)
    policy = page.headers["content-security-policy"]
    assert page.status_code == 200 and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy


async def test_the_server_refuses_anonymous_viewer_and_forged_posts_and_a_deny_reaches_the_model(
    held_calls, browser, client, fleet_settings, shop_orders
):
    from selenium.webdriver.common.by import By

    settings = fleet_settings[0]
    _reset_shop(settings)
    request_id = await client.ask("cancel my last order", customer="cus_1001", persona="careful")
    request = await _waiting(client, request_id)
    approval_id = request["approval_id"]
    decide = f"/approvals/{approval_id}/decide"

    anonymous = httpx.Client(base_url=f"http://127.0.0.1:{settings.console_port}", timeout=10)
    assert anonymous.get("/approvals").status_code == 401
    assert anonymous.post(decide, data={"decision": "approve"}).status_code == 401

    viewer, viewer_token = _signed_in(settings, VIEWER)
    seen = viewer.get("/approvals/live").text
    assert approval_id in seen and "You may look, not decide (viewer)" in seen and "button" not in seen
    refused = _post(viewer, decide, viewer_token, {"csrf": viewer_token, "decision": "approve"})
    assert refused.status_code == 403 and "vic@example.com is a viewer" in refused.text

    approver, token = _signed_in(settings, APPROVER)
    for cookie, form_token in ((token, "forged.0000"), (None, token), (viewer_token, viewer_token), (token, "")):
        forged = _post(approver, decide, cookie, {"csrf": form_token, "decision": "approve"})
        assert forged.status_code == 403 and "CSRF token" in forged.text, (cookie, form_token, forged.text)
    assert (
        _post(approver, "/approvals/appr_nosuch/decide", token, {"csrf": token, "decision": "approve"}).status_code
        == 404
    )
    await client.settled()  # the topics read to their end: a decision the console sent would be in `seen`
    assert not [d for d in client.seen[topics.APPROVAL_DECISIONS] if d["approval_id"] == approval_id]  # nothing sent

    await asyncio.to_thread(browser.get, _url(settings))
    card = await asyncio.to_thread(_wait, browser, lambda d: _card(d, approval_id))
    card.find_element(By.NAME, "reason").send_keys("a fraud review is open on this order")
    card.find_element(By.CSS_SELECTOR, "button.deny").click()
    await asyncio.to_thread(_wait, browser, lambda d: "denied cancel_order for cus_1001" in d.page_source)
    reply = await client.reply(request_id)
    assert reply.outcome is Outcome.END_TURN and "a fraud review is open on this order" in reply.text
    assert _status(shop_orders, ORDER) == "pending"
    results = [
        b
        for c in client.of_turn(topics.MODEL_CALLS, request_id)
        for m in c["messages"][-1:]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("tool_use_id") == request["call"]["id"]
    ]
    assert results and results[-1]["is_error"] and "declined it" in results[-1]["content"]
    started = time.monotonic()
    await asyncio.to_thread(_wait, browser, lambda d: _card(d, approval_id) is None)  # gone from the inbox by itself
    assert time.monotonic() - started < 30


async def test_an_approver_cancels_a_waiting_turn_from_its_page(
    held_calls, browser, client, fleet_settings, shop_orders
):
    from selenium.webdriver.common.by import By

    settings = fleet_settings[0]
    _reset_shop(settings)
    request_id = await client.ask("cancel my last order", customer="cus_1001", persona="careful")
    request = await _waiting(client, request_id)
    turn_id = request["turn"]["turn_id"]
    # the executor's approval request reaches the guard after the test sees it: the page shows the turn awaiting
    # once the guard has recorded it, which its support.status says
    await _told_waiting(client, request_id)
    await asyncio.to_thread(browser.get, _url(settings, f"/turns/{turn_id}"))
    watching = browser.current_window_handle
    browser.execute_script("window.notReloaded = true")
    assert "awaiting" in browser.find_element(By.CSS_SELECTOR, "table.summary").text
    # the waiting turn's timeline: the held call with the gate's reason
    held = await asyncio.to_thread(_wait, browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".verdict.v-held"))
    assert "refunds more than 50.00 EUR" in held[0].find_element(By.XPATH, "..").text
    # cancelled from a second tab; the first, left open, shows how the turn ended by itself
    browser.switch_to.new_window("tab")
    browser.execute_cdp_cmd("Network.enable", {})  # the proxy's token, in this tab too
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": APPROVER})
    await asyncio.to_thread(browser.get, _url(settings, f"/turns/{turn_id}"))
    form = browser.find_element(By.CSS_SELECTOR, "form.cancel")
    form.find_element(By.NAME, "reason").send_keys("the customer called to stop it")
    form.find_element(By.TAG_NAME, "button").click()
    await asyncio.to_thread(_wait, browser, lambda d: "cancel sent" in d.page_source)
    reply = await client.reply(request_id)
    assert reply.outcome is Outcome.CANCELLED and _status(shop_orders, ORDER) == "pending"
    browser.close()
    browser.switch_to.window(watching)
    ending = "A person cancelled the turn."
    await asyncio.to_thread(_wait, browser, lambda d: ending in d.find_element(By.ID, "live").text)
    assert browser.execute_script("return window.notReloaded === true")
    # the turn has ended: its page offers no cancel, and its approval can no longer be decided
    await asyncio.to_thread(browser.get, _url(settings, f"/turns/{turn_id}"))
    assert "ended" in browser.find_element(By.CSS_SELECTOR, "table.summary").text
    assert not browser.find_elements(By.CSS_SELECTOR, "form.cancel")
    http, token = _signed_in(settings, APPROVER)
    late = _post(http, f"/approvals/{request['approval_id']}/decide", token, {"csrf": token, "decision": "approve"})
    assert late.status_code == 409 and "its turn is ended (cancelled)" in late.text, late.text


HOSTILE = b'<script>window.pwned=1</script><img src=x onerror="window.pwned=2"> is no support request'
HOSTILE_KEY = b'<img src=x onerror="window.pwned=3">'


def _letter(driver, contains: str):
    """The card of the waiting dead letter whose text contains `contains` (None until the page shows it)."""
    from selenium.webdriver.common.by import By

    found = [
        card
        for card in driver.find_elements(By.CSS_SELECTOR, '[data-letter][data-state="waiting"]')
        if contains in card.text
    ]
    return found[0] if found else None


async def test_a_dead_letter_is_re_driven_once_the_turn_answered_once_and_another_discarded(
    signed, browser, client, fleet, fleet_settings
):
    """The gate's batch key was rotated before the executors knew the new one: the turn's first batch is refused and
    dead-lettered (a transient reason). Once the executors have the key, an approver re-drives the dead letter from
    the console: the batch runs once, the turn is answered once, and a second re-drive (after a console restart, too)
    is refused. A malformed request carrying markup is shown as text and discarded."""
    from selenium.webdriver.common.by import By

    from tests.signing import key_settings

    settings = fleet_settings[0]
    async with fleet.reconfigured(("executor",), batch_verify_keys=key_settings("rot9")["batch_verify_keys"]):
        request_id = await client.ask("what are my orders?", customer="cus_1001", persona="careful")
        (refused,) = await client.wait_for(
            lambda: [
                d for d in client.seen[topics.DEAD_LETTERS] if d["service"] == "executor" and request_id in d["payload"]
            ],
            timeout=60,
        )
        await client.publish_raw(HOSTILE, key=HOSTILE_KEY)
        await client.wait_for(
            lambda: [d for d in client.seen[topics.DEAD_LETTERS] if d["key"] == HOSTILE_KEY.decode()], timeout=60
        )
    assert "unknown key id" in refused["reason"] and not client.replies.get(request_id)
    batch = json.loads(refused["payload"])
    conversation = refused["key"]

    await asyncio.to_thread(browser.get, _url(settings, "/dead-letters"))
    card = await asyncio.to_thread(_wait, browser, lambda d: _letter(d, conversation))
    letter_id = card.get_attribute("data-letter")
    text = card.text
    assert topics.TOOL_BATCHES in text and "executor" in text and "unknown key id" in text, text
    junk = await asyncio.to_thread(_wait, browser, lambda d: _letter(d, "is no support request"))
    junk_id = junk.get_attribute("data-letter")
    # the hostile record and key are text: no element, no script came of them
    assert "<script>window.pwned=1</script>" in junk.find_element(By.CSS_SELECTOR, "pre.record").text
    assert HOSTILE_KEY.decode() in junk.text
    assert not browser.find_elements(By.CSS_SELECTOR, "main img, main script")
    assert browser.execute_script("return window.pwned === undefined")
    reasons = browser.find_element(By.CSS_SELECTOR, "table.reasons").text
    assert "malformed JSON" in reasons, reasons
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "console-dead-letters.png"))

    viewer, viewer_token = _signed_in(settings, VIEWER)
    assert "You may look, not re-drive or discard (viewer)" in viewer.get("/dead-letters/live").text
    refused_viewer = _post(viewer, f"/dead-letters/{letter_id}/redrive", viewer_token, {"csrf": viewer_token})
    assert refused_viewer.status_code == 403 and "vic@example.com is a viewer" in refused_viewer.text
    approver, token = _signed_in(settings, APPROVER)
    forged = _post(approver, f"/dead-letters/{letter_id}/redrive", token, {"csrf": "forged.0000"})
    assert forged.status_code == 403 and "CSRF token" in forged.text

    card = _letter(browser, conversation)  # as the page shows it now (it swaps in a fresh list when one changed)
    card.find_element(By.NAME, "reason").send_keys("executors have the rotated key now")
    card.find_element(By.CSS_SELECTOR, "button.redrive").click()
    await asyncio.to_thread(_wait, browser, lambda d: f"dead letter {letter_id} re-driven to" in d.page_source)
    reply = await client.reply(request_id)
    assert reply.outcome is Outcome.END_TURN, reply

    await fleet.restart("console")  # what was handled is read back from Kafka
    approver, token = _signed_in(settings, APPROVER)
    again = _post(approver, f"/dead-letters/{letter_id}/redrive", token, {"csrf": token})
    assert again.status_code == 409, again.text
    assert f"dead letter {letter_id} was already re-driven by alice@example.com" in again.text

    await asyncio.to_thread(browser.get, _url(settings, "/dead-letters"))
    junk = await asyncio.to_thread(_wait, browser, lambda d: _letter(d, "is no support request"))
    junk.find_element(By.NAME, "reason").send_keys("junk from a test producer")
    junk.find_element(By.CSS_SELECTOR, "button.discard").click()
    discarded = f"dead letter {junk_id} discarded by alice@example.com"
    await asyncio.to_thread(_wait, browser, lambda d: discarded in d.page_source)
    late = _post(approver, f"/dead-letters/{junk_id}/redrive", token, {"csrf": token})
    assert late.status_code == 409 and "was already discarded by alice@example.com" in late.text, late.text

    await client.settled()
    assert len(client.replies[request_id]) == 1  # answered once
    copies = [b for b in client.of_turn(topics.TOOL_BATCHES, request_id) if b["step"] == batch["step"]]
    assert len(copies) == 2 and copies[0] == copies[1]  # the refused batch and its re-drive, the same record
    # the executor's model call after the batch, made once
    assert len([c for c in client.of_turn(topics.MODEL_CALLS, request_id) if c["step"] == batch["step"]]) == 1
    for call in batch["calls"]:
        ran = await _spans(settings, reply.trace_id, f"execute_tool {call['name']}")
        assert len(ran) == 1, call  # the batch ran once
    log = (fleet.sync.logs / "console.log").read_text()
    assert 'redrive dead letter by="alice@example.com" role=approver via=token' in log
    assert f'letter="{letter_id}"' in log and f'letter="{junk_id}"' in log
    assert 'discard dead letter by="alice@example.com"' in log and 'refused redrive dead letter by="alice' in log
