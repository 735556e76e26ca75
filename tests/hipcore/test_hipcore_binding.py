"""Per-proc device binding: proc i of N-GPU procs sees GPUs [i*N, (i+1)*N), as documented."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from regent.hipcore import binding


def test_cuda_procs_get_consecutive_gpus():
    assert binding.proc_env(0, 1, "cuda", parent_env={}) == {
        "CUDA_VISIBLE_DEVICES": "0",
        "REGENT_PROC_DEVICES": "0",
        "REGENT_HIPCORE_BACKEND": "cuda",
    }
    assert binding.proc_env(3, 2, "cuda", parent_env={})["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_hip_procs_use_hip_visible_devices():
    env = binding.proc_env(2, 1, "hip", parent_env={})
    assert env["HIP_VISIBLE_DEVICES"] == "2"
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_cpu_procs_get_logical_cpu_devices():
    assert binding.proc_env(5, 1, "cpu", parent_env={}) == {
        "REGENT_CPU_DEVICE": "5",
        "REGENT_PROC_DEVICES": "5",
        "REGENT_HIPCORE_BACKEND": "cpu",
    }


def test_a_restricted_parent_hands_out_its_own_devices():
    parent = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert binding.proc_env(1, 1, "cuda", parent_env=parent)["CUDA_VISIBLE_DEVICES"] == "5"
    assert binding.proc_env(1, 2, "cuda", parent_env=parent)["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(ValueError, match="only 4 are visible"):
        binding.proc_env(4, 1, "cuda", parent_env=parent)


def test_zero_gpus_per_proc_gives_a_cpu_proc():
    env = binding.proc_env(1, 0, "cuda", parent_env={})
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["REGENT_HIPCORE_BACKEND"] == "cpu"


def test_child_env_drops_inherited_bindings():
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "2,3"}
    env = binding.child_env(base, 1, 1, "hip")
    assert env["PATH"] == "/bin"
    assert "CUDA_VISIBLE_DEVICES" not in env, "a stray CUDA filter would hide the proc's GPU on ROCm"
    assert env["HIP_VISIBLE_DEVICES"] == "3"


def test_current_device_inside_a_proc_reads_the_binding():
    code = (
        "from regent import hipcore; d = hipcore.current_device(); "
        "print(d.kind, d.index, ','.join(d.physical_ids))"
    )
    env = binding.child_env(dict(os.environ), 3, 1, "cpu")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["cpu", "3", "3"]
