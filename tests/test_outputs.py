"""OutputFolder: a folder's outputs replaced together as one set, locked against a second writer."""

import errno
import os

import pytest

from cudnnnet.errors import OutputExistsError, OutputInUseError, WriteError
from cudnnnet.train.outputs import NAMES, OutputFolder, checkpoint_to_resume, published_outputs, refuse_replacing


def write_set(folder: OutputFolder, tag: str, names=NAMES):
    with folder.new_set() as staging:
        for name in names:
            (staging / name).write_text(tag)


def shown(path) -> dict:
    return {name: (path / name).read_text() for name in NAMES if (path / name).exists()}


def test_each_set_replaces_the_previous_one_whole(tmp_path):
    with OutputFolder(tmp_path) as folder:
        write_set(folder, "first")
        assert shown(tmp_path) == dict.fromkeys(NAMES, "first")
        write_set(folder, "second")
    assert shown(tmp_path) == dict.fromkeys(NAMES, "second")
    sets = [path.name for path in tmp_path.iterdir() if path.name.startswith(".set-")]
    assert sets == [os.readlink(tmp_path / "current")]
    assert all(os.readlink(tmp_path / name) == f"current/{name}" for name in NAMES)


def test_a_failure_while_writing_a_set_leaves_the_published_one(tmp_path):
    with OutputFolder(tmp_path) as folder:
        write_set(folder, "first")
        full_disk = r"\(No space left on device\); the outputs published there before are intact"
        with pytest.raises(WriteError, match=full_disk):
            with folder.new_set() as staging:
                (staging / "model.npz").write_text("half")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        with pytest.raises(ZeroDivisionError):
            with folder.new_set():
                1 / 0
    assert shown(tmp_path) == dict.fromkeys(NAMES, "first")
    assert len([path for path in tmp_path.iterdir() if path.name.startswith(".")]) == 1


def test_what_a_killed_writer_left_is_removed_by_the_next(tmp_path):
    with OutputFolder(tmp_path) as folder:
        write_set(folder, "first")
    (tmp_path / ".set-killed-0001").mkdir()
    (tmp_path / ".set-killed-0001" / ".model.npz.x.tmp").write_text("torn")
    os.symlink(".set-killed-0001", tmp_path / ".link-current-99")
    with OutputFolder(tmp_path):
        pass
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".")) == \
        [os.readlink(tmp_path / "current")]
    assert shown(tmp_path) == dict.fromkeys(NAMES, "first")


def test_files_of_an_older_layout_become_links_at_the_first_set(tmp_path):
    for name in NAMES:
        (tmp_path / name).write_text("old")
    with OutputFolder(tmp_path) as folder:
        write_set(folder, "new", names=NAMES[:3])
    assert shown(tmp_path) == dict.fromkeys(NAMES[:3], "new")  # none of the older files is mixed in
    assert all((tmp_path / name).is_symlink() for name in NAMES[:3])


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path):
    first = OutputFolder(tmp_path)
    first.lock()
    with pytest.raises(OutputInUseError, match="another training is writing into this folder"):
        OutputFolder(tmp_path).lock()
    first.unlock()
    with OutputFolder(tmp_path):
        pass


def test_resume_takes_a_folder_or_a_file(tmp_path):
    with OutputFolder(tmp_path / "run") as folder:
        write_set(folder, "first")
    assert checkpoint_to_resume(tmp_path / "run") == tmp_path / "run" / "model.npz"
    assert checkpoint_to_resume(tmp_path / "other.npz") == tmp_path / "other.npz"


# ---- a new training into a folder that holds a published one ----------------------------------


def published(path):
    with OutputFolder(path) as folder:
        write_set(folder, "earlier")
    return path


def test_a_folder_without_a_published_set_is_not_refused(tmp_path):
    refuse_replacing(tmp_path / "missing")
    refuse_replacing(tmp_path)  # empty
    (tmp_path / ".set-killed-0001").mkdir()  # what a training killed before its first set leaves
    (tmp_path / ".set-killed-0001" / "model.npz").write_text("half")
    os.symlink(".set-killed-0001", tmp_path / ".link-current-99")
    assert published_outputs(tmp_path) == []
    refuse_replacing(tmp_path)


def test_a_published_set_is_refused_naming_its_files_and_what_would_be_valid(tmp_path):
    output = published(tmp_path / "run")
    with pytest.raises(OutputExistsError) as refused:
        refuse_replacing(output)
    assert str(refused.value) == (
        f"--output {output} already holds the outputs of a training (model.npz, metrics.json, history.csv, "
        f"curves.png, config.yaml, best.npz): pass --resume {output} to continue it, --overwrite to replace it, or another --output")
    assert shown(output) == dict.fromkeys(NAMES, "earlier")


@pytest.mark.parametrize("held", [["model.npz"], ["metrics.json", "history.csv"]])
def test_files_of_an_older_layout_are_refused_too(tmp_path, held):
    for name in held:
        (tmp_path / name).write_text("old")
    with pytest.raises(OutputExistsError, match=rf"already holds the outputs of a training \({', '.join(held)}\)"):
        refuse_replacing(tmp_path)


def test_a_published_set_whose_names_are_gone_is_refused_by_its_current_link(tmp_path):
    output = published(tmp_path / "run")
    for name in NAMES:
        (output / name).unlink()
    with pytest.raises(OutputExistsError, match=r"a training \(current\): pass --resume"):
        refuse_replacing(output)


def test_resuming_the_published_checkpoint_or_overwriting_is_allowed(tmp_path):
    output = published(tmp_path / "run")
    current = os.readlink(output / "current")
    for resume in (output, output / "model.npz", output / "current" / "model.npz", output / current / "model.npz"):
        refuse_replacing(output, resume=resume)
    refuse_replacing(output, overwrite=True)
    other = published(tmp_path / "other")
    for resume in (other, other / "model.npz", tmp_path / "missing.npz"):
        with pytest.raises(OutputExistsError):
            refuse_replacing(output, resume=resume)


def test_a_published_folder_another_training_writes_into_is_named_as_in_use(tmp_path):
    output = published(tmp_path / "run")
    writer = OutputFolder(output)
    writer.lock()
    try:
        with pytest.raises(OutputInUseError, match="another training is writing into this folder"):
            refuse_replacing(output)
    finally:
        writer.unlock()
    OutputFolder(output).check_not_in_use()  # the question took no lock
    with pytest.raises(OutputExistsError):
        refuse_replacing(output)


def test_a_set_published_by_a_writer_the_lock_did_not_stop_is_refused_at_publish_time(tmp_path):
    """A writer that did not share the lock (another host's view of the folder) publishes while this run
    holds it: this run's publish is refused, its set removed, the other's left published."""
    folder = OutputFolder(tmp_path)
    folder.admit()
    folder.lock()
    try:
        staging = tmp_path / ".set-elsewhere-0001"
        staging.mkdir()
        for name in NAMES:
            (staging / name).write_text("other's")
        OutputFolder(tmp_path).publish(staging)
        with pytest.raises(OutputExistsError, match=rf"--output {tmp_path}: another training published its "
                                                    rf"outputs there \(model.npz, .*\) after this one started"):
            write_set(folder, "mine")
    finally:
        folder.unlock()
    assert shown(tmp_path) == dict.fromkeys(NAMES, "other's")
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".set-")] == \
        [os.readlink(tmp_path / "current")]


def test_an_admitted_run_publishes_again_over_its_own_sets_and_over_what_it_was_allowed(tmp_path):
    output = published(tmp_path / "run")
    resuming = OutputFolder(output)
    resuming.admit(resume=output)
    with resuming:
        write_set(resuming, "resumed")
        write_set(resuming, "resumed again")
    assert shown(output) == dict.fromkeys(NAMES, "resumed again")
    overwriting = OutputFolder(output)
    overwriting.admit(overwrite=True)
    published(output)  # another training's set, published after the admission: --overwrite replaces it too
    with overwriting:
        write_set(overwriting, "overwritten")
    assert shown(output) == dict.fromkeys(NAMES, "overwritten")
