"""SIGTERM's Handoff is raised in the program, never inside regent's own code: an exception
between two frames of a zmq message leaves half of it in the socket, and the next send
completes it with another message's frames (a worker then failed to unpickle a call)."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from regent.controller import edge
from regent.controller.drive import Drive


def _frame_in_regent():
    frames = []
    Drive().post(lambda: frames.append(sys._getframe(1)))  # the drive's own frame runs it
    return frames[0]


def test_a_sigterm_inside_regent_is_deferred_to_the_next_safe_point():
    edge._handoff_pending = False
    edge._raise_handoff(signal.SIGTERM, _frame_in_regent())  # returns: nothing raised there
    with pytest.raises(edge.Handoff):
        edge.raise_pending_handoff()
    # And at every later safe point: another task (or thread) of the program must not journal a
    # call after the hand-over began.
    with pytest.raises(edge.Handoff):
        edge.raise_pending_handoff()
    edge._handoff_pending = False


def test_a_sigterm_in_the_program_or_a_library_it_called_raises_at_once():
    edge._handoff_pending = False
    with pytest.raises(edge.Handoff):
        edge._raise_handoff(signal.SIGTERM, sys._getframe())
    frames = []
    json.loads("{}", object_hook=lambda d: frames.append(sys._getframe(1)))  # the stdlib's decoder
    with pytest.raises(edge.Handoff):
        edge._raise_handoff(signal.SIGTERM, frames[0])
    with pytest.raises(edge.Handoff):  # raised in the program, and then at its next session call too
        edge.raise_pending_handoff()
    edge._handoff_pending = False


def test_a_store_asked_hand_over_stands_when_another_request_comes_while_the_first_is_checked():
    """`regent upgrade` started over asks again under a new name; the watch reports it while the
    primary checks the first requester, which is gone: the hand-over still happens (it once
    did not, and the old program ran to its end)."""

    class Watch:
        def __init__(self) -> None:
            self.live = False

        def asked(self) -> bool:
            if not self.live:  # the first requester is gone: meanwhile the second one is reported
                self.live = True
                report({"by": "second"})
                return False
            return True  # the second one asks

    watch = Watch()
    site = type("Site", (), {"name": "s", "_handover": watch})()

    def report(request: dict) -> None:
        edge.LiveEdge._on_handover_request(site, request)

    edge._handoff_pending = False
    report({"by": "first"})
    edge.raise_pending_handoff()  # the first is gone; the second, reported during the look, stands
    assert edge._handoff_pending
    with pytest.raises(edge.Handoff):
        edge.raise_pending_handoff()  # checked again: the second asks
    edge._handoff_pending = False
    # Without a new request, a gone requester leaves the primary going on.
    watch.asked = lambda: False
    report({"by": "third"})
    edge.raise_pending_handoff()
    assert not edge._handoff_pending
