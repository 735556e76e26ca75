"""`journal verify` names every damaged batch of a stored session, by an lsn inside it, and no
intact one: damage planted straight into a SQLite store (bytes flipped, a batch torn, two
batches' values swapped, a count header edited, a batch deleted), chosen batches first, then
random ones. Reading the session fails with CorruptRecord, never another error."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import msgpack
import pytest

from regent.journal import CorruptRecord, Journal, open_journal
from regent.journal import codec as jcodec
from tests.support.rawstore import RawStore

SESSION = "fuzz-verify"
# (records, pad): plain batches of 4 records, compressed ones of 60, in turn.
SHAPES = [(4, 0), (60, 40), (4, 0), (4, 0), (60, 40), (4, 0), (60, 40), (4, 0)]
_SUBJECT = re.compile(r"(?:gap: )?lsn (\d+)(?:\.\.(\d+))?")
_BATCH = re.compile(r"batch at lsn (\d+)")


@pytest.fixture()
def store(tmp_path) -> Iterator[tuple[Journal, RawStore, list[tuple[int, int]]]]:
    """A session of len(SHAPES) batches, and each batch's [first, end) lsns."""
    url = f"sqlite://{tmp_path / 'journal.db'}"
    journal = open_journal(url)
    lead = journal.campaign(SESSION, "fuzz")
    spans = []
    for n, pad in SHAPES:
        first = lead.next_lsn
        lead.append([("call", {"i": first + i, "pad": "p" * pad, "d": bytes(16)}) for i in range(n)])
        spans.append((first, first + n))
    raw = RawStore(url)
    assert [first for first, _ in spans] == raw.batch_starts(SESSION)
    assert [raw.get(SESSION, f)[:1] for f, _ in spans].count(jcodec.ZLIB_BATCH_FORMAT) == 3
    assert journal.verify(SESSION).ok
    yield journal, raw, spans
    raw.close()
    lead.close()
    journal.close()


def _named(problems: list[str]) -> set[int]:
    """The lsns the problems are about: the batch a problem names ("batch at lsn N"), else
    the lsn or the range it starts with ("lsn N: ...", "gap: lsn A..B missing")."""
    out = set()
    for p in problems:
        batch = _BATCH.search(p)
        if batch:
            out.add(int(batch.group(1)))
            continue
        subject = _SUBJECT.match(p)
        assert subject, f"a problem that names no lsn: {p}"
        lo, hi = subject.groups()
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _check(journal: Journal, spans: list[tuple[int, int]], damaged: set[int]) -> list[str]:
    """verify names each damaged batch (by index) and nothing in an intact one; read refuses."""
    problems = journal.verify(SESSION).problems
    named = _named(problems)
    for i, (lo, hi) in enumerate(spans):
        inside = {x for x in named if lo <= x < hi}
        if i in damaged:
            assert inside, f"damaged batch {i} (lsn {lo}..{hi - 1}) not named: {problems}"
        else:
            assert not inside, f"intact batch {i} (lsn {lo}..{hi - 1}) named: {problems}"
    assert named <= {x for i in damaged for x in range(*spans[i])}, problems
    if not damaged:
        assert list(journal.read(SESSION))
        return problems
    with pytest.raises(CorruptRecord):
        list(journal.read(SESSION))
    return problems


def _flip(rnd: random.Random, value: bytes, start: int = 0) -> bytes:
    buf = bytearray(value)
    buf[rnd.randrange(start, len(buf))] ^= 1 << rnd.randrange(8)
    return bytes(buf)


def _recount(value: bytes, count: int) -> bytes:
    """The batch with its count header replaced."""
    old = msgpack.Unpacker()
    old.feed(value[1:20])
    old.unpack()
    return value[:1] + msgpack.packb(count) + value[1 + old.tell():]


def test_verify_names_each_batch_damaged_in_its_own_way_and_no_other(store):
    journal, raw, spans = store
    first = [lo for lo, _ in spans]
    value = {i: raw.get(SESSION, f) for i, f in enumerate(first)}
    rnd = random.Random(7)
    raw.put(SESSION, first[0], _flip(rnd, value[0], start=4))  # a record's bytes
    raw.put(SESSION, first[1], _flip(rnd, value[1], start=len(value[1]) // 2))  # the zlib stream
    raw.put(SESSION, first[2], value[2][:-9])  # torn
    raw.put(SESSION, first[3], value[5])  # two batches of 4 records swapped
    raw.put(SESSION, first[5], value[3])
    raw.put(SESSION, first[4], _recount(value[4], 59))  # a count that drops a record
    raw.delete(SESSION, first[7])
    problems = _check(journal, spans[:7], {0, 1, 2, 3, 4, 5})
    assert any(p.startswith(f"lsn {first[1]}: compressed batch of 60 records") for p in problems), problems
    assert any(f"batch at lsn {first[2]} ends early" in p for p in problems), problems
    assert f"lsn {first[3]}: record says lsn {first[5]}" in problems
    assert any(p.startswith(f"lsn {first[4]}: batch holds more than the 59 records") for p in problems)


@pytest.mark.parametrize("seed", range(40))
def test_verify_names_randomly_damaged_batches_and_no_other(store, seed):
    journal, raw, spans = store
    rnd = random.Random(seed)
    first = [lo for lo, _ in spans]
    value = {i: raw.get(SESSION, f) for i, f in enumerate(first)}
    damaged = set(rnd.sample(range(len(spans) - 1), rnd.randint(1, 3)))  # the last: see deleted below
    for i in sorted(damaged):
        how = rnd.choice(["flip", "flips", "tear", "count", "swap", "delete"])
        same = [j for j in range(len(spans) - 1) if j != i and SHAPES[j] == SHAPES[i] and j not in damaged]
        if how == "swap" and not same:
            how = "flip"
        v = value[i]
        if how == "flip":
            v = _flip(rnd, v)
        elif how == "flips":
            for _ in range(rnd.randint(2, 20)):
                v = _flip(rnd, v)
        elif how == "tear":
            v = v[:rnd.randrange(len(v))]
        elif how == "count":
            n = spans[i][1] - spans[i][0]
            v = _recount(v, rnd.choice([n - 1, n + 1, 2 * n, 0, 10**9]))
        elif how == "swap":  # with another batch of the same size, damaged too
            j = rnd.choice(same)
            damaged.add(j)
            raw.put(SESSION, first[j], v)
            v = value[j]
        else:
            raw.delete(SESSION, first[i])
            continue
        raw.put(SESSION, first[i], v)
    for i in list(damaged):  # a flipped bit deflate ignores (padding) leaves the records as they were
        try:
            if jcodec.decode_batch(raw.get(SESSION, first[i]), SESSION, first[i]) == \
                    jcodec.decode_batch(value[i], SESSION, first[i]):
                damaged.discard(i)
        except (CorruptRecord, AssertionError):  # damaged, or deleted
            pass
    _check(journal, spans, damaged)
