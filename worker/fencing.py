"""Worker-side epoch fencing (DESIGN invariant 5).

A worker remembers the highest controller epoch it has seen and refuses anything
older, so a paused or partitioned deposed primary cannot drive it.
"""

from __future__ import annotations


class EpochFence:
    def __init__(self) -> None:
        self.epoch = 0
        self.rejected = 0

    def admit(self, epoch: int) -> bool:
        """True if a message of this epoch may proceed; raises the fence on a newer one."""
        if epoch < self.epoch:
            self.rejected += 1
            return False
        self.epoch = epoch
        return True
