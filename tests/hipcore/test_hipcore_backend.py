"""Backend discovery says which runtime hipcore drives and why; forcing is honoured or refused clearly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from regent import hipcore
from regent.hipcore import BackendUnavailableError, detect_backend


def test_backend_names_one_of_three_and_gives_a_reason():
    info = hipcore.backend()
    assert info.name in ("cpu", "cuda", "hip")
    assert info.reason


def test_forcing_cpu_never_needs_torch():
    code = (
        "import sys, regent.hipcore as hipcore; info = hipcore.backend(); "
        "print(info.name, info.forced, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**_env(), "REGENT_HIPCORE_BACKEND": "cpu"},
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()
    assert out == ["cpu", "True", "False"]


def test_an_unknown_backend_name_is_refused_with_the_choices():
    with pytest.raises(BackendUnavailableError, match="cpu, cuda, hip"):
        detect_backend("tpu")


def test_detection_matches_what_torch_reports(torch, monkeypatch):
    # Detected, not forced: the suite pins REGENT_HIPCORE_BACKEND for child processes
    # (tests/hipcore/conftest.py), and a test before this one may have reset the cached backend.
    monkeypatch.delenv("REGENT_HIPCORE_BACKEND", raising=False)
    info = detect_backend(None)
    if not torch.cuda.is_available():
        assert info.name == "cpu"
        assert "is_available() is False" in info.reason or "CPU-only" in info.reason
    elif torch.version.hip:
        assert info.name == "hip"
    else:
        assert info.name == "cuda"
        assert info.device_count == torch.cuda.device_count()


def test_forcing_a_gpu_backend_without_a_gpu_is_a_clear_error(torch):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    own = "hip" if torch.version.hip else "cuda"
    with pytest.raises(BackendUnavailableError, match="is_available.. is False.*REGENT_HIPCORE_BACKEND=cpu"):
        detect_backend(own)


def test_forcing_the_other_gpu_flavour_names_the_torch_build(torch):
    other = "cuda" if torch.version.hip else "hip"
    with pytest.raises(BackendUnavailableError, match="install a"):
        detect_backend(other)


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
