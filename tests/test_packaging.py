"""What a user installs: the sdist and the wheel built from this tree, and the wheel installed into
a fresh virtual environment, where the console scripts and the shipped configs must work without
the repository.

Both are built with setuptools' PEP 517 backend in a subprocess (setuptools >= 77 comes with the
test extra), from a copy of the tree so that the checkout gets no build/ or egg-info; the wheel is
installed with ``--no-deps --no-index`` and the new environment sees this one's packages (NumPy,
PyYAML...) through a .pth file: no network is needed.
"""

import importlib.metadata
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import cudnnnet
from run_helpers import REPO_ROOT

NOT_SOURCE = shutil.ignore_patterns(".git", "__pycache__", "build", "dist", "*.egg-info", ".pytest_cache",
                                    ".hypothesis", "runs", ".data", ".whl", ".venv", "venv")
BUILD = "import sys; from setuptools import build_meta; getattr(build_meta, sys.argv[1])(sys.argv[2])"
SETUPTOOLS_NEEDED = (77,)  # license as an SPDX expression (pyproject.toml's build-system)


def setuptools_version() -> tuple[int, ...]:
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return ()
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


@pytest.fixture(scope="module")
def distributions(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel) built from a copy of this tree."""
    if setuptools_version() < SETUPTOOLS_NEEDED:
        pytest.skip("building needs setuptools >= 77 (pip install -e \".[test]\" installs it)")
    folder = tmp_path_factory.mktemp("build")
    source, output = folder / "source", folder / "dist"
    shutil.copytree(REPO_ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    output.mkdir()
    for hook in ("build_sdist", "build_wheel"):  # one process each, as a build frontend runs them
        finished = subprocess.run([sys.executable, "-c", BUILD, hook, str(output)], cwd=source, capture_output=True,
                                  text=True, timeout=300)
        assert finished.returncode == 0, finished.stderr[-3000:]
    (sdist,), (wheel,) = output.glob("*.tar.gz"), output.glob("*.whl")
    return sdist, wheel


def files_under(folder: str, pattern: str) -> list[str]:
    return sorted(path.relative_to(REPO_ROOT).as_posix() for path in (REPO_ROOT / folder).glob(pattern)
                  if "__pycache__" not in path.parts)


def test_the_sdist_holds_what_building_testing_and_running_need(distributions):
    sdist, _ = distributions
    with tarfile.open(sdist) as archive:
        prefix = f"cudnnnet-{cudnnnet.__version__}/"
        members = {name.removeprefix(prefix) for name in archive.getnames()}
    needed = ["README.md", "LICENSE", "pyproject.toml", "MANIFEST.in", ".ci/run",
              *files_under("tests", "**/*.py"), *files_under("scripts", "*.py"), *files_under("configs", "*.yaml"),
              *files_under("cudnnnet", "**/*.py"), *files_under("cudnnnet", "**/*.cu"),
              *files_under("cudnnnet", "**/*.cuh"),
              *files_under("cudnnnet/configs", "*.yaml"), *files_under("docs", "**/*.md")]
    assert len(files_under("tests", "**/*.py")) > 20 and len(files_under("configs", "*.yaml")) >= 5
    assert files_under("docs", "**/*.md")
    assert [name for name in needed if name not in members] == []
    assert not [name for name in members if "__pycache__" in name or name.endswith(".pyc")]


def test_every_docs_page_the_readme_names_is_in_the_sdist(distributions):
    sdist, _ = distributions
    with tarfile.open(sdist) as archive:
        members = {name.removeprefix(f"cudnnnet-{cudnnnet.__version__}/") for name in archive.getnames()}
    named = set(re.findall(r"docs/[\w./-]+\.md", (REPO_ROOT / "README.md").read_text(encoding="utf-8")))
    assert sorted(named - members) == []


def wheel_metadata(wheel: Path) -> tuple[set[str], str]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"cudnnnet-{cudnnnet.__version__}.dist-info/METADATA").decode()
    return names, metadata


def test_the_wheel_ships_the_configs_kernels_licence_and_bounded_extras(distributions):
    _, wheel = distributions
    names, metadata = wheel_metadata(wheel)
    shipped = {f"cudnnnet/configs/{name}" for name in ("mnist_mlp.yaml", "mnist_cnn.yaml", "lenet5.yaml",
                                                       "original_mlp.yaml", "original_cnn.yaml")}
    kernels = {f"cudnnnet/backends/cuda/kernels/{path.name}"
               for path in (REPO_ROOT / "cudnnnet/backends/cuda/kernels").glob("*.cu*")}
    assert shipped <= names and kernels <= names and len(kernels) > 5
    assert f"cudnnnet-{cudnnnet.__version__}.dist-info/licenses/LICENSE" in names
    lines = metadata.splitlines()
    assert f"Version: {cudnnnet.__version__}" in lines and "License-Expression: MIT" in lines
    requirements = [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]
    assert 'cuda-bindings<13,>=12.8; extra == "cuda12"' in requirements
    assert 'cuda-bindings<14,>=13; extra == "cuda13"' in requirements
    for extra in ("cuda12", "cuda13"):
        nvidia = [line for line in requirements if line.startswith("nvidia") and f'extra == "{extra}"' in line]
        # cuBLAS, cuDNN, NVRTC and NCCL, each with an upper bound
        assert len(nvidia) == 4 and all("<" in line for line in nvidia), nvidia
        assert any(line.startswith("nvidia-nccl") for line in nvidia), nvidia
    assert not [line for line in requirements if "cuda-runtime" in line or "cuda-python" in line]


@pytest.fixture(scope="module")
def installed(distributions, tmp_path_factory) -> Path:
    """A fresh virtual environment holding the wheel alone; this environment's packages seen through a .pth."""
    _, wheel = distributions
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # Without $PYTHONPATH: a checkout on it (PYTHONPATH=.) holding cudnnnet.egg-info, which a
    # non-editable `pip install .` leaves there, would make pip take cudnnnet as installed already.
    without_path = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    finished = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                               "--disable-pip-version-check", str(wheel)], capture_output=True, text=True, timeout=300,
                              env=without_path)
    assert finished.returncode == 0, finished.stderr
    # After the install: pip would otherwise find this environment's cudnnnet (CI installs it) and skip the wheel.
    # The .pth folders come after the venv's own site-packages on sys.path, so the wheel's cudnnnet is imported.
    here = {*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "_this_environment.pth").write_text("\n".join(sorted(here)) + "\n")
    return venv


def run_installed(venv: Path, command: str, *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` from the venv's bin/, in ``cwd`` (outside the repository), the repository off sys.path."""
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(venv / "bin" / command), *arguments], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


@pytest.mark.parametrize("script", ["cudnnnet-train", "cudnnnet-predict", "cudnnnet-evaluate", "cudnnnet-benchmark",
                                    "cudnnnet-export"])
def test_the_installed_console_scripts_answer_help(installed, tmp_path, script):
    finished = run_installed(installed, script, "--help", cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith(f"usage: {script}")


def test_the_installed_package_is_the_wheel_and_loads_a_shipped_config(installed, tmp_path):
    probe = ("import cudnnnet\n"
             "from cudnnnet.config.schema import load_config\n"
             "config = load_config('mnist_mlp')\n"
             "print(cudnnnet.__file__)\n"
             "print(config.source)\n"
             "print(len(config.model))\n")
    finished = run_installed(installed, "python", "-c", probe, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    module, source, layers = finished.stdout.split()
    assert Path(module).is_relative_to(installed) and Path(source).is_relative_to(installed)
    assert Path(source).name == "mnist_mlp.yaml" and int(layers) == 4  # Dense, ReLU, Dense, Softmax


def test_the_installed_trainer_runs_a_shipped_config_as_a_module(installed, tmp_path, mnist_dir):
    """What cudnnnet-benchmark's original workload starts: python -m cudnnnet.cli.launch --config NAME."""
    finished = run_installed(installed, "python", "-m", "cudnnnet.cli.launch", "--config", "original_mlp",
                             "--device", "host", "--steps", "2", "--data-dir", str(mnist_dir),
                             "--output", str(tmp_path / "run"), "--quiet", cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert (tmp_path / "run" / "metrics.json").is_file()
