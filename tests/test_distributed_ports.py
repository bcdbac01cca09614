"""Which port rank 0's rendezvous listens at, under each launcher."""

import pytest

from cudnnnet.train.distributed import replicas as distributed
from cudnnnet.errors import DistributedError

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("environment, port", [
    (TORCHRUN, 29500),  # --gpus N and a torchrun without an agent store: MASTER_PORT
    ({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True"}, 29501),  # the agent's store holds MASTER_PORT
    ({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "False"}, 29500),
    ({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "CUDNNNET_RENDEZVOUS_PORT": "4100"}, 4100),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "MASTER_ADDR": "n", "CUDNNNET_RENDEZVOUS_PORT": "4100"}, 4100),
])
def test_the_rendezvous_port_steps_aside_from_torchrun_s_agent_store(environment, port):
    assert distributed.from_environment(environment).master_port == port


@pytest.mark.parametrize("environment, message", [
    ({**TORCHRUN, "MASTER_PORT": "65535", "TORCHELASTIC_USE_AGENT_STORE": "True"}, r"MASTER_PORT=65535 .*1\.\.65534"),
    ({**TORCHRUN, "CUDNNNET_RENDEZVOUS_PORT": "0"}, "CUDNNNET_RENDEZVOUS_PORT"),
])
def test_a_port_out_of_range_is_refused_naming_its_variable(environment, message):
    with pytest.raises(DistributedError, match=message):
        distributed.from_environment(environment)
