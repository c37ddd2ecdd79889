"""Browser tests: Playwright (Python) driving Debian's Chromium against pytest-django's live server.

Chromium comes from ``platform/ensure-browser.sh`` (``make test`` runs it); Playwright's own browser
download cannot run here, so the session launches ``/usr/bin/chromium``. Every page visited through
:func:`tour_page` is screenshot at desktop and phone width under ``$STROP_TEST_ARTIFACTS/screenshots``
(default ``var/test-artifacts/screenshots``) and checked with axe-core for serious or critical
accessibility violations. Waiting is Playwright's own (auto-waiting locators, ``expect`` with a
generous timeout): never a fixed sleep.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Playwright's sync API runs its event loop in this thread; Django's ORM, used by the tests to make
# their data, would otherwise refuse to run beside it.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

from tests.dashboard.conftest import PASSWORD, World, build_world, feed_experiment, log_events  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = os.environ.get("STROP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("STROP_TEST_ARTIFACTS", REPO_ROOT / "var" / "test-artifacts"))
SCREENSHOTS = ARTIFACTS / "screenshots"
AXE = Path(os.environ.get("STROP_VENDOR_STATIC_DIR", REPO_ROOT / "var" / "vendor" / "static")) / "axe.min.js"
VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
# Generous: the machine is a shared 2-core box and the live server runs in the test's process.
TIMEOUT_MS = 30_000
_shots: list[Path] = []


# Package scope: Playwright's sync API keeps an event loop running in this thread while it lives,
# and later tests that call asyncio.run() (the SDK's async client) must not meet it.
@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: run `bash platform/ensure-browser.sh` (make test does)", pytrace=False)
    if not AXE.is_file():
        pytest.fail(f"{AXE} is missing: run `make assets` (make test does)", pytrace=False)
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, live_server: Any) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORTS["desktop"], base_url=live_server.url)
    context.set_default_timeout(TIMEOUT_MS)
    context.set_default_navigation_timeout(TIMEOUT_MS)
    page = context.new_page()
    # The dashboard's content security policy must not block any of its own scripts or styles.
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    yield page
    context.close()
    assert not refused, "\n".join(refused)


@pytest.fixture
def live_world(transactional_db: Any, make_tenant, make_user, tiny_starter_model, lora_source) -> World:
    """The dashboard test world, committed so the live server sees it, with a day of traffic."""
    world = build_world(make_tenant, make_user, tiny_starter_model, lora_source)
    mixes = [["accepted", "rejected", "not_shown"], ["accepted", "accepted", "edited", "rejected"], ["rejected", None]]
    for hour in range(1, 22):
        log_events(
            world.a,
            outcomes=mixes[hour % 3],
            minutes_ago=hour * 60 - 5,
            user=f"dev-{hour % 4}",
            version=world.v1,
            refresh=False,  # feed_experiment's refresh below covers these hours too
        )
    # Long text must wrap or be cut with an ellipsis, never widen a page.
    long_line = "    result_{0} = compute_something_rather_long(argument_{0}, option={0})"
    log_events(
        world.a,
        outcomes=["edited"],
        minutes_ago=2,
        completion="\n".join(long_line.format(i) for i in range(40)),
        user="an-end-user-id-from-the-tenants-own-directory-service-0123456789abcdef-0123456789abcdef",
        refresh=False,
    )
    # The running experiment, with a few snapshots to draw; its traffic is older than the overview's
    # day, so the overview's numbers stay the ones its test states.
    feed_experiment(world, users=96, batches=4, minutes_ago=26 * 60)
    _holdout_and_alarm(world)
    return world


def _holdout_and_alarm(world: World) -> None:
    """A holdout with its lift, and an alarm on a promoted version: the experiments pages' banner."""
    from apps.adapters.models import Adapter
    from apps.experiments.models import PromotionAlarm
    from apps.experiments.services import holdout_snapshot_take

    Adapter.objects.filter(pk=world.adapter.pk).update(holdout_share=0.1)
    world.adapter.refresh_from_db()
    holdout_snapshot_take(world.adapter)
    PromotionAlarm.objects.create(
        tenant=world.a,
        adapter=world.adapter,
        version=world.v2,
        metric="suggestion_rate",
        reference="previous",
        observed=0.06,
        reference_value=0.55,
        relative_change=-0.89,
        reason="v2 of tab shows suggestions shown per request 0.06 since its promotion against 0.55 for v1: -89%, "
        "beyond the 30% bound, and significant.",
    )


def sign_in(page: Page, user: Any) -> None:
    page.goto("/dashboard/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def check_accessibility(page: Page) -> None:
    """axe-core on the page as it is: no serious or critical violation."""
    page.add_script_tag(url="/static/vendor/axe.min.js")  # same origin: the CSP allows it, inline it would not
    results = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    bad = [v for v in results["violations"] if v.get("impact") in ("serious", "critical")]
    report = "\n".join(
        f"{v['impact']}: {v['id']} ({v['help']}): " + "; ".join(n["target"][0] for n in v["nodes"][:5]) for v in bad
    )
    assert not bad, f"{page.url}:\n{report}"


# Boxes whose content must fit inside them: what sticks out of one is broken layout, not a scroll
# area (a box that scrolls or clips, like a table's wrapper or a code block, is left alone).
BOXES = ".card, .stat, .empty-state, .chart-card, .filters, .message, .field, .step, .snippet"
OVERFLOWING_BOXES = """(selector) => [...document.querySelectorAll(selector)]
  .filter((el) => el.getClientRects().length && getComputedStyle(el).overflowX === "visible")
  .filter((el) => el.scrollWidth > el.clientWidth + 1)
  .map((el) => `${el.tagName.toLowerCase()}.${[...el.classList].join(".")} ` +
    `"${el.innerText.trim().slice(0, 40).replace(/\\s+/g, " ")}": ${el.scrollWidth - el.clientWidth}px`)"""


def check_layout(page: Page, label: str) -> None:
    """Nothing wider than the screen, and nothing sticking out of its card, stat, field or message."""
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{page.url} is {overflow}px wider than a {label} screen"
    sticking_out = page.evaluate(OVERFLOWING_BOXES, BOXES)
    assert not sticking_out, f"{page.url} at {label} width, wider than their box:\n" + "\n".join(sticking_out)


def tour_page(page: Page, name: str) -> None:
    """Screenshot the current page at desktop and phone width, checking its layout (nothing overflows
    the screen or its box) and accessibility at each."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for label, size in VIEWPORTS.items():
        page.set_viewport_size(size)
        expect(page.locator("body")).to_be_visible()
        check_layout(page, label)
        check_accessibility(page)
        path = SCREENSHOTS / f"{name}-{label}.png"
        page.screenshot(path=str(path), full_page=True)
        _shots.append(path)
    page.set_viewport_size(VIEWPORTS["desktop"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _shots:
        terminalreporter.write_line(f"dashboard screenshots ({len(_shots)}): {SCREENSHOTS}")
