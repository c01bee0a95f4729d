"""The operator page in a real browser (Debian's chromium, headless, through playwright) over the
real endpoint and store (tests/test_approvals_api.py): on a phone and a desktop with seven held
events, its refresh that keeps a half-written note, answering ticked events at once, and pausing.

Screenshots of each width go to a ``screenshots`` folder under the test's tmp_path (printed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_approvals_api import TOKEN, Held, held_endpoint
from test_approvals_page import chromium

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}
# Generous: a hang guard on a busy machine, not a speed measure.
WAIT_MS = 30_000

# Every button's box inside its card's, and the widths: what the page's layout must keep.
LAYOUT_CHECK = """() => {
  const outside = [];
  for (const card of document.querySelectorAll('.card')) {
    const c = card.getBoundingClientRect();
    for (const b of card.querySelectorAll('button')) {
      const r = b.getBoundingClientRect();
      if (r.width === 0) continue;  // not shown (a closed details)
      if (r.left < c.left - 0.5 || r.right > c.right + 0.5 || r.top < c.top - 0.5 || r.bottom > c.bottom + 0.5)
        outside.push(card.getAttribute('aria-label') + ': ' + b.textContent.trim());
    }
  }
  return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth, outside: outside};
}"""


@asynccontextmanager
async def logged_in(held: Held, viewport: dict[str, int]) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    executable = chromium()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            page = await browser.new_page(viewport=viewport)
            page.set_default_timeout(WAIT_MS)
            dialogs: list[str] = []
            page.on("dialog", lambda dialog: dialogs.append(dialog.message))
            await page.goto(f"{held.url}/")
            await page.fill("input[name=token]", TOKEN)
            await page.click("button:has-text('Log in')")
            await page.wait_for_selector("h2#held")
            yield page
            assert dialogs == []
        finally:
            await browser.close()


async def test_seven_held_events_fit_a_phone_and_a_desktop(tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with held_endpoint(tmp_path, count=7) as held:
        for name, viewport in (("phone", PHONE), ("desktop", DESKTOP)):
            async with logged_in(held, viewport) as page:
                assert await page.title() == "agentwake: approvals (7)"
                assert await page.locator("section.held").count() == 7
                await page.screenshot(path=str(shots / f"approvals-{name}.png"), full_page=True)
                layout = await page.evaluate(LAYOUT_CHECK)
                assert layout["scroll"] <= layout["inner"], (name, layout)
                assert layout["outside"] == [], (name, layout)
                height = await page.evaluate("document.documentElement.scrollHeight")
                # The data of many held events is folded; open one, the layout still holds.
                await page.locator("section[aria-label='held T-3'] summary").click()
                assert "<@U0BOSS>" in await page.locator("section[aria-label='held T-3'] pre").inner_text()
                layout = await page.evaluate(LAYOUT_CHECK)
                assert layout["scroll"] <= layout["inner"] and layout["outside"] == [], (name, layout)
                await page.click(f"a[href='/events/{held.rows[0]}']")
                await page.wait_for_selector("section[aria-label='decision']")
                await page.screenshot(path=str(shots / f"event-{name}.png"), full_page=True)
                layout = await page.evaluate(LAYOUT_CHECK)
                assert layout["scroll"] <= layout["inner"], (name, layout)
                assert "<@U0BOSS>" in await page.locator("pre[aria-label=data]").inner_text()
                if name == "desktop":  # cards side by side: far shorter than one column
                    assert height < 2500, height
    print(f"screenshots: {shots}")  # noqa: T201 - where a person finds them


async def test_the_refresh_keeps_a_half_written_note(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path, count=3) as held:
        held.endpoint.live_ms = 300
        async with logged_in(held, PHONE) as page, aiohttp.ClientSession() as http:

            async def refreshes(more: int) -> None:
                seen = int(await page.get_attribute("#refreshed", "data-count") or 0)
                # A selector, not a JS predicate: the page's CSP allows no eval. Any count from
                # seen + more on: on a busy machine one may pass before the selector is looked at.
                at_least = ", ".join(
                    f"#refreshed[data-count='{n}']" for n in range(seen + more, seen + more + 20)
                )
                await page.wait_for_selector(at_least, state="attached")

            await refreshes(1)
            note = page.locator("form[aria-label='approve T-2'] textarea[name=note]")
            await note.fill("checked with the customer, half wr")
            # Meanwhile a tool answers another event; refreshes go on, but leave the held list alone.
            async with http.post(
                f"{held.url}/approvals/{held.rows[0]}/deny",
                headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"},
            ) as response:
                assert response.status == 200
            await refreshes(2)
            assert await note.input_value() == "checked with the customer, half wr"
            assert await page.locator("section[aria-label='held T-1']").count() == 1
            answers = await page.locator("table[aria-label=answers]").inner_text()
            assert "T-1" in answers  # the other lists were refreshed
            # The note emptied and left: the next refresh takes the answered event away.
            await note.fill("")
            await page.locator("h1").click()
            await page.wait_for_selector("section[aria-label='held T-1']", state="detached")
            assert await page.title() == "agentwake: approvals (2)"


async def test_ticked_events_are_denied_at_once_and_the_service_is_paused_and_resumed(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path, count=3) as held, logged_in(held, PHONE) as page:
        await page.check("input[aria-label='tick T-1']")
        await page.check("input[aria-label='tick T-3']")
        await page.fill("form#bulk textarea[name=note]", "spam")
        await page.click("button:has-text('Deny ticked')")
        await page.wait_for_selector("text=denied 2 of 2")
        assert await page.title() == "agentwake: approvals (1)"
        for row in (held.rows[0], held.rows[2]):
            [answer] = (await held.detail(row))["answers"]
            assert (answer["answer"], answer["who"], answer["note"]) == ("denied", "operator", "spam")

        await page.click("summary:has-text('Pause')")
        form = page.locator("form[aria-label=pause]")
        await form.locator("select[name=scope]").select_option("subscription")
        await form.locator("input[name=name]").fill("tickets")
        await form.locator("input[name=reason]").fill("a noisy sender")
        await form.locator("input[name=now]").check()
        await form.locator("button").click()
        await page.wait_for_selector("text=paused subscription tickets")
        paused = await page.locator("table[aria-label=paused]").inner_text()
        assert "subscription tickets" in paused and "operator" in paused and "a noisy sender" in paused
        [pause] = await held.store.pauses()
        assert (pause.scope, pause.name, pause.by, pause.cut_short) == (
            "subscription",
            "tickets",
            "operator",
            True,
        )
        layout = await page.evaluate(LAYOUT_CHECK)
        assert layout["scroll"] <= layout["inner"], layout
        await page.click("form[aria-label='resume subscription tickets'] button")
        await page.wait_for_selector("text=resumed subscription tickets")
        assert await held.store.pauses() == []
