"""`regent dashboard` in a real browser (Debian's Chromium driven by Playwright): the page of a
running session shows its leader, the leader changes on the page after the primary's SIGKILL,
the timeline shows the failover, and the session is seen to end. Bad input says what is wrong:
an unknown session, a journal that does not answer, a request without the token."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.failover.harness import Cluster, check_exactly_once

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: scripts/install_chromium.sh installs it")

STEPS = 8


@contextmanager
def dashboard(journal: str, *extra: str) -> Iterator[str]:
    """A `regent dashboard` on a free loopback port: its URL (with its token, if any)."""
    proc = subprocess.Popen([sys.executable, "-m", "regent.cli", "dashboard", "--journal", journal,
                             "--bind", "127.0.0.1:0", "--refresh", "0.3", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("regent dashboard: http://"), line + proc.stdout.read(2000)
        yield line.split(": ", 1)[1].strip()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def browser() -> Iterator:
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = b.new_page()
            page.set_default_timeout(60_000)
            yield page
        finally:
            b.close()


def test_the_page_shows_the_leader_change_after_the_primarys_sigkill(tmp_path) -> None:
    expect = playwright.expect
    hold = tmp_path / "hold"
    hold.touch()
    c = Cluster(f"dash-{uuid.uuid4().hex[:6]}", f"sqlite://{tmp_path / 'journal.db'}", tmp_path, steps=STEPS,
                extra_env={"REGENT_TEST_HOLD_FILE": str(hold)})
    try:
        primary, standby = c.primary_and_standby()
        with dashboard(c.journal) as url, browser() as page:
            page.goto(url)
            page.click(f"tr[data-session='{c.session}']")  # from the list of the journal's sessions
            expect(page.locator("#state")).to_have_text("running")
            expect(page.locator("#leader")).to_contain_text(f":{primary}:")
            expect(page.locator("#standbys")).to_contain_text(f":{standby.pid}:")
            expect(page.locator("#meshes")).to_contain_text("w")
            os.kill(primary, signal.SIGKILL)
            c.by_pid(primary).wait()
            expect(page.locator("#leader")).to_contain_text(f":{standby.pid}:")
            expect(page.locator("#standbys")).to_have_text("none")
            expect(page.locator("#failovers")).to_contain_text("1, the last")
            expect(page.locator("#timeline li.failover")).to_have_count(1)
            assert page.locator("#error").is_hidden()
            hold.unlink()
            check_exactly_once(c.finish(standby), STEPS)
            expect(page.locator("#state")).to_have_text("ended")
            expect(page.locator("#timeline")).to_contain_text("run ended")
            href = page.locator("#trace").get_attribute("href")  # the Perfetto export, one click away
            trace = json.loads(urllib.request.urlopen(url.rstrip("/") + href, timeout=30).read())
            assert trace["traceEvents"]
            # An unknown session: said on the page, the rest still works.
            page.goto(url + "?session=nobody")
            expect(page.locator("#error")).to_contain_text("no session 'nobody'")
            expect(page.locator(f"tr[data-session='{c.session}']")).to_have_count(1)
    finally:
        c.stop_all()


def test_a_journal_that_does_not_answer_is_said_on_the_page(tmp_path) -> None:
    with dashboard("etcd://127.0.0.1:9") as url, browser() as page:  # nothing listens on port 9
        page.goto(url)
        playwright.expect(page.locator("#error")).to_contain_text("did not answer")


def test_a_dashboard_with_a_token_refuses_requests_without_it(tmp_path) -> None:
    journal = f"sqlite://{tmp_path / 'journal.db'}"
    with dashboard(journal, "--token", "s3cret") as url:
        assert url.endswith("?token=s3cret")
        base = url.split("?")[0]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "api/sessions", timeout=30)
        assert refused.value.code == 401
        ok = urllib.request.urlopen(urllib.request.Request(base + "api/sessions",
                                                           headers={"Authorization": "Bearer s3cret"}), timeout=30)
        assert json.loads(ok.read())["sessions"] == []
