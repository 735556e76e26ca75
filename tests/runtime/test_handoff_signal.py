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
    edge.raise_pending_handoff()  # raised once


def test_a_sigterm_in_the_program_or_a_library_it_called_raises_at_once():
    with pytest.raises(edge.Handoff):
        edge._raise_handoff(signal.SIGTERM, sys._getframe())
    frames = []
    json.loads("{}", object_hook=lambda d: frames.append(sys._getframe(1)))  # the stdlib's decoder
    with pytest.raises(edge.Handoff):
        edge._raise_handoff(signal.SIGTERM, frames[0])
    assert edge._handoff_pending is False
