"""sparkdl.gpu: pinning GPUs through the environment before TensorFlow loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdl.errors import ConfigurationError
from sparkdl.gpu import round_robin
from sparkdl.parallel import ParallelWrapper

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    environ.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=120, check=False)


def test_pin_sets_visibility_and_growth_and_traces(tmp_path):
    trace = tmp_path / "trace.jsonl"
    code = (
        "import os, sys\n"
        "from sparkdl.gpu import pin_gpus, task_gpu_addresses\n"
        "assert task_gpu_addresses() is None\n"
        "pin_gpus(['1', '3'], role='unit')\n"
        "print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['TF_FORCE_GPU_ALLOW_GROWTH'])\n"
        "print('tensorflow' in sys.modules)\n"
    )
    proc = _python(code, tmp_path, SPARKDL_GPU_TRACE=str(trace))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1,3", "true", "False"]
    (record,) = [json.loads(line) for line in trace.read_text().splitlines()]
    assert record["role"] == "unit"
    assert record["addresses"] == ["1", "3"]
    assert record["cuda_visible_devices"] == "1,3"
    assert record["tensorflow_loaded"] is False


def test_no_gpus_leaves_the_environment_alone(tmp_path):
    code = (
        "import os\n"
        "from sparkdl.gpu import pin_gpus\n"
        "pin_gpus(None)\n"
        "env = os.environ\n"
        "print(env.get('CUDA_VISIBLE_DEVICES'), env.get('TF_FORCE_GPU_ALLOW_GROWTH'))\n"
    )
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "None"]


def test_pin_after_tensorflow_loaded_is_a_clear_error(tmp_path):
    code = (
        "import os\n"
        "os.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
        "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
        "import tensorflow\n"
        "from sparkdl.errors import TrainingError\n"
        "from sparkdl.gpu import pin_gpus\n"
        "pin_gpus(['0'])  # the same visibility: fine\n"
        "try:\n"
        "    pin_gpus(['1'])\n"
        "except TrainingError as exc:\n"
        "    print('ERROR', exc)\n"
    )
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ERROR cannot pin this task to GPU(s) '1'" in proc.stdout
    assert "TensorFlow is already loaded" in proc.stdout
    assert "CUDA_VISIBLE_DEVICES='0'" in proc.stdout


def test_round_robin_assignment():
    assert [round_robin(["0", "1", "2", "3"], 1, r) for r in range(4)] == [
        ["0"], ["1"], ["2"], ["3"]
    ]
    assert [round_robin(["0", "1", "2"], 2, r) for r in range(3)] == [
        ["0", "1"], ["2", "0"], ["1", "2"]
    ]
    assert round_robin(["0"], 0, 0) == []


def test_parallel_wrapper_devices(monkeypatch):
    wrapper = ParallelWrapper(object(), object(), gpus_per_worker=1, devices=["4", "6"])
    assert [wrapper.worker_gpus(r) for r in range(3)] == [["4"], ["6"], ["4"]]
    assert ParallelWrapper(object(), object()).worker_gpus(0) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert ParallelWrapper(object(), object(), gpus_per_worker=2).worker_gpus(1) == ["2", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(ConfigurationError, match="gpus_per_worker=1 needs devices"):
        ParallelWrapper(object(), object(), gpus_per_worker=1)
