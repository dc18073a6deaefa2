"""The chat page llama.cpp users open at `http://127.0.0.1:8080/`, in a real headless browser (Debian's
Chromium, driven by Playwright): the demo stack's image embeds the page moe-stack built from the engine
tree's own tools/ui with npm; it loads, a message typed into it gets the model's answer, and a screenshot
is kept (MOE_STACK_SCREENSHOT=PATH copies it there)."""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from builder.files import cache_dir
from builder.running.run import down
from tests.cli import run_cli
from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration
# Debian's Chromium (scripts/prepare-host.sh), else the Google Chrome GitHub's runners carry.
CHROMIUM = shutil.which("chromium") or shutil.which("google-chrome")
# As root Chromium needs --no-sandbox; the rest keep it off a network this machine doesn't have.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INPUT = '[data-placeholder="Type a message..."], textarea[placeholder="Type a message..."]'
ANSWER = '[aria-label="Assistant message with actions"]'


def test_the_chat_page_answers_a_message_typed_into_it(base_image: str, tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        pytest.skip("no Chromium here: scripts/prepare-host.sh test installs it as root")
    port, project = free_port(), f"moe-stack-demo-test-{uuid.uuid4().hex[:8]}"  # never the user's demo
    compose_file = cache_dir() / "demo" / project / "compose.yaml"
    try:
        result = run_cli("demo", "--port", str(port), "--project", project)
        assert result.returncode == 0, result.stderr[-2000:]
        # The image embeds the page gzipped (LLAMA_UI_GZIP): the server sends it to clients that take gzip.
        request = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=30) as page:
            assert page.status == 200 and "text/html" in page.headers["Content-Type"]
        with playwright.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1100, "height": 800})
                page.goto(f"http://127.0.0.1:{port}/", wait_until="networkidle")
                box = page.locator(INPUT).first
                box.click()
                box.type("What is the capital of France?")
                box.press("Enter")
                # The answer streams into the last assistant message's text: its first words are the
                # proof (the demo model, a base model, may go on until the context is full).
                reply = page.locator(f"{ANSWER} .agentic-text").last
                reply.wait_for(timeout=120_000)
                text, deadline = "", time.monotonic() + 120
                while time.monotonic() < deadline and not re.search(r"\w{2,}\W+\w{2,}", text):
                    page.wait_for_timeout(500)
                    text = reply.inner_text()
                shown = page.inner_text("body")
                shot = tmp_path / "chat-page.png"
                page.screenshot(path=str(shot), full_page=True)
            finally:
                browser.close()
        assert "What is the capital of France?" in shown and re.search(r"\w{2,}", text), (text, shown[-1000:])
        assert shot.stat().st_size > 10_000
        if os.environ.get("MOE_STACK_SCREENSHOT"):
            shutil.copyfile(shot, os.environ["MOE_STACK_SCREENSHOT"])
    finally:
        if compose_file.is_file():
            down(compose_file)
        shutil.rmtree(compose_file.parent, ignore_errors=True)  # the test's own stack, not the user's
