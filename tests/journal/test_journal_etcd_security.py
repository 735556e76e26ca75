"""The etcd journal over TLS (client certificates) and with etcd user auth, against real etcds.

Certificates are made per run (tests/support/certs.py); the password only ever travels in
$REGENT_ETCD_PASSWORD and must show up in no url, error or log line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from regent.journal import JournalAccessDenied, JournalUnavailable, open_journal
from regent.journal.etcd_target import parse_etcd_url
from tests.support.etcd import MISSING_REASON, EtcdServer, etcd_available

pytest.importorskip("cryptography", reason="pip install cryptography (the `test` extra)")
from tests.support.certs import Pki, make_pki  # noqa: E402

needs_etcd = pytest.mark.skipif(not etcd_available(), reason=MISSING_REASON)

PASSWORD = "pw-" + uuid.uuid4().hex  # unique: any appearance in output is a leak
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("other-pki"), ca_name="some other CA")


@pytest.fixture(scope="module")
def tls_etcd(pki: Pki) -> Iterator[EtcdServer]:
    """An etcd that serves only TLS and requires a client certificate signed by its CA."""
    if not etcd_available():
        pytest.skip(MISSING_REASON)
    with EtcdServer(tls=pki, client_cert_auth=True) as server:
        yield server


@pytest.fixture(scope="module")
def auth_etcd() -> Iterator[EtcdServer]:
    """A plain-http etcd with auth on: user `regent` may use /regent/ only; idle tokens
    expire after 1 s, so that tests see etcd refuse a token the client still holds."""
    if not etcd_available():
        pytest.skip(MISSING_REASON)
    with EtcdServer(auth_token_ttl_s=1) as server:
        server.enable_auth("regent", PASSWORD)
        yield server


@pytest.fixture
def session() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def no_etcd_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("REGENT_ETCD_CA", "REGENT_ETCD_CERT", "REGENT_ETCD_KEY", "REGENT_ETCD_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _append_read_campaign(url: str, session: str) -> str:
    """Campaign, append, read back, and see a second holder wait; returns the journal's url."""
    with open_journal(url) as journal:
        with journal.campaign(session, "primary", ttl_s=2.0) as lead:
            lead.append([("note", {"i": 1}), ("note", {"i": 2})])
            with pytest.raises(TimeoutError, match="'primary' holds it"):
                journal.campaign(session, "standby", ttl_s=2.0, timeout=0.3)
        assert [r.data["i"] for r in journal.read(session)] == [1, 2]
        assert journal.verify(session).ok
        with journal.campaign(session, "standby", ttl_s=2.0, timeout=10) as lead:
            assert lead.next_lsn == 2
        return journal.url


# url parsing (no etcd needed)


def test_a_password_in_the_url_is_refused_and_not_repeated(no_etcd_env):
    for url in (
        f"etcd://regent:{PASSWORD}@127.0.0.1:2379",
        f"etcd://regent:a/b?c{PASSWORD}@127.0.0.1:2379",  # unencoded '/', '?' in the password
        f"etcds://127.0.0.1:2379?user=regent&password={PASSWORD}",
    ):
        with pytest.raises(ValueError, match="REGENT_ETCD_PASSWORD") as info:
            open_journal(url)
        assert PASSWORD not in str(info.value)
        assert "***" in str(info.value)


def test_a_user_without_the_password_variable_says_to_set_it(no_etcd_env):
    with pytest.raises(ValueError, match=r"REGENT_ETCD_PASSWORD is not set"):
        open_journal("etcd://127.0.0.1:2379?user=regent")


def test_a_client_certificate_without_its_key_is_refused(no_etcd_env, pki):
    with pytest.raises(ValueError, match="needs both cert= and key="):
        open_journal(f"etcds://127.0.0.1:2379?ca={pki.ca}&cert={pki.client_cert}")


def test_tls_files_on_a_plain_etcd_url_point_to_etcds(no_etcd_env, pki):
    with pytest.raises(ValueError, match=r"write etcds://127\.0\.0\.1:2379\?ca="):
        open_journal(f"etcd://127.0.0.1:2379?ca={pki.ca}")


def test_the_journal_url_names_files_and_user_but_never_the_password(no_etcd_env, pki):
    no_etcd_env.setenv("REGENT_ETCD_PASSWORD", PASSWORD)
    no_etcd_env.setenv("REGENT_ETCD_CA", str(pki.ca))
    target = parse_etcd_url("etcd://127.0.0.1:2379,127.0.0.1:2380?user=regent")
    assert target.password == PASSWORD
    assert target.url == f"etcds://127.0.0.1:2379,127.0.0.1:2380?ca={pki.ca}&user=regent"
    assert PASSWORD not in repr(target)
    # The url a journal reports opens the same store again, given the same password.
    assert parse_etcd_url(target.url) == target


# TLS with client certificates


@needs_etcd
def test_journal_over_client_certificate_tls_appends_reads_and_campaigns(
    no_etcd_env, tls_etcd, session
):
    url = tls_etcd.tls_url(client_cert=True)
    assert url.startswith("etcds://")
    assert _append_read_campaign(url, session) == url


@needs_etcd
def test_a_session_campaigns_and_journals_over_client_certificate_tls(no_etcd_env, tls_etcd):
    from regent.controller import Session

    name = f"tls-{uuid.uuid4().hex[:8]}"
    # Nothing here tests leases: a TTL that a loaded machine's scheduling cannot outlast.
    with Session(name, journal=tls_etcd.url, lease_ttl_s=10.0) as s:
        assert s.journal_url == tls_etcd.url
        s.now()
        s.random()
    with open_journal(tls_etcd.url) as journal:
        info = journal.session_info(name)
        assert info.ended and info.records >= 2
        assert journal.verify(name).ok


@needs_etcd
def test_tls_without_a_client_certificate_is_refused_with_what_to_give(no_etcd_env, tls_etcd):
    url = tls_etcd.tls_url(client_cert=False)
    with pytest.raises(JournalAccessDenied) as info:
        open_journal(url)
    text = str(info.value)
    assert url in text
    assert "requires a client certificate" in text
    assert "REGENT_ETCD_CERT" in text


@needs_etcd
def test_a_ca_that_did_not_sign_the_server_certificate_is_named(
    no_etcd_env, tls_etcd, other_pki
):
    url = tls_etcd.tls_url(ca=other_pki.ca)
    with pytest.raises(JournalAccessDenied) as info:
        open_journal(url)
    text = str(info.value)
    assert url in text
    assert f"the CA in {other_pki.ca} does not accept" in text
    assert "set ?ca= to the CA that signed" in text


@needs_etcd
def test_a_client_certificate_from_another_ca_is_refused(no_etcd_env, tls_etcd, pki, other_pki):
    url = (
        f"etcds://{tls_etcd.address}?ca={pki.ca}&cert={other_pki.client_cert}"
        f"&key={other_pki.client_key}"
    )
    with pytest.raises(JournalAccessDenied, match="refused the client certificate") as info:
        open_journal(url)
    assert "--trusted-ca-file" in str(info.value)


@needs_etcd
def test_a_missing_certificate_file_is_named_with_where_it_came_from(
    no_etcd_env, tls_etcd, pki, tmp_path
):
    missing = tmp_path / "nope.pem"
    no_etcd_env.setenv("REGENT_ETCD_CA", str(pki.ca))
    no_etcd_env.setenv("REGENT_ETCD_CERT", str(missing))
    no_etcd_env.setenv("REGENT_ETCD_KEY", str(pki.client_key))
    with pytest.raises(JournalAccessDenied) as info:
        open_journal(tls_etcd.url.split("?")[0].replace("etcds://", "etcd://"))
    text = str(info.value)
    assert f"cannot read the client certificate {missing}" in text
    assert "$REGENT_ETCD_CERT" in text
    assert tls_etcd.address in text


@needs_etcd
def test_the_environment_variables_turn_a_plain_etcd_url_into_tls(
    no_etcd_env, tls_etcd, pki, session
):
    no_etcd_env.setenv("REGENT_ETCD_CA", str(pki.ca))
    no_etcd_env.setenv("REGENT_ETCD_CERT", str(pki.client_cert))
    no_etcd_env.setenv("REGENT_ETCD_KEY", str(pki.client_key))
    url = _append_read_campaign(f"etcd://{tls_etcd.address}", session)
    assert url == tls_etcd.tls_url(client_cert=True)


@needs_etcd
def test_a_plain_url_against_a_tls_etcd_suggests_etcds(no_etcd_env, tls_etcd):
    with pytest.raises(JournalUnavailable, match=rf"etcds://{tls_etcd.address}\?ca=PATH"):
        open_journal(f"etcd://{tls_etcd.address}")


# etcd user auth


@needs_etcd
def test_journal_with_etcd_auth_appends_reads_and_campaigns(no_etcd_env, auth_etcd, session):
    no_etcd_env.setenv("REGENT_ETCD_PASSWORD", PASSWORD)
    url = f"{auth_etcd.url}?user=regent"
    assert _append_read_campaign(url, session) == url


@needs_etcd
def test_a_wrong_password_is_refused_naming_the_user_and_the_variable(no_etcd_env, auth_etcd):
    no_etcd_env.setenv("REGENT_ETCD_PASSWORD", "not-" + PASSWORD)
    url = f"{auth_etcd.url}?user=regent"
    with pytest.raises(JournalAccessDenied) as info:
        open_journal(url)
    text = str(info.value)
    assert url in text and "refused user 'regent'" in text and "$REGENT_ETCD_PASSWORD" in text
    assert PASSWORD not in text


@needs_etcd
def test_no_user_against_an_etcd_with_auth_says_to_add_one(no_etcd_env, auth_etcd, session):
    with open_journal(auth_etcd.url) as journal:  # status needs no user
        with pytest.raises(JournalAccessDenied, match=r"add \?user=NAME"):
            journal.campaign(session, "primary", timeout=5)


@needs_etcd
def test_a_user_without_rights_on_the_journal_prefix_is_told_what_to_grant(no_etcd_env, session):
    with EtcdServer() as server:
        server.enable_auth("regent", PASSWORD, prefix=b"/elsewhere/")
        no_etcd_env.setenv("REGENT_ETCD_PASSWORD", PASSWORD)
        with open_journal(f"{server.url}?user=regent") as journal:
            with pytest.raises(JournalAccessDenied, match="grant-permission") as info:
                journal.campaign(session, "primary", timeout=5)
            assert "denied user 'regent'" in str(info.value)


@needs_etcd
def test_a_leader_keeps_writing_after_etcd_restarts_and_forgets_its_auth_token(
    no_etcd_env, session
):
    with EtcdServer() as server:
        server.enable_auth("regent", PASSWORD)
        no_etcd_env.setenv("REGENT_ETCD_PASSWORD", PASSWORD)
        with open_journal(f"{server.url}?user=regent") as journal:
            with journal.campaign(session, "primary", ttl_s=5.0) as lead:
                lead.append([("note", {"i": 1})])
                server.restart()  # etcd keeps leases across restarts, not auth tokens
                lead.append([("note", {"i": 2})])
                assert not lead.lost.is_set()
            assert [r.data["i"] for r in journal.read(session)] == [1, 2]


_AUTH_PROGRAM = textwrap.dedent(
    """
    import sys, time
    from regent.worker.logsetup import configure_logging
    configure_logging()
    from regent.journal import open_journal
    url, session = sys.argv[1], sys.argv[2]
    with open_journal(url) as journal:
        print("journal url:", journal.url, flush=True)
        with journal.campaign(session, "primary", ttl_s=2.0) as lead:
            lead.append([("note", {"i": 1})])
            time.sleep(2.5)  # longer than etcd's token ttl: the next request needs a new token
            lead.append([("note", {"i": 2})])
        print("read:", [r.data["i"] for r in journal.read(session)], flush=True)
    """
)


@pytest.mark.slow
@needs_etcd
def test_an_expired_token_is_renewed_and_the_password_is_never_logged(auth_etcd, session):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("REGENT_ETCD_")
    }  # fmt: skip
    env.update(
        REGENT_ETCD_PASSWORD=PASSWORD,
        REGENT_LOG_LEVEL="DEBUG",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    url = f"{auth_etcd.url}?user=regent"
    done = subprocess.run(
        [sys.executable, "-c", _AUTH_PROGRAM, url, session],
        env=env, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "read: [1, 2]" in output
    assert f"journal url: {url}" in output
    assert "etcd refused the auth token; authenticating again" in output
    assert "leading session" in output  # the logs were captured, at debug level
    assert PASSWORD not in output
