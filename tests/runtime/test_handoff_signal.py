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
