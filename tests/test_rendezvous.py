"""The rendezvous's inputs: malformed launcher variables and timeouts are refused in one line naming
the variable and what is valid."""

import pytest

from cudnnnet import distributed, rendezvous
from cudnnnet.cli.gpus import free_port
from cudnnnet.errors import DistributedError, UsageError

DIGEST = b"d" * 32
UNIQUE_ID = bytes(range(128))


def _launch(rank, world_size, port):
    return rendezvous.Launch(rank, world_size, 0, "127.0.0.1", port, "torchrun")


# ---- the launchers' variables and the timeouts -----------------------------------------------------------
@pytest.mark.parametrize("environ, problem", [
    ({"RANK": "\u00b2", "WORLD_SIZE": "2"}, "RANK='\u00b2' is not an integer from 0 to "),
    ({"RANK": "\u0661", "WORLD_SIZE": "2"}, "RANK='\u0661' is not an integer from 0 to "),
    ({"RANK": "0", "WORLD_SIZE": "9" * 5000}, "WORLD_SIZE='99999"),
    ({"RANK": "0", "WORLD_SIZE": str(2**40)}, f"WORLD_SIZE='{2**40}' is not an integer from 1 to "),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "\u00b9"}, "LOCAL_RANK='\u00b9' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "\u00b3"},
     "MASTER_PORT='\u00b3' is not an integer from 1 to 65535"),
])
def test_a_launcher_variable_int_would_not_take_is_refused_naming_it(environ, problem):
    with pytest.raises(DistributedError) as refused:
        distributed.from_environment(environ)
    assert problem in str(refused.value) and "\n" not in str(refused.value)
    assert len(str(refused.value)) < 200


@pytest.mark.parametrize("value", ["1e300", "1e9", "inf", "nan", "-1", "0", "soon", ""])
def test_a_rendezvous_timeout_out_of_range_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("CUDNNNET_RENDEZVOUS_TIMEOUT", value)
    with pytest.raises(UsageError, match=f"CUDNNNET_RENDEZVOUS_TIMEOUT={value!r} is not a number of seconds above 0 "
                                         f"and at most 604800"):
        rendezvous.meet(_launch(0, 2, free_port()), DIGEST, lambda: UNIQUE_ID)


@pytest.mark.parametrize("value", ["1e300", "inf", "nan", "-5"])
def test_a_heartbeat_timeout_out_of_range_is_refused_before_the_rendezvous(monkeypatch, value):
    monkeypatch.setenv("CUDNNNET_HEARTBEAT_TIMEOUT", value)
    with pytest.raises(UsageError, match=f"CUDNNNET_HEARTBEAT_TIMEOUT={value!r} is not a number of seconds"):
        distributed.rendezvous(_launch(0, 2, free_port()), DIGEST, lambda: UNIQUE_ID, 0.5)


def test_a_rank_variable_int_would_not_take_ends_cudnnnet_train_in_one_line(monkeypatch, capsys, tmp_path):
    from cudnnnet.cli import launch

    monkeypatch.chdir(tmp_path)
    for name, value in {"RANK": "\u00b2", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert launch.train(["--config", "mnist_mlp", "--device", "host", "--output", str(tmp_path / "run")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["cudnnnet-train: error: RANK='\u00b2' is not an integer from 0 to 1048575"]
