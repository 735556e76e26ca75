"""Check a session's stored log: checksums, contiguous lsns, epochs that never go back.

Pure: it walks (first lsn, batch value) pairs handed to it and reports; it never reads
storage itself, so it checks a live store and a copied one alike.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import codec
from .errors import CorruptRecord
from .records import VerifyReport


def verify_batches(
    session: str,
    batches: Iterable[tuple[int, bytes]],
    *,
    compacted: list[tuple[int, int]] | None = None,
    checkpoint: bytes | None = None,
) -> VerifyReport:
    """Return every defect found in a session's batches, in lsn order."""
    ranges = codec.merge_ranges(compacted or [])
    report = VerifyReport(session=session, compacted=ranges)
    problems = report.problems
    expected = 0
    max_epoch: int | None = None
    epochs: set[int] = set()
    damaged = False  # the batch before had problems: the lsns it claims are its header's word
    for first, value in batches:
        if first > expected and not codec.covered(ranges, expected, first):
            problems.append(_gap(expected, first, ranges))
        elif first < expected and damaged:
            expected = first  # an intact batch's key over a damaged header's count
        elif first < expected:
            problems.append(f"lsn {first}..{expected - 1} stored twice (batch at lsn {first})")
        entries, batch_problems = codec.inspect_batch(value, session, first)
        problems.extend(batch_problems)
        damaged = bool(batch_problems)
        if not entries:
            # A batch whose header is unreadable: we cannot tell how many lsns it held.
            expected = max(expected, first + 1)
            continue
        for lsn, epoch, _kind in entries:
            report.records += 1
            if report.first_lsn is None:
                report.first_lsn = lsn
            report.last_lsn = lsn
            if epoch is None:
                continue
            epochs.add(epoch)
            if max_epoch is not None and epoch < max_epoch:
                problems.append(
                    f"lsn {lsn} written by epoch {epoch} after epoch {max_epoch} (deposed leader)"
                )
            else:
                max_epoch = epoch
        expected = max(expected, entries[-1][0] + 1)
    report.epochs = sorted(epochs)

    if checkpoint is not None:
        try:
            ckpt = codec.decode_checkpoint(checkpoint, session)
        except CorruptRecord as exc:
            problems.append(f"checkpoint: {exc.problem}")
        else:
            report.checkpoint_lsn = int(ckpt["lsn"])
            # Compaction may have removed the tail the checkpoint covers.
            expected = max([expected, *(hi for _, hi in ranges)])
            if report.checkpoint_lsn > expected:
                problems.append(
                    f"checkpoint at lsn {report.checkpoint_lsn} is ahead of the log, which "
                    f"ends at lsn {expected - 1}"
                )
    for lo, hi in ranges:
        if report.checkpoint_lsn is None or hi > report.checkpoint_lsn:
            problems.append(
                f"lsn {lo}..{hi - 1} compacted but not covered by a checkpoint "
                f"(checkpoint lsn {report.checkpoint_lsn})"
            )
    return report


def _gap(expected: int, first: int, ranges: list[tuple[int, int]]) -> str:
    # Name only the lsns no compaction accounts for.
    lo = expected
    for r_lo, r_hi in ranges:
        if r_lo <= lo < r_hi:
            lo = r_hi
    if lo == first - 1:
        return f"gap: lsn {lo} missing"
    return f"gap: lsn {lo}..{first - 1} missing"
