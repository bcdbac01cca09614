"""What training leaves behind for later use: periodic model.npz checkpoints and the original's .bin files."""

import json

import numpy as np
from PIL import Image

from cudnnnet import Network
from cudnnnet.checkpoint import load_npz
from cudnnnet.config import load_config, parse_config
from cudnnnet.training import Trainer, build_network
from run_helpers import REPO_ROOT, run_script, train_cli

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
