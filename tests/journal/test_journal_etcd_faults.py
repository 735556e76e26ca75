"""The etcd backend across etcd faults: restarts, pauses, and no etcd at all."""

from __future__ import annotations

import threading
import time

import pytest

from regent.journal import GroupCommitWriter, JournalUnavailable, open_journal
from tests.support.etcd import EtcdServer, free_port


def test_an_unreachable_etcd_is_named_with_how_to_start_one():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(JournalUnavailable) as info:
        open_journal(f"etcd://127.0.0.1:{port}")
    message = str(info.value)
    assert f"etcd at 127.0.0.1:{port} refused the connection" in message
    assert "is etcd running?" in message
    assert f"etcd --data-dir /tmp/etcd --listen-client-urls http://127.0.0.1:{port}" in message
    assert time.monotonic() - started < 10


def test_an_unopenable_sqlite_file_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(JournalUnavailable, match="cannot open the SQLite journal at"):
        open_journal(f"sqlite://{blocker}/sub/journal.db")


def _stream(writer: GroupCommitWriter, stop: threading.Event, errors: list) -> None:
    i = 0
    try:
        while not stop.is_set():
            writer.submit("call", {"i": i})
            i += 1
            if i % 50 == 0:
                time.sleep(0.002)
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["restart", "pause"])
def test_an_append_stream_survives_an_etcd_fault_without_losing_or_duplicating(
    fresh_etcd: EtcdServer, fault: str
):
    journal = open_journal(fresh_etcd.url)
    lead = journal.campaign("stream", "primary", ttl_s=5.0)
    writer = GroupCommitWriter(lead)
    stop, errors = threading.Event(), []
    producer = threading.Thread(target=_stream, args=(writer, stop, errors))
    producer.start()
    time.sleep(0.5)
    before = writer.durable_lsn
    if fault == "restart":
        fresh_etcd.restart(down_s=0.5)
    else:
        fresh_etcd.pause()
        time.sleep(1.5)
        fresh_etcd.resume()
    time.sleep(0.5)
    stop.set()
    producer.join()
    last = writer.flush(timeout=30)
    writer.close()

    assert errors == []
    assert before > 0 and last > before
    assert not lead.lost.is_set()
    records = list(journal.read("stream"))
    assert [r.lsn for r in records] == list(range(last + 1))
    assert [r.data["i"] for r in records] == list(range(last + 1))
    assert journal.verify("stream").ok
    lead.close()
    journal.close()


def test_a_leader_cut_off_from_etcd_for_longer_than_its_ttl_reports_the_loss(
    fresh_etcd: EtcdServer,
):
    journal = open_journal(fresh_etcd.url)
    lead = journal.campaign("cut-off", "primary", ttl_s=2.0)
    reasons: list[str] = []
    lead.on_lost(reasons.append)
    fresh_etcd.stop()
    assert lead.lost.wait(lead.ttl_s + 3)
    deadline = time.monotonic() + 2  # callbacks run just after `lost` is set
    while not reasons and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "could not renew the lease" in reasons[0]
    lead.close()
    journal.close()


def test_a_url_whose_first_endpoint_is_dead_reaches_the_live_one(etcd_server: EtcdServer):
    url = f"etcd://127.0.0.1:{free_port()},{etcd_server.address}"
    with open_journal(url) as journal:
        assert journal.url == url
        lead = journal.campaign("failover", "a")
        lead.append([("call", {})])
        assert [r.lsn for r in journal.read("failover")] == [0]
        journal.delete_session("failover")


def test_a_standby_keeps_waiting_through_an_etcd_restart(fresh_etcd: EtcdServer):
    primary_journal = open_journal(fresh_etcd.url)
    standby_journal = open_journal(fresh_etcd.url)
    primary = primary_journal.campaign("standby-restart", "primary", ttl_s=5.0)
    primary.append([("call", {"i": 0})])
    result: dict = {}

    def wait_as_standby() -> None:
        try:
            result["lead"] = standby_journal.campaign("standby-restart", "standby", timeout=30)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=wait_as_standby)
    thread.start()
    time.sleep(0.3)
    fresh_etcd.restart(down_s=0.5)
    time.sleep(0.5)
    assert "lead" not in result and "error" not in result
    primary.resign()
    thread.join(15)
    standby = result["lead"]
    assert standby.epoch > primary.epoch and standby.next_lsn == 1
    standby.close()
    primary_journal.close()
    standby_journal.close()
