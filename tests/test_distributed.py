"""distributed.py without a GPU: the launchers' environments, sharding, the learning-rate rule, and the
rendezvous and heartbeats between real processes on the loopback."""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

from cudnnnet.train.distributed import replicas as distributed
from cudnnnet.train.distributed.launcher import spawn_ranks, without_gpus_option
from cudnnnet.config.schema import parse_config
from cudnnnet.data.loader import BatchLoader
from cudnnnet.errors import ConfigError, DistributedError, OutputExistsError, UsageError
from cudnnnet.train.outputs import OutputFolder

UNIQUE_ID = bytes(range(128))


# ---- the launchers' environments ------------------------------------------------------------------
@pytest.mark.parametrize("environ, expected", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"},
     distributed.Launch(3, 8, 1, "node0", 29500, "torchrun")),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, distributed.Launch(0, 1, 0, None, None, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
      "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4000"}, distributed.Launch(5, 6, 2, "10.0.0.1", 4000, "Open MPI")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}, distributed.Launch(1, 2, 1, None, None, "MPICH")),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3", "MASTER_ADDR": "n1", "MASTER_PORT": "1"},
     distributed.Launch(7, 16, 3, "n1", 1, "Slurm")),
    # mpirun inside a Slurm allocation: the MPI ranks, not the batch step's SLURM_PROCID
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, distributed.Launch(1, 4, 1, None, None, "Open MPI")),
])
def test_each_launcher_s_environment_is_read_as_it_is(environ, expected):
    assert distributed.from_environment(environ) == expected


@pytest.mark.parametrize("environ", [{}, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},
                                     {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}])
def test_a_single_process_is_not_distributed(environ):
    assert distributed.from_environment(environ) is None


@pytest.mark.parametrize("environ, problem", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not an integer from 1 to 1048576"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not an integer from 1 to 65535"),
])
def test_a_malformed_environment_is_refused_naming_the_variable(environ, problem):
    with pytest.raises(DistributedError, match=problem):
        distributed.from_environment(environ)


def test_several_ranks_need_rank_0_s_address():
    launch = distributed.from_environment({"PMI_RANK": "1", "PMI_SIZE": "2"})
    with pytest.raises(DistributedError, match="MASTER_ADDR and MASTER_PORT"):
        launch.address()


@pytest.mark.parametrize("visible, local_rank, expected", [(None, 2, "2"), ("4,5,6,7", 1, "5"), ("GPU-abc", 3, "GPU-abc")])
def test_each_rank_sees_its_own_gpu_and_nvlink_multicast_stays_off(visible, local_rank, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    launch = distributed.Launch(0, 8, local_rank, "h", 1, "torchrun")
    assert distributed.pin_device(launch, environ) == expected
    assert environ["CUDA_VISIBLE_DEVICES"] == expected and environ["NCCL_NVLS_ENABLE"] == "0"


def test_a_local_rank_beyond_the_visible_gpus_is_refused():
    with pytest.raises(DistributedError, match="local rank 2 has no GPU"):
        distributed.pin_device(distributed.Launch(0, 4, 2, "h", 1, "Slurm"), {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_gpus_option_is_taken_out_of_the_ranks_arguments():
    argv = ["--config", "mnist_mlp", "--gpus", "2", "--epochs", "1", "--gpus=4", "--gpu", "3", "--quiet"]
    assert without_gpus_option(argv) == ["--config", "mnist_mlp", "--epochs", "1", "--quiet"]


def test_gpus_is_refused_under_a_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="leave --gpus out"):
        spawn_ranks(2, ["--config", "mnist_mlp"])


# ---- sharding ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("count, world_size", [(60, 1), (60, 2), (60, 4), (61, 4), (7, 8)])
def test_shards_are_disjoint_and_cover_the_epoch(count, world_size):
    order = np.random.default_rng(0).permutation(count)
    shards = [distributed.shard(order, rank, world_size) for rank in range(world_size)]
    assert {len(part) for part in shards} == {distributed.shard_size(count, world_size)}
    joined = np.concatenate(shards)
    assert set(joined) == set(range(count))  # covering
    assert len(joined) - count == (-count) % world_size  # repeats: only the padding to a multiple of the world
    if count % world_size == 0:
        assert len(set(joined)) == len(joined)  # disjoint


def test_every_rank_draws_the_same_permutation_and_keeps_its_own_part():
    images, labels = np.zeros((100, 1, 2, 2), np.float32), np.arange(100) % 10
    ranks = [distributed.Shard(BatchLoader(images, labels, 8, seed=5), rank, 4) for rank in range(4)]
    for epoch in (0, 3):
        full = BatchLoader(images, labels, 8, seed=5).permutation(epoch)
        parts = [shard.permutation(epoch) for shard in ranks]
        assert np.array_equal(np.concatenate(parts), full)
    assert not np.array_equal(ranks[0].permutation(0), ranks[0].permutation(1))
    assert ranks[0].num_samples == 25 and ranks[0].steps_per_epoch == 4


# ---- the learning-rate rule ------------------------------------------------------------------------------
def test_linear_scaling_warms_up_to_the_world_size():
    factors = [distributed.lr_factor("linear", 4, 10, step) for step in (0, 5, 10, 50)]
    assert factors == [1.0, 2.5, 4.0, 4.0]
    assert distributed.lr_factor("linear", 4, 0, 0) == 4.0
    assert distributed.lr_factor("none", 4, 10, 50) == 1.0
    assert distributed.lr_factor("linear", 1, 10, 50) == 1.0


def _config(**train):
    return parse_config({"model": [{"type": "dense", "name": "fc", "out_size": 10}, {"type": "softmax", "name": "sm"}],
                         "data": {}, "train": {"optimizer": {"name": "sgd", "lr": 0.1}, **train}})


def test_the_lr_rule_is_a_config_key_linear_with_one_warm_up_epoch_by_default():
    config = _config()
    assert (config.train.lr_scaling, config.train.lr_warmup_epochs) == ("linear", 1.0)
    assert _config(lr_scaling="none", lr_warmup_epochs=0.5).train.lr_scaling == "none"
    with pytest.raises(ConfigError, match="lr_scaling: expected one of linear, none"):
        _config(lr_scaling="sqrt")


def test_the_config_digest_ignores_the_data_directory_and_the_device_only():
    one, other = _config().to_dict(), _config().to_dict()
    other["data"]["dir"], other["device"] = "/elsewhere", "cuda"
    assert distributed.config_digest(one) == distributed.config_digest(other)
    assert distributed.config_digest(one) != distributed.config_digest(_config(seed=1).to_dict())


# ---- the rendezvous between real processes -------------------------------------------------------------------
def _rank(rank, world_size, port, digest, results, timeout=20.0):
    launch = distributed.Launch(rank, world_size, 0, "127.0.0.1", port, "torchrun")
    try:
        unique_id, link = distributed.rendezvous(launch, digest, lambda: UNIQUE_ID, timeout)
        results.put((rank, "ok", unique_id))
        link.close(finished=True)
    except DistributedError as error:
        results.put((rank, "error", str(error)))


def _start(world_size, digests, timeout=20.0, ranks=None):
    context = multiprocessing.get_context("spawn")
    results, port = context.Queue(), _free_port()
    processes = [context.Process(target=_rank, args=(rank, world_size, port, digests[rank], results, timeout))
                 for rank in (range(world_size) if ranks is None else ranks)]
    for process in processes:
        process.start()
    return processes, results


def _collect(processes, results, seconds=60):
    outcomes = {}
    for _ in processes:
        rank, status, value = results.get(timeout=seconds)
        outcomes[rank] = (status, value)
    for process in processes:
        process.join(10)
    return outcomes


def _free_port():
    from cudnnnet.train.distributed.launcher import free_port

    return free_port()


def test_every_rank_receives_rank_0_s_unique_id():
    digest = b"d" * 32
    outcomes = _collect(*_start(3, [digest] * 3))
    assert outcomes == {rank: ("ok", UNIQUE_ID) for rank in range(3)}


def test_a_mismatched_config_is_refused_on_every_rank():
    outcomes = _collect(*_start(3, [b"a" * 32, b"a" * 32, b"b" * 32]))
    assert {status for status, _ in outcomes.values()} == {"error"}
    for status, message in outcomes.values():
        assert "rank 2's config differs from rank 0's" in message


def test_a_missing_rank_ends_the_rendezvous_within_its_timeout():
    started = time.monotonic()
    outcomes = _collect(*_start(3, [b"a" * 32] * 3, timeout=2.0, ranks=[0, 1]))
    assert time.monotonic() - started < 30
    assert "ranks 2 did not reach" in outcomes[0][1]
    assert outcomes[1][0] == "error"


def test_a_rank_with_no_rank_0_gives_up_within_its_timeout():
    outcomes = _collect(*_start(2, [b"a" * 32] * 2, timeout=1.0, ranks=[1]))
    assert "cannot reach rank 0 at 127.0.0.1" in outcomes[1][1]


# ---- heartbeats: a rank that dies is noticed -----------------------------------------------------------------------
def _watching_rank(rank, world_size, port, results):
    os.environ["CUDNNNET_HEARTBEAT_TIMEOUT"] = "5"
    launch = distributed.Launch(rank, world_size, 0, "127.0.0.1", port, "torchrun")
    _, link = distributed.rendezvous(launch, b"x" * 32, lambda: UNIQUE_ID, 20.0)
    link.watch(on_failure=lambda message: results.put((rank, message)))
    results.put((rank, "joined"))
    time.sleep(60)


def test_a_killed_rank_is_reported_by_the_others():
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    queues = [context.Queue() for _ in range(3)]  # one each: a rank killed while writing would hold a shared queue's lock
    processes = [context.Process(target=_watching_rank, args=(rank, 3, port, queues[rank]), daemon=True)
                 for rank in range(3)]
    for process in processes:
        process.start()
    try:
        assert [queue.get(timeout=120) for queue in queues] == [(0, "joined"), (1, "joined"), (2, "joined")]
        os.kill(processes[2].pid, signal.SIGKILL)
        rank, message = queues[0].get(timeout=60)
        assert rank == 0 and "rank 2 stopped without finishing" in message
    finally:
        for process in processes:
            process.kill()
            process.join(10)


def test_several_ranks_on_the_host_backend_are_refused():
    launch = distributed.Launch(0, 2, 0, "127.0.0.1", 1, "torchrun")
    with pytest.raises(UsageError, match="needs --device cuda"):
        distributed.join(launch, _config().with_overrides(device="host"))


@pytest.mark.parametrize("visible, problem", [("0", "--gpus 2: this host has 1 usable GPU; valid are 1 to 1"),
                                              ("", "--gpus 2: this host has 0 usable GPUs")])
def test_gpus_beyond_the_host_s_are_refused_before_any_rank_starts(monkeypatch, capsys, visible, problem):
    from cudnnnet.cli.train import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert main(["--config", "mnist_mlp", "--gpus", "2"]) == 2
    assert problem in capsys.readouterr().err


def _published(output):
    """``output`` holding a published set, as an earlier training leaves it."""
    with OutputFolder(output) as folder, folder.new_set() as staging:
        (staging / "model.npz").write_text("an earlier run's")
    return output


def test_gpus_into_a_published_folder_is_refused_before_any_rank_starts(monkeypatch, capsys, tmp_path):
    from cudnnnet.cli import train

    output = _published(tmp_path / "run")
    started = []
    monkeypatch.setattr(train, "spawn_ranks", lambda count, argv: started.append(argv) or 0)
    arguments = ["--config", "mnist_mlp", "--gpus", "2", "--output", str(output)]
    assert train.main(arguments) == 2
    assert f"--output {output} already holds the outputs of a training (model.npz)" in capsys.readouterr().err
    assert started == []
    assert train.main([*arguments, "--overwrite"]) == 0
    assert train.main([*arguments, "--resume", str(output)]) == 0
    assert len(started) == 2


def test_only_the_rank_that_writes_refuses_a_published_folder(mnist_dir, tmp_path):
    """Rank 0 writes the outputs, so it alone checks the folder: the other ranks go on (here, on the
    host, to the refusal of several processes without CUDA) and never refuse what rank 0 publishes."""
    from cudnnnet.config.schema import load_config
    from cudnnnet.train.trainer import Trainer
    from run_helpers import REPO_ROOT

    output = _published(tmp_path / "run")
    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").with_overrides(
        steps=1, device="host", data_dir=mnist_dir)

    def rank(number):
        return distributed.Group(distributed.Launch(number, 2, 0, "127.0.0.1", 1, "torchrun"), UNIQUE_ID, None)

    with pytest.raises(OutputExistsError, match="already holds the outputs of a training"):
        Trainer(config, output, progress=False, group=rank(0))
    with pytest.raises(UsageError, match="needs the CUDA backend") as refused:
        Trainer(config, output, progress=False, group=rank(1))
    assert not isinstance(refused.value, OutputExistsError)


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failing_rank_ends_the_others_within_seconds_with_its_exit_code(failing):
    """A rank that fails at once (no usable GPU, say) while the others wait for it in the rendezvous:
    the launcher ends them within seconds, not after a rendezvous or heartbeat timeout."""
    import subprocess
    import sys

    from cudnnnet.train.distributed import launcher

    commands = ["import time; time.sleep(600)", "import time; time.sleep(600)"]
    commands[failing] = "import sys; sys.exit(3)"
    children = [subprocess.Popen([sys.executable, "-c", command]) for command in commands]
    started = time.monotonic()
    assert launcher._wait(children) == 3
    assert time.monotonic() - started < 15
    assert children[1 - failing].returncode == -signal.SIGTERM


def _child(tmp_path, name, on_signal):
    """A child that writes ``name`` once its SIGINT/SIGTERM handler is in place, then waits for a signal
    and runs ``on_signal``; a second SIGTERM (the launcher's) ends it at once."""
    import subprocess
    import sys

    ready = tmp_path / name
    code = (f"import signal, sys, time\n"
            f"def stop(signum, frame):\n    signal.signal(signal.SIGTERM, signal.SIG_DFL)\n    {on_signal}\n"
            f"signal.signal(signal.SIGINT, stop)\nsignal.signal(signal.SIGTERM, stop)\n"
            f"open({str(ready)!r}, 'w').close()\ntime.sleep(60)\nsys.exit(9)\n")
    return subprocess.Popen([sys.executable, "-c", code]), ready


def test_after_a_forwarded_signal_rank_0_may_finish_its_checkpoint(monkeypatch, tmp_path):
    """Ctrl-C: every rank stops at an agreed step and rank 0 publishes a checkpoint; a rank that exits
    first (interrupted, 130) does not make the launcher cut rank 0 short."""
    import threading

    from cudnnnet.train.distributed import launcher

    monkeypatch.setattr(launcher, "FAILURE_GRACE_SECONDS", 0.2)
    rank_0, rank_0_ready = _child(tmp_path, "0", "time.sleep(1.5); sys.exit(0)")
    rank_1, rank_1_ready = _child(tmp_path, "1", "sys.exit(130)")
    original = signal.getsignal(signal.SIGINT)

    def interrupt():  # once both children listen and the launcher forwards signals
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (rank_0_ready.exists() and rank_1_ready.exists()
                                                   and signal.getsignal(signal.SIGINT) is not original):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    assert launcher._wait([rank_0, rank_1]) == 130
    assert rank_0.returncode == 0


def test_ranks_that_agreed_to_stop_on_a_signal_are_not_cut_short(monkeypatch, tmp_path):
    """A signal sent to the ranks, not through the launcher (a scheduler's SIGTERM): they agree to stop,
    and rank 0 publishes after the others have exited with 143."""
    from cudnnnet.train.distributed import launcher

    monkeypatch.setattr(launcher, "FAILURE_GRACE_SECONDS", 0.2)
    rank_0, rank_0_ready = _child(tmp_path, "0", "time.sleep(1.5); sys.exit(0)")
    rank_1, rank_1_ready = _child(tmp_path, "1", "sys.exit(143)")
    deadline = time.monotonic() + 30
    while not (rank_0_ready.exists() and rank_1_ready.exists()) and time.monotonic() < deadline:
        time.sleep(0.02)
    rank_0.send_signal(signal.SIGTERM)
    rank_1.send_signal(signal.SIGTERM)
    assert launcher._wait([rank_0, rank_1]) == 143
    assert rank_0.returncode == 0


def test_a_rank_s_last_words_are_one_escaped_line(monkeypatch, capsys):
    """exit_now prints what ended the rank; a peer's name or reason never reaches the terminal raw."""
    monkeypatch.setattr(distributed.os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    with pytest.raises(SystemExit) as exited:
        distributed.exit_now("rank 1 said \x1b[2J\nbye")
    assert exited.value.code == 1
    assert capsys.readouterr().err == "cudnnnet-train: rank 1 said \\x1b[2J\\nbye\n"


def test_the_gradient_reduction_is_fp32_by_default_or_bf16():
    assert _config().train.grad_reduce == "fp32" and "grad_reduce" not in _config().to_dict()["train"]
    bf16 = _config(grad_reduce="bf16")
    assert bf16.train.grad_reduce == "bf16" and parse_config(bf16.to_dict()).train.grad_reduce == "bf16"
    with pytest.raises(ConfigError, match="train.grad_reduce: expected one of fp32, bf16, got 'fp16'") as refused:
        _config(grad_reduce="fp16")
    assert "\n" not in str(refused.value)


def test_bf16_reduction_is_a_no_op_in_one_process(mnist_dir, tmp_path):
    """Nothing to reduce: the same weights as fp32, on the host (no NCCL) and alike on one GPU."""
    from cudnnnet.train.trainer import Trainer

    weights = []
    for reduce in ("fp32", "bf16"):
        raw = _config(steps=2, batch_size=16, grad_reduce=reduce).to_dict()
        config = parse_config({**raw, "data": {"dir": str(mnist_dir)}, "device": "host"})
        trainer = Trainer(config, tmp_path / reduce, progress=False, image_limit=64)
        trainer.run()
        weights.append({p.name: p.value.numpy() for p in trainer.network.parameter_list()})
    for name, value in weights[0].items():
        np.testing.assert_array_equal(weights[1][name], value, err_msg=name)
