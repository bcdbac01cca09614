"""Did-you-mean hints for misspelt keys, layer types and shipped config names; --version (issue 31, item 3)."""

import contextlib
import io

import pytest

import cudnnnet
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.errors import ConfigError
from cudnnnet.util.suggest import did_you_mean


def settings(**changes) -> dict:
    base = {"model": [{"type": "dense", "out_size": 10}, {"type": "softmax"}],
            "train": {"optimizer": {"lr": 0.1}}}
    for section, value in changes.items():
        base[section] = value
    return base


@pytest.mark.parametrize("changes, message", [
    ({"train": {"optimizer": {"lr": 0.1}, "epoch": 2}},
     "train.epoch: unknown key 'epoch'; valid keys: batch_size, epochs,"),
    ({"train": {"optimiser": {"lr": 0.1}}}, "train.optimiser: unknown key 'optimiser'"),
    ({"model": [{"type": "dens", "out_size": 10}, {"type": "softmax"}]}, "model[0].type: expected one of dense,"),
    ({"model": [{"type": "dense", "outsize": 10}, {"type": "softmax"}]}, "model[0].outsize: unknown key 'outsize'"),
    ({"data": {"dataset": "fashion_mnist"}}, "data.dataset: expected one of mnist,"),
])
def test_a_misspelt_key_or_choice_is_refused_with_the_closest_valid_one(changes, message):
    with pytest.raises(ConfigError) as refused:
        parse_config(settings(**changes))
    text = str(refused.value)
    assert message in text and "\n" not in text
    closest = {"epoch": "epochs", "optimiser": "optimizer", "dens": "dense", "outsize": "out_size",
               "fashion_mnist": "fashion-mnist"}
    wrong = next(word for word in closest if f"'{word}'" in text)
    assert text.endswith(f"; did you mean {closest[wrong]!r}?")


def test_a_key_like_none_of_the_valid_ones_gets_no_hint():
    with pytest.raises(ConfigError) as refused:
        parse_config(settings(train={"optimizer": {"lr": 0.1}, "zzz": 1}))
    assert "did you mean" not in str(refused.value)
    assert did_you_mean(3, ["three"]) == ""


def test_a_misspelt_shipped_config_name_names_the_closest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"neither a file nor a shipped config; .*; did you mean 'mnist_mlp'\?$"):
        load_config("mnist_mpl")


@pytest.mark.parametrize("tool", ["train", "predict", "evaluate", "benchmark"])
def test_every_tool_tells_its_version(tool):
    import importlib

    parser = importlib.import_module(f"cudnnnet.cli.{tool}").build_parser()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exited:
        parser.parse_args(["--version"])
    assert exited.value.code == 0
    assert printed.getvalue() == f"cudnnnet-{tool} {cudnnnet.__version__}\n"
