"""Actor classes defined in the user's own script (__main__) reach procs by value."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    from dataclasses import dataclass
    from regent import Session
    from regent import Actor, endpoint

    @dataclass
    class Msg:
        text: str

    class Shout(Actor):
        def __init__(self, suffix):
            self.suffix = suffix
        @endpoint
        def shout(self, m: Msg) -> Msg:
            return Msg(m.text.upper() + self.suffix)

    with Session("mainclass") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("shout", Shout, "!")
        print([m.text for m in mesh.shout.call(Msg("hi")).get().values()])
    """
)


def test_an_actor_class_defined_in_the_program_script_runs_on_procs(tmp_path):
    script = tmp_path / "user_program.py"
    script.write_text(PROGRAM)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['HI!', 'HI!']"
