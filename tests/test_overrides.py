"""--set KEY.PATH=VALUE and the resolved config.yaml of each output folder (issue 31, item 3)."""

import pytest
import yaml

from cudnnnet.config.schema import load_config
from cudnnnet.errors import ConfigError, UsageError
from cudnnnet.config.overrides import apply_overrides, parse_assignment
from run_helpers import REPO_ROOT, offline_tools

MLP = REPO_ROOT / "configs" / "mnist_mlp.yaml"


def small_config(root) -> dict:
    """An MLP on ``small_npz``'s 100 8×8 RGB images: 2 steps of 50."""
    return {"model": [{"type": "dense", "out_size": 16, "name": "hidden"}, {"type": "activation", "mode": "relu"},
                      {"type": "dense", "out_size": 10}, {"type": "softmax"}],
            "data": {"dataset": "npz", "train_file": str(root / "train.npz"), "test_file": str(root / "test.npz")},
            "train": {"batch_size": 50, "epochs": 1, "log_every": 1000, "optimizer": {"lr": 0.1}},
            "device": "host"}


def test_set_replaces_values_typed_by_the_schema():
    config = load_config(MLP, overrides=["train.optimizer.lr=1e-3", "model.fc1.out_size=800", "train.graph=false",
                                         "model[1].mode=tanh", "train.optimizer={name: adam, lr: 0.002}",
                                         "train.steps=7", "train.steps=", "data.normalize=null"])
    plain = load_config(MLP)
    assert config.train.optimizer.name == "adam" and config.train.optimizer.lr == 0.002
    assert config.model[0].name == "fc1" and config.model[0].params == {"out_size": 800}
    assert config.model[1].params["mode"] == "tanh" and config.train.graph is False
    assert config.train.steps is None and config.data.normalize is None
    assert config.model[2:] == plain.model[2:] and config.train.batch_size == plain.train.batch_size


def test_a_number_yaml_reads_as_text_is_a_number_and_a_path_stays_text():
    segments, value = parse_assignment("train.optimizer.lr=1e-3")
    assert segments == ["train", "optimizer", "lr"] and value == 0.001 and isinstance(value, float)
    assert parse_assignment("data.dir=2024") == (["data", "dir"], "2024")
    assert parse_assignment("model[3].out_size=10") == (["model", "3", "out_size"], 10)


def test_layers_without_a_name_are_named_as_the_config_names_them():
    mapping = {"model": [{"type": "dense", "out_size": 3}, {"type": "activation"}, {"type": "dense", "out_size": 2}]}
    changed, paths = apply_overrides(mapping, ["model.dense2.out_size=5", "model.0.out_size=4"])
    assert [layer["out_size"] for layer in changed["model"][::2]] == [4, 5]
    assert mapping["model"][2]["out_size"] == 2  # the caller's mapping is left as it was
    assert paths == {"model[2].out_size": "model.dense2.out_size=5", "model[0].out_size": "model.0.out_size=4"}


@pytest.mark.parametrize("assignment, error, message", [
    ("train.optimizer.lr=abc", ConfigError,
     "--set train.optimizer.lr=abc: train.optimizer.lr: expected a number > 0, got 'abc' (string)"),
    ("model.fc1.out_size=-3", ConfigError,
     "--set model.fc1.out_size=-3: model[0].out_size: expected an integer > 0, got -3"),
    ("train.optimizer.lrr=0.1", ConfigError,
     "--set train.optimizer.lrr=0.1: train.optimizer.lrr: unknown key 'lrr' for optimizer sgd; valid keys: name, lr, "
     "momentum, weight_decay, nesterov; did you mean 'lr'?"),
    ("model.fx1.out_size=3", ConfigError,
     "--set model.fx1.out_size=3: model has no layer named 'fx1'; its layers: fc1, relu1, fc2, softmax; "
     "did you mean 'fc1'?"),
    ("model.7.out_size=3", ConfigError, "--set model.7.out_size=3: model has 4 layers (indices 0 to 3), not 7"),
    ("train.batch_size.big=3", ConfigError,
     "--set train.batch_size.big=3: train.batch_size is 64, not a mapping; set train.batch_size itself"),
    ("train.optimizer.lr", UsageError,
     "--set 'train.optimizer.lr': expected KEY.PATH=VALUE, e.g. --set train.optimizer.lr=0.01"),
    ("=3", UsageError, "--set '=3': expected KEY.PATH=VALUE"),
    ("train.epochs=[1", UsageError, "--set train.epochs=[1: the value is not valid YAML"),
])
def test_a_bad_override_is_one_line_naming_it(assignment, error, message):
    with pytest.raises(error) as refused:
        load_config(MLP, overrides=[assignment])
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_file_error_outside_the_overrides_still_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(MLP.read_text().replace("batch_size: 64", "batch_size: 0"))
    with pytest.raises(ConfigError, match=rf"^{path}: train.batch_size: expected an integer > 0, got 0$"):
        load_config(path, overrides=["train.optimizer.lr=0.5"])
    assert load_config(path, overrides=["train.batch_size=32"]).train.batch_size == 32


def test_the_cli_trains_with_set_and_writes_the_resolved_config(small_npz, tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small_config(small_npz)))
    output = tmp_path / "run"
    with offline_tools(tmp_path) as call:
        finished = call("train", "--config", path, "--output", output, "--set", "model.hidden.out_size=12",
                        "--set", "train.optimizer.lr=0.05", "--steps", "1")
        assert finished.returncode == 0, finished.stderr
        resolved = load_config(output / "config.yaml")
        assert resolved.model[0].params == {"out_size": 12} and resolved.train.optimizer.lr == 0.05
        assert resolved.train.steps == 1 and resolved.data.classes == tuple(str(label) for label in range(10))
        assert resolved.data.train_file == str(small_npz / "train.npz")
        again = call("train", "--config", output / "config.yaml", "--output", tmp_path / "again")
        assert again.returncode == 0, again.stderr
        refused = call("train", "--config", path, "--output", tmp_path / "refused", "--set", "train.epochs=zero")
    assert (tmp_path / "again" / "model.npz").read_bytes() != b""
    assert load_config(tmp_path / "again" / "config.yaml").to_dict() == resolved.to_dict()
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "cudnnnet-train: error: --set train.epochs=zero: train.epochs: expected an integer > 0, got 'zero' (string)"]
    assert not (tmp_path / "refused").exists()
