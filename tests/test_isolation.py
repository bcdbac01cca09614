"""The suite's own ground rules: what every test starts from, wherever pytest is run."""

import subprocess
import sys
from pathlib import Path


def test_every_test_runs_in_its_own_empty_folder(tmp_path):
    assert Path.cwd() == tmp_path and list(tmp_path.iterdir()) == []


def test_hypothesis_keeps_no_example_database():
    """Hypothesis would write .hypothesis/ where pytest starts, and replay it in the next run."""
    from hypothesis import settings

    assert settings().database is None


def test_a_python_the_tests_start_elsewhere_imports_the_same_cudnnnet():
    import cudnnnet

    finished = subprocess.run([sys.executable, "-c", "import cudnnnet; print(cudnnnet.__file__)"],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert Path(finished.stdout.strip()) == Path(cudnnnet.__file__)
