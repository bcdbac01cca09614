"""The suite's own ground rules: what every test starts from, wherever pytest is run."""

from pathlib import Path


def test_every_test_runs_in_its_own_empty_folder(tmp_path):
    assert Path.cwd() == tmp_path and list(tmp_path.iterdir()) == []


def test_hypothesis_keeps_no_example_database():
    """Hypothesis would write .hypothesis/ where pytest starts, and replay it in the next run."""
    from hypothesis import settings

    assert settings().database is None
