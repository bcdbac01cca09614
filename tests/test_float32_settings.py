"""Settings the device keeps in float32 are refused where float32's rounding leaves their valid range
(1 − 1e-12 becomes 1, 1e-50 becomes 0): in configs and in the Python constructors alike."""

import pytest
import yaml

from cudnnnet.config.schema import parse_config
from cudnnnet.errors import ConfigError, InvalidArgumentError
from cudnnnet.layers import BatchNorm, Dense, Dropout, Softmax
from cudnnnet.network import Network
from cudnnnet.optim.optimizers import SGD, Adam

NEAR_ONE = 1 - 1e-12  # below 1 in float64, 1.0 in float32
NEAR_ZERO = 1e-50  # above 0 in float64, 0.0 in float32


def _config(model=None, optimizer=None) -> dict:
    return {"model": model or [{"type": "dense", "name": "fc", "out_size": 10}, {"type": "softmax", "name": "out"}],
            "train": {"optimizer": optimizer or {"lr": 0.1}}}


@pytest.mark.parametrize("config, key", [
    (_config(optimizer={"lr": 0.1, "momentum": NEAR_ONE}), "momentum"),
    (_config(optimizer={"lr": NEAR_ZERO}), "lr"),
    (_config(optimizer={"name": "adam", "lr": 0.1, "betas": [NEAR_ONE, 0.999]}), "beta1"),
    (_config(optimizer={"name": "adamw", "lr": 0.1, "betas": [0.9, NEAR_ONE]}), "beta2"),
    (_config(model=[{"type": "dense", "name": "fc", "out_size": 10}, {"type": "dropout", "name": "drop", "rate": NEAR_ONE},
                    {"type": "softmax", "name": "out"}]), "rate"),
    (_config(model=[{"type": "dense", "name": "fc", "out_size": 10},
                    {"type": "batchnorm", "name": "bn", "momentum": NEAR_ZERO}, {"type": "softmax", "name": "out"}]),
     "momentum"),
])
def test_a_config_setting_float32_rounds_out_of_its_range_is_refused_naming_it(config, key):
    with pytest.raises(ConfigError, match=rf"{key}.*which float32 \(the device's arithmetic\) rounds to"):
        parse_config(yaml.safe_load(yaml.safe_dump(config)))


def test_the_same_settings_just_inside_float32_s_range_are_taken():
    parse_config(_config(optimizer={"lr": 1e-30, "momentum": 0.9999999}))


def _network():
    return Network([Dense("fc", 10), Softmax("out")], backend="host", input_shape=(4, 1, 1))


@pytest.mark.parametrize("make, message", [
    (lambda: Dropout("drop", NEAR_ONE), r"layer 'drop': rate must be a number in \[0, 1\), got .*rounds to 1"),
    (lambda: BatchNorm("bn", momentum=NEAR_ZERO), r"layer 'bn': momentum must be a number in \(0, 1\], got .*rounds to 0"),
    (lambda: SGD(_network(), 0.1, NEAR_ONE), r"momentum must be a finite number in \[0, 1\), got .*rounds to 1\.0"),
    (lambda: SGD(_network(), NEAR_ZERO), r"learning rate must be a finite number .*rounds to 0\.0"),
    (lambda: Adam(_network(), 0.1, betas=(0.9, NEAR_ONE)), r"betas\[1\] must be a finite number .*rounds to 1\.0"),
])
def test_a_python_setting_float32_rounds_out_of_its_range_is_refused(make, message):
    with pytest.raises(InvalidArgumentError, match=message):
        make()
