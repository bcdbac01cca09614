"""The configs shipped in the package (cudnnnet/config/shipped.py): ``--config NAME`` and
``load_config(NAME)`` find them wherever cudnnnet is installed; a file of that name still wins."""

import pytest

from cudnnnet.cli import launch, train
from cudnnnet.config.schema import load_config
from cudnnnet.errors import ConfigError
from cudnnnet.config.shipped import CONFIG_DIR, resolve_config, shipped_config_names
from run_helpers import REPO_ROOT

SHIPPED = ["cifar10_cnn", "fashion_mnist_cnn", "image_folder", "lenet5", "mnist_bn_cnn", "mnist_cnn", "mnist_mlp", "original_cnn",
           "original_mlp"]


def test_the_package_ships_the_repository_configs():
    assert shipped_config_names() == SHIPPED
    in_repository = sorted((REPO_ROOT / "configs").glob("*.yaml"))
    assert [path.stem for path in in_repository] == SHIPPED
    assert all(path.read_bytes() == (CONFIG_DIR / path.name).read_bytes() for path in in_repository)


@pytest.mark.parametrize("name", ["mnist_mlp", "mnist_mlp.yaml"])
def test_a_shipped_config_is_named_with_or_without_its_suffix(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here
    assert resolve_config(name) == CONFIG_DIR / "mnist_mlp.yaml"
    config = load_config(name)
    assert config.source == str(CONFIG_DIR / "mnist_mlp.yaml") and config.train.batch_size == 64


def test_a_file_of_that_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnist_mlp.yaml").write_text((CONFIG_DIR / "mnist_mlp.yaml").read_text().replace("batch_size: 64",
                                                                                                 "batch_size: 8"))
    assert load_config("mnist_mlp.yaml").train.batch_size == 8
    assert load_config("mnist_mlp").train.batch_size == 64  # no file called mnist_mlp: the shipped one


def test_a_folder_of_that_name_does_not_hide_the_shipped_config(tmp_path, monkeypatch):
    """``--output mnist_mlp`` makes a folder mnist_mlp here; ``--config mnist_mlp`` still names the shipped one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnist_mlp").mkdir()
    (tmp_path / "mnist_mlp.yaml").mkdir()
    assert resolve_config("mnist_mlp") == resolve_config("mnist_mlp.yaml") == CONFIG_DIR / "mnist_mlp.yaml"
    (tmp_path / "mine").mkdir()
    with pytest.raises(ConfigError, match=r"cannot read config file mine: Is a directory"):
        load_config("mine")


@pytest.mark.parametrize(("name", "said", "hint"), [
    ("mnist_gpt", "config 'mnist_gpt' is neither a file nor a shipped config", "; did you mean 'mnist_mlp'?"),
    ("elsewhere/mnist_mlp.yaml", "config file elsewhere/mnist_mlp.yaml does not exist", ""),
])
def test_an_unknown_config_lists_the_shipped_names(name, said, hint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as raised:
        load_config(name)
    assert str(raised.value) == \
        f"{said}; give a YAML file or the name of a shipped config: {', '.join(SHIPPED)}{hint}"


def test_cudnnnet_train_names_the_shipped_configs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert ("shipped config by name: cifar10_cnn, fashion_mnist_cnn, image_folder, lenet5, mnist_bn_cnn, mnist_cnn, "
            "mnist_mlp") in " ".join(capsys.readouterr().out.split())
    assert train.main(["--config", "mnist_gpt", "--output", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == (
        "cudnnnet-train: error: config 'mnist_gpt' is neither a file nor a shipped config; give a YAML file or the "
        f"name of a shipped config: {', '.join(SHIPPED)}; did you mean 'mnist_mlp'?")
    assert not (tmp_path / "run").exists()


def test_the_launcher_reads_the_device_of_a_shipped_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert launch.device_asked_for(["--config", "original_mlp"]) == load_config("original_mlp").device
    assert launch.device_asked_for(["--config", "mnist_gpt"]) is None  # cli.train reports it
