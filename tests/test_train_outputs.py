"""What training leaves behind for later use: periodic model.npz checkpoints and the original's .bin files."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from cudnnnet import Network
from cudnnnet.io.checkpoint import load_npz
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.errors import OutputExistsError
from cudnnnet.train.trainer import Trainer, build_network
from run_helpers import REPO_ROOT, offline_tools, run_script, train_cli

MLP_CONFIG = REPO_ROOT / "configs" / "mnist_mlp.yaml"


def test_checkpoint_every_epoch_writes_model_npz_after_the_first(mnist_dir, tmp_path, monkeypatch):
    """Batch 600 makes 100 steps an epoch; 150 steps end half-way through the second."""
    config = load_config(MLP_CONFIG).with_overrides(steps=150, batch_size=600, device="host", data_dir=mnist_dir)
    settings = config.to_dict()
    settings["train"]["checkpoint_every"] = 1
    saved = []  # (position, weights) of each model.npz as it was written
    original_save = Network.save

    def save_and_keep_a_copy(network, path, *args, **kwargs):
        written = original_save(network, path, *args, **kwargs)
        arrays, metadata = load_npz(written)
        saved.append((metadata["position"], arrays))
        return written

    monkeypatch.setattr(Network, "save", save_and_keep_a_copy)
    trainer = Trainer(parse_config(settings), tmp_path, progress=False)
    trainer.run()
    assert [position for position, _ in saved] == [{"epoch": 1, "batch": 0, "step": 100},
                                                   {"epoch": 1, "batch": 50, "step": 150}]
    after_epoch_one, at_the_end = saved[0][1], saved[1][1]
    assert not np.array_equal(after_epoch_one["fc1.weight"], at_the_end["fc1.weight"])
    final = trainer.network.state_dict()
    assert all(np.array_equal(at_the_end[name], value) for name, value in final.items())


def folder_contents(folder) -> dict:
    """Every file's bytes and every link's target under ``folder`` (hidden sets included; links not followed)."""
    contents = {}
    for parent, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(parent, name)
            relative = os.path.relpath(path, folder)
            if os.path.islink(path):
                contents[relative] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as file:
                    contents[relative] = file.read()
    return contents


def short_run(mnist_dir, steps: int):
    return load_config(MLP_CONFIG).with_overrides(steps=steps, device="host", data_dir=mnist_dir)


@pytest.fixture
def earlier_run(mnist_dir, tmp_path):
    """An output folder holding the published set of a 2-step training."""
    output = tmp_path / "run"
    Trainer(short_run(mnist_dir, 2), output, progress=False).run()
    return output


def test_training_into_a_published_folder_is_refused_before_anything_is_read(earlier_run, tmp_path):
    before = folder_contents(earlier_run)
    with offline_tools(tmp_path) as call:  # no data there, and no download: reading it would fail otherwise
        finished = call("train", "--config", MLP_CONFIG, "--device", "host", "--data-dir", tmp_path / "no_data",
                        "--output", earlier_run, "--steps", "2")
    assert finished.returncode == 2, finished.stderr
    assert finished.stderr.splitlines() == [
        f"cudnnnet-train: error: --output {earlier_run} already holds the outputs of a training (model.npz, "
        f"metrics.json, history.csv, curves.png, config.yaml, best.npz): pass --resume {earlier_run} to continue it, --overwrite to "
        f"replace it, or another --output"]
    assert folder_contents(earlier_run) == before and not (tmp_path / "no_data").exists()


def test_the_trainer_refuses_a_published_folder_unless_it_resumes_it_or_overwrites_it(earlier_run, mnist_dir):
    before = folder_contents(earlier_run)
    with pytest.raises(OutputExistsError, match=rf"--output {earlier_run} already holds the outputs of a training"):
        Trainer(short_run(mnist_dir, 4), earlier_run, progress=False)
    assert folder_contents(earlier_run) == before
    resumed = Trainer(short_run(mnist_dir, 4), earlier_run, resume=earlier_run / "model.npz", progress=False)
    assert resumed.position.step == 2
    Trainer(short_run(mnist_dir, 4), earlier_run, progress=False, overwrite=True)
    assert folder_contents(earlier_run) == before  # made, not run: nothing written


def test_an_overwriting_run_leaves_the_earlier_set_published_until_it_publishes_its_own(earlier_run, mnist_dir):
    earlier = (earlier_run / "model.npz").read_bytes()
    earlier_set = os.readlink(earlier_run / "current")
    overwriting = Trainer(short_run(mnist_dir, 5), earlier_run, progress=False, overwrite=True)
    train_batch = overwriting.train_batch
    shown = []  # what the folder showed at each step of the new run, before its only publication

    def train_and_look(index):
        shown.append((os.readlink(earlier_run / "current"), (earlier_run / "model.npz").read_bytes()))
        return train_batch(index)

    overwriting.train_batch = train_and_look
    overwriting.run()
    assert shown == [(earlier_set, earlier)] * 5
    assert load_npz(earlier_run / "model.npz")[1]["position"]["step"] == 5
    assert [path.name for path in earlier_run.iterdir() if path.name.startswith(".")] == \
        [os.readlink(earlier_run / "current")] != [earlier_set]


def test_a_run_another_training_published_over_while_it_prepared_is_refused_under_the_lock(mnist_dir, tmp_path):
    """The second trainer is made (its check passes: nothing published yet); the first then runs and
    publishes; the second, taking the lock, refuses before training a step and leaves the first's set."""
    output = tmp_path / "run"
    second = Trainer(short_run(mnist_dir, 3), output, progress=False)
    Trainer(short_run(mnist_dir, 2), output, progress=False).run()
    before = folder_contents(output)
    trained = []
    second.train_batch = trained.append
    with pytest.raises(OutputExistsError) as refused:
        second.run()
    assert str(refused.value) == (
        f"--output {output}: another training published its outputs there (model.npz, metrics.json, "
        f"history.csv, curves.png, config.yaml, best.npz) after this one started; they are left intact: pass --overwrite to replace "
        f"them, or another --output")
    assert trained == []
    assert folder_contents(output) == before
    assert load_npz(output / "model.npz")[1]["position"]["step"] == 2


def test_a_run_resuming_a_folder_refuses_a_set_published_there_since(earlier_run, mnist_dir):
    resuming = Trainer(short_run(mnist_dir, 4), earlier_run, resume=earlier_run, progress=False)
    Trainer(short_run(mnist_dir, 3), earlier_run, resume=earlier_run, progress=False).run()
    before = folder_contents(earlier_run)
    with pytest.raises(OutputExistsError, match="another training published its outputs there"):
        resuming.run()
    assert folder_contents(earlier_run) == before


def write_digit_image(path):
    """A '1': a vertical bar, white on black."""
    digit = np.zeros((28, 28), np.uint8)
    digit[5:23, 13:16] = 255
    Image.fromarray(digit, "L").save(path)
    return path


def predict_json(weights, image, *extra: str):
    finished = run_script("predict", "--weights", str(weights), *extra, "--device", "host", "--json", "--quiet",
                          str(image))
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout)


def test_export_original_writes_bin_files_that_predict_as_the_npz(mnist_dir, tmp_path):
    trained = train_cli("configs/mnist_mlp.yaml", tmp_path / "run", mnist_dir, "--steps", "5",
                        "--export-original", str(tmp_path / "pretrained"))
    assert trained.returncode == 0, trained.stderr
    network = build_network(load_config(MLP_CONFIG), "host")
    sizes = {name: value.nbytes for name, value in network.state_dict().items()}
    assert {path.name: path.stat().st_size for path in (tmp_path / "pretrained").iterdir()} == {
        "fc1.bin": sizes["fc1.weight"], "fc1.bias.bin": sizes["fc1.bias"],
        "fc2.bin": sizes["fc2.weight"], "fc2.bias.bin": sizes["fc2.bias"]}
    network.load_original(tmp_path / "pretrained")
    from_npz = Network.load(tmp_path / "run" / "model.npz")
    assert all(np.array_equal(value, from_npz.state_dict()[name]) for name, value in network.state_dict().items())
    image = write_digit_image(tmp_path / "one.png")
    assert predict_json(tmp_path / "pretrained", image, "--config", str(MLP_CONFIG)) == \
        predict_json(tmp_path / "run" / "model.npz", image)
    model_and_data = tmp_path / "model_and_data.yaml"  # no train section: no optimiser is needed to predict
    model_and_data.write_text(MLP_CONFIG.read_text().split("train:")[0])
    assert "optimizer" not in model_and_data.read_text() and "normalize: true" in model_and_data.read_text()
    assert predict_json(tmp_path / "pretrained", image, "--config", str(model_and_data)) == \
        predict_json(tmp_path / "run" / "model.npz", image)
