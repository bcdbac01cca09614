"""Training on the real MNIST: accuracy targets, metrics, resumption, faults; evaluation (on a synthetic set)
against the per-batch forward it replaces."""

import json
import math
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from run_helpers import REPO_ROOT, interrupted_then_resumed, train_cli
from cudnnnet import Network, Tensor
from cudnnnet.io.checkpoint import load_npz
from cudnnnet.config.schema import load_config
from cudnnnet.data.mnist import one_hot
from cudnnnet.engine import SLIDES_KERNELS
from cudnnnet.errors import CheckpointError, ConfigError, TrainingError
from cudnnnet.train import trainer as training
from cudnnnet.layers import MSE, Activation, Dense, Softmax
from cudnnnet.train.trainer import ResidentTestSet, Trainer, evaluate, evaluate_batches

METRIC_KEYS = {"device", "epochs", "steps", "train_accuracy", "test_accuracy", "test_loss", "train_seconds",
               "images_per_second"}


def metrics_of(output):
    return json.loads((output / "metrics.json").read_text())


@pytest.mark.slow
def test_mlp_one_host_epoch_reaches_97_percent(trained_mlp):
    metrics = metrics_of(trained_mlp)
    assert METRIC_KEYS <= metrics.keys()
    assert metrics["epochs"] == 1 and metrics["steps"] == 938
    assert 0 <= metrics["train_accuracy"] <= 1 and metrics["test_accuracy"] >= 0.97
    assert metrics["device"] == "host (NumPy)" and metrics["images_per_second"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])
@pytest.mark.parametrize("config, target", [("mnist_mlp", 0.982), ("mnist_cnn", 0.992), ("lenet5", 0.990),
                                            ("mnist_bn_cnn", 0.994)])
def test_ten_cuda_epochs_reach_the_accuracy_target(cuda, mnist_dir, tmp_path, config, target, engine):
    """The configs as they are (10 epochs, resident data, graph replay) reach the CUDA backend's
    targets on the full MNIST in each engine: MLP 98.2 %, CNN 99.2 %, LeNet-5 99.0 %, the BatchNorm
    CNN (AdamW, dropout) 99.4 %."""
    finished = train_cli(f"configs/{config}.yaml", tmp_path, mnist_dir, "--engine", engine, device="cuda")
    assert finished.returncode == 0, finished.stderr
    metrics = metrics_of(tmp_path)
    assert metrics["epochs"] == 10 and metrics["backend"] == "cuda" and metrics["engine"] == engine
    assert metrics["test_accuracy"] >= target, f"{config}: {metrics['test_accuracy']:.4f} < {target}"


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])
@pytest.mark.parametrize("config, target", [("mnist_mlp", 0.982), ("mnist_cnn", 0.992), ("mnist_bn_cnn", 0.994)])
def test_ten_cuda_epochs_in_bf16_reach_the_accuracy_target(cuda, mnist_dir, tmp_path, config, target, engine):
    """``math: bf16`` (16-bit GEMM and convolution operands, FP32 weights, optimiser, softmax and
    loss; every network's activations and gradients in bfloat16) keeps the FP32 targets of the MLP (98.2 %),
    the CNN (99.2 %) and the BatchNorm CNN (99.4 %)."""
    config_file = tmp_path / f"{config}_bf16.yaml"
    config_file.write_text((REPO_ROOT / "configs" / f"{config}.yaml").read_text() + "math: bf16\n")
    finished = train_cli(str(config_file), tmp_path / "run", mnist_dir, "--engine", engine, device="cuda")
    assert finished.returncode == 0, finished.stderr
    metrics = metrics_of(tmp_path / "run")
    assert metrics["epochs"] == 10 and metrics["math"] == "bf16" and metrics["engine"] == engine
    assert metrics["test_accuracy"] >= target, f"{config} in bf16: {metrics['test_accuracy']:.4f} < {target}"


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])
def test_ten_cuda_epochs_in_fp16_reach_the_accuracy_target(cuda, mnist_dir, tmp_path, engine):
    """``math: fp16`` (half GEMM and convolution operands, FP32 weights, optimiser, softmax and loss,
    dynamic loss scaling on the device) keeps the CNN's FP32 target of 99.2 %."""
    config_file = tmp_path / "mnist_cnn_fp16.yaml"
    config_file.write_text((REPO_ROOT / "configs" / "mnist_cnn.yaml").read_text() + "math: fp16\n")
    finished = train_cli(str(config_file), tmp_path / "run", mnist_dir, "--engine", engine, device="cuda")
    assert finished.returncode == 0, finished.stderr
    metrics = metrics_of(tmp_path / "run")
    assert metrics["epochs"] == 10 and metrics["math"] == "fp16" and metrics["engine"] == engine
    assert metrics["loss_scale"] > 0 and metrics["skipped_steps"] >= 0
    assert metrics["test_accuracy"] >= 0.992, f"mnist_cnn in fp16: {metrics['test_accuracy']:.4f} < 0.992"


@pytest.mark.slow
def test_cnn_one_host_epoch_reaches_97_5_percent(trained_cnn):
    metrics = metrics_of(trained_cnn)
    assert metrics["test_accuracy"] >= 0.975


@pytest.mark.slow
def test_outputs_are_written(trained_mlp):
    assert (trained_mlp / "model.npz").stat().st_size > 1_000_000
    history = (trained_mlp / "history.csv").read_text().splitlines()
    assert history[0].startswith("epoch,steps,learning_rate,train_loss,train_accuracy,test_loss,test_accuracy")
    assert len(history) == 2
    arrays, metadata = load_npz(trained_mlp / "model.npz")
    assert metadata["position"] == {"epoch": 1, "batch": 0, "step": 938}
    assert "optimizer.velocity.fc1.weight" in arrays


# ---- evaluation ----------------------------------------------------------------------------------
EVAL_COUNT, EVAL_BATCH, EVAL_CLASSES = 1037, 256, 10  # four full batches and one of 13


def evaluation_case(backend, loss_type) -> tuple[Network, np.ndarray, np.ndarray]:
    """A small untrained network ending in ``loss_type`` and a synthetic set of EVAL_COUNT samples."""
    rng = np.random.default_rng(7)
    images = rng.standard_normal((EVAL_COUNT, 1, 6, 6)).astype(np.float32)
    labels = rng.integers(0, EVAL_CLASSES, EVAL_COUNT)
    network = Network([Dense("fc1", 16), Activation("relu1", "relu"), Dense("fc2", EVAL_CLASSES), loss_type("out")],
                      backend=backend, seed=2, input_shape=(1, 6, 6))
    return network, images, labels


def per_batch_reference(network, images, labels) -> tuple[float, float, np.ndarray]:
    """(mean loss, accuracy, predictions) from ``network.forward`` batch by batch, as evaluation read
    them before: the loss and the hits computed with NumPy from each batch's output."""
    loss_sum, predictions = 0.0, []
    for start in range(0, len(labels), EVAL_BATCH):
        output = network.forward(images[start:start + EVAL_BATCH]).numpy().reshape(-1, EVAL_CLASSES)
        output, target = output.astype(np.float64), one_hot(labels[start:start + EVAL_BATCH], EVAL_CLASSES)
        if isinstance(network.loss_layer, Softmax):
            loss_sum -= np.sum(target * np.log(np.maximum(output, 1e-7)))
        else:
            loss_sum += 0.5 * np.sum((output - target) ** 2)
        predictions.append(output.argmax(axis=1))
    predictions = np.concatenate(predictions)
    return loss_sum / len(labels), np.count_nonzero(predictions == labels) / len(labels), predictions


@pytest.mark.parametrize("loss_type", [Softmax, MSE])
def test_evaluation_gives_the_loss_and_accuracy_of_the_per_batch_forward(backend, loss_type):
    network, images, labels = evaluation_case(backend, loss_type)
    expected_loss, expected_accuracy, expected_predictions = per_batch_reference(network, images, labels)
    test_set = ResidentTestSet(backend, images, labels, EVAL_CLASSES)
    from_host_arrays = evaluate(network, images, labels, EVAL_BATCH)
    from_resident_set = evaluate_batches(network, test_set.batches(EVAL_BATCH), test_set.count)
    with_predictions = evaluate(network, images, labels, EVAL_BATCH, keep_predictions=True)
    for result in (from_host_arrays, from_resident_set, with_predictions):
        assert result.loss == pytest.approx(expected_loss, rel=1e-5)
        assert result.accuracy == expected_accuracy
    assert from_host_arrays.predictions is None and from_resident_set.predictions is None
    np.testing.assert_array_equal(with_predictions.predictions, expected_predictions)
    assert 0 < expected_accuracy < 1


def test_evaluation_without_predictions_reads_no_batch_s_output(host, monkeypatch):
    """The fast engine's fused path never runs the loss layer's forward nor reads a batch's loss back."""
    network, images, labels = evaluation_case(host, Softmax)
    for name in ("forward", "loss"):
        monkeypatch.setattr(network.loss_layer, name, pytest.fail)
    with host.using_engine("fast"):
        result = evaluate(network, images, labels, EVAL_BATCH)
    assert np.isfinite(result.loss) and 0 < result.accuracy < 1


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])
def test_cuda_evaluation_synchronises_once(cuda, engine):
    """Five batches, their totals read once; the fast engine without cudnnSoftmaxForward (one fused
    launch a batch), the slides engine with it (and our loss and accuracy kernels)."""
    from cudnnnet.backends.cuda import bindings, kernel

    with cuda.using_engine(engine):
        network, images, labels = evaluation_case(cuda, Softmax)
        test_set = ResidentTestSet(cuda, images, labels, EVAL_CLASSES)
        evaluate_batches(network, test_set.batches(EVAL_BATCH), test_set.count)  # allocates, plans and compiles
        bindings.reset_calls()
        kernel.reset_launches()
        evaluate_batches(network, test_set.batches(EVAL_BATCH), test_set.count)
    if engine == "fast":
        assert kernel.launches["softmax_cross_entropy_backward"] == 5 and bindings.calls["cudnnSoftmaxForward"] == 0
    else:
        assert bindings.calls["cudnnSoftmaxForward"] == 5 and kernel.launches["cross_entropy_loss"] == 5
        assert kernel.launches["accuracy_count"] == 5 and set(kernel.launches) <= SLIDES_KERNELS
    assert bindings.calls["cudaStreamSynchronize"] == 1  # the totals, read once


def trainer(mnist_dir, output, steps, **overrides):
    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").with_overrides(
        steps=steps, device="host", data_dir=mnist_dir, **overrides)
    return Trainer(config, output, progress=False)


def test_an_interrupted_run_resumes_to_the_same_weights_as_an_uninterrupted_one(mnist_dir, tmp_path):
    straight = trainer(mnist_dir, tmp_path / "straight", steps=60)
    straight.run()
    resumed = interrupted_then_resumed(straight.config, tmp_path / "resumed", stop_after=25)
    interrupted = metrics_of(tmp_path / "resumed")
    assert interrupted["interrupted"] is True and interrupted["steps"] == 25
    assert interrupted["train_seconds"] > 0 and interrupted["images_per_second"] > 0  # the unfinished epoch counts
    resumed.run()
    for name, value in straight.network.state_dict().items():
        assert np.allclose(resumed.network.state_dict()[name], value, rtol=1e-5, atol=1e-7), name


def test_a_diverging_loss_stops_with_the_step_and_keeps_the_last_checkpoint(mnist_dir, tmp_path):
    good = trainer(mnist_dir, tmp_path, steps=20)
    good.run()
    saved = (tmp_path / "model.npz").read_bytes()
    config = good.config.to_dict()
    config["train"]["optimizer"]["lr"] = 1.0e6
    config["train"]["log_every"] = 5
    from cudnnnet.config.schema import parse_config

    diverging = Trainer(parse_config(config), tmp_path, progress=False, overwrite=True)
    with pytest.raises(TrainingError, match=r"loss became (nan|inf).* at step \d+"):
        diverging.run()
    assert (tmp_path / "model.npz").read_bytes() == saved


def watch_counts(watch) -> list[int]:
    return watch.numpy().reshape(-1).view(np.int32).tolist()


def test_record_nonfinite_counts_steps_and_keeps_the_first_non_finite_one(backend):
    watch = Tensor.from_numpy(np.array([5, 0], np.int32).view(np.float32), backend)
    for loss, expected in ((1.5, [6, 0]), (np.inf, [7, 7]), (2.0, [8, 7]), (np.nan, [9, 7])):
        backend.record_nonfinite(watch, Tensor.from_numpy(np.array([loss], np.float32), backend))
        assert watch_counts(watch) == expected


@pytest.mark.gpu
def test_record_nonfinite_counts_inside_a_replayed_cuda_graph(cuda):
    """The step counter lives on the device: each replay of the captured step counts once, and the
    replay that first sees a non-finite loss is the one recorded."""
    watch = Tensor.from_numpy(np.array([0, 0], np.int32).view(np.float32), cuda)
    loss = Tensor.from_numpy(np.array([0.5], np.float32), cuda)
    with cuda.capture() as graph:
        cuda.record_nonfinite(watch, loss)
    for _ in range(3):
        graph.launch()
    loss.write_(np.array([np.nan], np.float32))
    for _ in range(2):
        graph.launch()
    assert watch_counts(watch) == [5, 4]


def diverging_trainer(mnist_dir, output, log_every):
    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").with_overrides(
        steps=60, device="host", data_dir=mnist_dir).to_dict()
    config["train"]["optimizer"]["lr"] = 1.0e6
    config["train"]["log_every"] = log_every
    from cudnnnet.config.schema import parse_config

    return Trainer(parse_config(config), output, progress=False)


def test_a_non_finite_loss_names_the_step_it_first_appeared_not_where_it_was_checked(mnist_dir, tmp_path):
    """Checked every step, the loss first fails at step N; checked every 50 steps, the error still names N."""
    with pytest.raises(TrainingError) as every_step:
        diverging_trainer(mnist_dir, tmp_path / "a", log_every=1).run()
    first = int(re.search(r"at step (\d+)", str(every_step.value)).group(1))
    assert first < 50, "the loss must diverge before the first check every 50 steps: the test proves nothing"
    with pytest.raises(TrainingError, match=rf"at step {first} \(epoch 1, noticed at step 50\)"):
        diverging_trainer(mnist_dir, tmp_path / "b", log_every=50).run()


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_publishes_a_consistent_set_that_resumes_from_the_folder(mnist_dir, tmp_path, signum, code):
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), "--config",
               str(REPO_ROOT / "configs" / "mnist_mlp.yaml"), "--device", "host", "--data-dir", str(mnist_dir),
               "--output", str(tmp_path), "--epochs", "3", "--log-level", "INFO"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    for line in process.stderr:
        if "training" in line or time.monotonic() > deadline:
            break
    time.sleep(1.0)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    assert "interrupted" in stderr and f"--resume {tmp_path}" in stderr
    arrays, metadata = load_npz(tmp_path / "model.npz")
    assert metadata["position"]["step"] > 0
    assert metrics_of(tmp_path)["interrupted"] is True
    assert metrics_of(tmp_path)["steps"] == metadata["position"]["step"]
    resumed = train_cli("configs/mnist_mlp.yaml", tmp_path, mnist_dir, "--steps", str(metadata["position"]["step"] + 5),
                        "--resume", str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
    assert metrics_of(tmp_path)["steps"] == metadata["position"]["step"] + 5
    assert math.isfinite(metrics_of(tmp_path)["test_loss"])


@pytest.mark.gpu
@pytest.mark.parametrize("config, engine", [("mnist_mlp", "slides"), ("mnist_mlp", "fast"), ("mnist_cnn", "fast")])
def test_graph_replay_gives_the_same_weights_as_eager_steps(cuda, mnist_dir, tmp_path, config, engine):
    """115 steps (two epochs of 55, each ending in a short batch of 600, then 5) with the steps captured
    as CUDA graphs and replayed — the full batch's from step 2, the short batch's in the second epoch —
    and with every call made eagerly, end with the same weights. (The slides engine's
    convolutions take cuDNN's fastest algorithms, non-deterministic ones included: its CNN is not
    bit-reproducible, so its two runs would differ by their rounding, amplified over 60 steps.)"""
    finals = []
    for graph in (True, False):
        settings = load_config(REPO_ROOT / "configs" / f"{config}.yaml").to_dict()
        settings["train"].update(graph=graph, batch_size=1100, steps=115)
        settings["device"], settings["data"]["dir"], settings["engine"] = "cuda", str(mnist_dir), engine
        from cudnnnet.config.schema import parse_config

        run = Trainer(parse_config(settings), tmp_path / str(graph), progress=False)
        run.run()
        assert (run.graph is not None) == graph
        assert sorted(run.graphs) == ([600, 1100] if graph else [])
        finals.append(run.network.state_dict())
    for name, value in finals[0].items():
        assert np.allclose(finals[1][name], value, rtol=1e-4, atol=1e-6), name


@pytest.mark.gpu
def test_device_memory_does_not_grow_over_2000_training_steps(cuda, mnist_dir, tmp_path):
    settings = load_config(REPO_ROOT / "configs" / "mnist_cnn.yaml").to_dict()
    settings["train"].update(steps=2200, batch_size=64, log_every=500)
    settings["device"], settings["data"]["dir"] = "cuda", str(mnist_dir)
    from cudnnnet.config.schema import parse_config

    run = Trainer(parse_config(settings), tmp_path, progress=False)
    run.data.start_epoch(run.loader.permutation(0))
    last = run.loader.steps_per_epoch - 1  # the epoch's short last batch: buffers and plans of its own
    for index in list(range(200)) + [last, last]:  # warm up: every buffer, plan and both graphs exist afterwards
        run.train_batch(index)
    cuda.synchronize()
    free_before, _ = cuda.memory_info()
    for index in range(2000):
        run.train_batch(index % run.loader.steps_per_epoch)
    cuda.synchronize()
    free_after, _ = cuda.memory_info()
    assert free_before - free_after <= 2 << 20, f"device memory grew by {(free_before - free_after) >> 20} MiB"


@pytest.mark.gpu
def test_one_cnn_training_step_on_cuda_leaves_the_host_weights(cuda, host, mnist_dir, tmp_path):
    """One step of configs/mnist_cnn.yaml (momentum, weight decay, schedule) from the same seed and batch,
    run through cuBLAS, cuDNN and our kernels (the fast engine), ends within 1e-4 of the host backend's
    weights."""
    from cudnnnet.backends.cuda import bindings, kernel
    from cudnnnet.backends.cuda.gemm_convolution import GEMM_ALGORITHM
    from cudnnnet.config.schema import parse_config
    from cudnnnet.layers import Conv2D

    weights = {}
    for device in ("host", "cuda"):
        settings = load_config(REPO_ROOT / "configs" / "mnist_cnn.yaml").to_dict()
        settings["train"].update(steps=1, graph=False)
        settings["device"], settings["data"]["dir"], settings["engine"] = device, str(mnist_dir), "fast"
        run = Trainer(parse_config(settings), tmp_path / device, progress=False)
        run.data.start_epoch(run.loader.permutation(0))
        bindings.reset_calls()
        kernel.reset_launches()
        run.train_batch(0)
        weights[device] = run.network.state_dict()
    assert bindings.calls["cublasSgemv_v2"] > 0, "cublasSgemv_v2 was not called"
    # the dense layers' GEMMs run their plans: cublasSgemm or a cuBLASLt algorithm (maybe from the disk cache)
    assert bindings.calls["cublasSgemm_v2"] + bindings.calls["cublasLtMatmul"] > 0, "no dense GEMM ran"
    # the training step's softmax and loss are one launch of our kernel, not cudnnSoftmaxForward; its
    # ReLU gradients (relu1 and relu2 of the config) kernels/activation.cu, not cudnnActivationBackward
    assert kernel.launches["softmax_cross_entropy_backward"] == 1 and bindings.calls["cudnnSoftmaxForward"] == 0
    activation_launches = kernel.launches["activation_backward"] + kernel.launches["activation_backward_x4"]
    assert activation_launches >= 1 and bindings.calls["cudnnActivationBackward"] == 0
    # both 2×2, stride-2 max pooling layers take kernels/pooling.cu, not cudnnPoolingBackward
    assert kernel.launches["max_pooling_backward"] == 2 and bindings.calls["cudnnPoolingBackward"] == 0, \
        f"max_pooling_backward launches {kernel.launches['max_pooling_backward']}, cudnnPoolingBackward calls " \
        f"{bindings.calls['cudnnPoolingBackward']}"
    for layer in (layer for layer in run.network.layers if isinstance(layer, Conv2D)):
        for direction, call in (("forward", "cudnnConvolutionForward"), ("backward_filter", "cudnnConvolutionBackwardFilter"),
                                ("backward_data", "cudnnConvolutionBackwardData")):
            algorithm = getattr(layer.plan, direction)  # the plan's choice: cuDNN or our GEMM engine
            if algorithm.by_forward:  # backward data as a forward convolution of the flipped filter
                call = "cudnnConvolutionForward"
            calls = (bindings.calls["cublasSgemmStridedBatched"] + bindings.calls["cublasLtMatmul"]
                     if algorithm.algo == GEMM_ALGORITHM else bindings.calls[call])
            assert calls > 0, f"{layer.name} {direction}"
    for name, value in weights["host"].items():
        error = np.linalg.norm(weights["cuda"][name] - value) / np.linalg.norm(value)
        assert error < 1e-4, f"{name}: relative difference {error:.2e}"


@pytest.mark.gpu
def test_cnn_steps_replayed_as_a_cuda_graph_leave_the_host_weights(cuda, host, mnist_dir, tmp_path):
    """Three steps of configs/mnist_cnn.yaml with the graph on (the first eager, the second captured and
    launched, the third replayed) end within 1e-4 of three host steps from the same seed and batches."""
    from cudnnnet.config.schema import parse_config

    weights, runs = {}, {}
    for device in ("host", "cuda"):
        settings = load_config(REPO_ROOT / "configs" / "mnist_cnn.yaml").to_dict()
        settings["train"].update(steps=3, graph=True)
        settings["device"], settings["data"]["dir"] = device, str(mnist_dir)
        run = runs[device] = Trainer(parse_config(settings), tmp_path / device, progress=False)
        run.data.start_epoch(run.loader.permutation(0))
        for index in range(3):
            run.train_batch(index)
        weights[device] = run.network.state_dict()
    assert runs["cuda"].graph is not None, "the CUDA steps were not captured as a graph"
    for name, value in weights["host"].items():
        error = np.linalg.norm(weights["cuda"][name] - value) / np.linalg.norm(value)
        assert error < 1e-4, f"{name}: relative difference {error:.2e} after 3 steps (2 of them from the graph)"


def test_the_trainer_reads_the_data_on_a_thread_while_the_backend_loads(mnist_dir, tmp_path, monkeypatch):
    """get_backend (here: the host's) is called while local_splits runs, each on its own thread."""
    reading, loading = threading.Event(), threading.Event()
    read, get_backend = training.local_splits, training.get_backend
    seen = {}

    def local_splits(config):
        reading.set()
        seen["read on"], seen["read saw the backend load"] = threading.current_thread().name, loading.wait(10)
        return read(config)

    def backend_while_reading(name):
        loading.set()
        seen["backend saw the read"] = reading.wait(10)
        return get_backend(name)

    monkeypatch.setattr(training, "local_splits", local_splits)
    monkeypatch.setattr(training, "get_backend", backend_while_reading)
    settings = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").to_dict()
    settings["device"], settings["data"]["dir"] = "host", str(mnist_dir)
    from cudnnnet.config.schema import parse_config

    run = Trainer(parse_config(settings), tmp_path, progress=False)
    assert seen == {"read on": "cudnnnet-local_splits", "read saw the backend load": True, "backend saw the read": True}
    assert run.train_images.shape == (60000, 1, 28, 28) and run.test_labels.shape == (10000,)


def test_an_image_limit_keeps_the_first_images_of_each_split(mnist_dir, tmp_path):
    limited = trainer(mnist_dir, tmp_path, steps=1)
    full_train, full_test = limited.train_pixels.pixels, limited.test_pixels.pixels
    config = limited.config
    run = Trainer(config, tmp_path / "limited", progress=False, image_limit=300)
    assert np.array_equal(run.train_pixels.pixels, full_train[:300]) and len(run.train_labels) == 300
    assert np.array_equal(run.test_pixels.pixels, full_test[:300]) and len(run.test_labels) == 300
    assert run.loader.num_samples == 300 and run.test_set.count == 300


@pytest.mark.parametrize("device", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_resident_sets_are_made_from_their_bytes_and_equal_the_float_images(device, mnist_dir, tmp_path, request):
    """A resident training and test set are made by the backend from the uint8 pixels (the trainer
    never asks PixelImages for its floats), and it holds the very floats load_split gives."""
    if device == "cuda":
        request.getfixturevalue("cuda")
    settings = load_config(REPO_ROOT / "configs" / "lenet5.yaml").to_dict()  # padded and normalised
    settings["device"], settings["data"]["dir"], settings["data"]["placement"] = device, str(mnist_dir), "device"
    from cudnnnet.config.schema import parse_config

    config = parse_config(settings)
    run = Trainer(config, tmp_path, progress=False)
    assert "floats" not in vars(run.train_pixels) and "floats" not in vars(run.test_pixels)
    assert np.array_equal(run.data.images.numpy(), training.load_split(config, "train")[0])
    assert np.array_equal(run.test_set.images.numpy(), training.load_split(config, "test")[0])


# ---- the BatchNorm CNN: AdamW, BatchNorm, dropout --------------------------------------------------
def bn_cnn_settings(mnist_dir, device, steps, **train):
    """configs/mnist_bn_cnn.yaml as a mapping, shortened to ``steps`` on ``device``."""
    settings = load_config(REPO_ROOT / "configs" / "mnist_bn_cnn.yaml").to_dict()
    settings["train"].update(steps=steps, **train)
    settings["device"], settings["data"]["dir"] = device, str(mnist_dir)
    return settings


def test_a_bn_cnn_run_resumes_to_the_same_weights_and_running_statistics(mnist_dir, tmp_path):
    """AdamW's moments and step, BatchNorm's running statistics and the dropout masks survive an
    interruption."""
    from cudnnnet.config.schema import parse_config

    config = parse_config(bn_cnn_settings(mnist_dir, "host", 12, batch_size=32))
    straight = Trainer(config, tmp_path / "straight", progress=False)
    straight.run()
    resumed = interrupted_then_resumed(config, tmp_path / "resumed", stop_after=5)
    assert resumed.optimizer.counter.numpy().reshape(-1)[0] == 5
    resumed.run()
    final = resumed.network.state_dict()
    assert "bn1.running_var" in final and "optimizer.m.conv1.weight" in load_npz(tmp_path / "resumed" / "model.npz")[0]
    for name, value in straight.network.state_dict().items():
        assert np.allclose(final[name], value, rtol=1e-4, atol=1e-6), name


def dropout_settings(root, device: str, steps: int) -> dict:
    """An MLP with dropout on ``small_npz``'s 100 images (4 steps of 32 an epoch, the last of 4)."""
    return {"model": [{"type": "dense", "out_size": 64}, {"type": "activation", "mode": "relu"},
                      {"type": "dropout", "rate": 0.5}, {"type": "dense", "out_size": 10}, {"type": "softmax"}],
            "data": {"dataset": "npz", "train_file": str(root / "train.npz"), "test_file": str(root / "test.npz"),
                     "normalize": "computed"},
            "train": {"batch_size": 32, "steps": steps, "seed": 4, "log_every": 1000, "checkpoint_every": "never",
                      "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}},
            "device": device}


def next_epoch(trainer) -> None:
    """One whole epoch (``train_epoch``), then on to the next, as a caller training epoch by epoch does."""
    trainer.train_epoch()
    trainer.position.epoch, trainer.position.batch = trainer.position.epoch + 1, 0


def test_two_trainers_train_interleaved_each_as_it_trains_alone(backend, small_npz, tmp_path):
    """A Trainer's math and engine are its network's, not the backend's: made one after the other and
    trained epoch by epoch in turn, a slides/fp32 and a fast/bf16 run each end with the weights of the
    run alone (before, the second Trainer made set the whole backend to bf16 for both)."""
    from cudnnnet.config.schema import parse_config

    configs = {"exact": {"math": "fp32", "engine": "slides"}, "fast": {"math": "bf16", "engine": "fast"}}
    configs = {key: parse_config({**dropout_settings(small_npz, backend.name, 8), **settings})
               for key, settings in configs.items()}
    alone = {}
    for key, config in configs.items():
        trainer = Trainer(config, tmp_path / f"alone-{key}", progress=False)
        next_epoch(trainer)
        next_epoch(trainer)
        alone[key] = trainer.network.state_dict()
    together = {key: Trainer(config, tmp_path / f"together-{key}", progress=False) for key, config in configs.items()}
    for _ in range(2):
        for trainer in together.values():
            next_epoch(trainer)
    for key, weights in alone.items():
        found = together[key].network.state_dict()
        for name, value in weights.items():
            np.testing.assert_allclose(found[name], value, rtol=1e-6, atol=1e-7, err_msg=f"{key} {name}")
    assert max(float(np.max(np.abs(alone["exact"][name] - alone["fast"][name]))) for name in alone["exact"]) > 1e-4


def test_a_resumed_run_draws_the_dropout_masks_of_an_uninterrupted_one(backend, small_npz, tmp_path):
    """Stopped after step 6 (the second epoch's third batch, after a short last batch), then resumed:
    the dropout generator skips the masks of the six steps, so the weights end as the uninterrupted
    run's; on CUDA, with the full steps replayed from a captured graph."""
    from cudnnnet.config.schema import parse_config

    config = parse_config(dropout_settings(small_npz, backend.name, 12))
    straight = Trainer(config, tmp_path / "straight", progress=False)
    straight.run()
    resumed = interrupted_then_resumed(config, tmp_path / "resumed", stop_after=6)
    assert (resumed.position.epoch, resumed.position.batch) == (1, 2)
    resumed.run()
    for name, value in straight.network.state_dict().items():
        np.testing.assert_allclose(resumed.network.state_dict()[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_trainer_trains_in_its_config_s_math_and_engine_and_leaves_the_backend_s_as_they_were(backend, small_npz,
                                                                                                   tmp_path, monkeypatch):
    """The math and engine are settings of the whole backend: a bf16 Trainer left them set after its run, so
    a network loaded afterwards in the same process computed in bf16."""
    from cudnnnet.config.schema import parse_config

    settings = {**dropout_settings(small_npz, backend.name, 6), "math": "bf16", "engine": "fast"}
    backend.set_math("fp32")
    with backend.using_engine("slides"):
        trainer = Trainer(parse_config(settings), tmp_path / "run", progress=False)
        seen = []
        train_epoch = trainer.train_epoch
        monkeypatch.setattr(trainer, "train_epoch", lambda: (seen.append((backend.math, backend.engine.name)),
                                                             train_epoch())[1])
        trainer.run()
        assert seen == [("bf16", "fast")] * 2
        assert (backend.math, backend.engine.name) == ("fp32", "slides")


@pytest.mark.parametrize("batch_size, mode, refused", [
    (1, "auto", "train.batch_size is 1"), (33, "auto", "the epoch's last batch holds 1 of its 100 training images"),
    (33, "spatial", "the epoch's last batch holds 1"), (32, "auto", None), (1, "spatial", "train.batch_size is 1")])
def test_a_batch_norm_over_one_value_is_refused_before_training(host, small_npz, tmp_path, batch_size, mode, refused):
    """batch_size 1 through a BatchNorm after a Dense trained nothing before it (x̂ = 0, so y = β and no
    gradient), silently: 5.9 % on MNIST after 2000 steps; 100 images in batches of 33 left one such step an
    epoch. A BatchNorm over 1×1 planes ('spatial') is the same."""
    from cudnnnet.config.schema import parse_config

    settings = dropout_settings(small_npz, "host", 2)
    settings["model"][1:1] = [{"type": "batchnorm", "name": "bn", "mode": mode}]
    settings["train"]["batch_size"] = batch_size
    if refused is None:
        Trainer(parse_config(settings), tmp_path / "run", progress=False)
        return
    with pytest.raises(ConfigError, match=rf"^<dict>: model\[1\] \(batchnorm 'bn'\): {refused}.* choose a "
                                          rf"train\.batch_size that leaves at least 2 images in every batch$"):
        Trainer(parse_config(settings), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_trainer_refuses_to_resume_a_checkpoint_of_another_model(host, small_npz, tmp_path):
    """cudnnnet-train refused it; the Trainer itself resumed a changed dropout rate or activation silently."""
    from cudnnnet.config.schema import parse_config

    settings = dropout_settings(small_npz, "host", 2)
    Trainer(parse_config(settings), tmp_path / "first", progress=False).run()
    settings["model"][2]["rate"] = 0.2
    with pytest.raises(CheckpointError, match=r"first/model\.npz: trained with a different model than <dict>: model\[2\] "
                                              r"is dropout 'dropout1' \(rate=0\.5\) in the checkpoint, dropout "
                                              r"'dropout1' \(rate=0\.2\) in the config$"):
        Trainer(parse_config({**settings, "train": {**settings["train"], "steps": 4}}), tmp_path / "second",
                resume=tmp_path / "first", progress=False)
    assert not (tmp_path / "second").exists()


@pytest.mark.gpu
def test_bn_cnn_graph_replay_gives_the_same_weights_as_eager_steps(cuda, mnist_dir, tmp_path):
    """60 steps of the BatchNorm CNN (AdamW, dropout) replayed from a captured graph and made eagerly
    end alike: the replays follow Adam's step count and the warm-up, and draw the dropout masks the
    eager calls draw (cuDNN advances the same states buffer either way). In the fast engine, whose
    convolution algorithms are deterministic: the slides engine's need not be bit-reproducible."""
    from cudnnnet.config.schema import parse_config

    finals = []
    for graph in (True, False):
        settings = bn_cnn_settings(mnist_dir, "cuda", 60, graph=graph, batch_size=1100)
        settings["engine"] = "fast"
        run = Trainer(parse_config(settings), tmp_path / str(graph), progress=False)
        run.run()
        assert (run.graph is not None) == graph
        assert run.optimizer.counter.numpy().reshape(-1).tolist() == [60.0, 0.0]
        finals.append(run.network.state_dict())
    for name, value in finals[0].items():
        assert np.allclose(finals[1][name], value, rtol=1e-3, atol=1e-5), name


# ---- resuming an image folder: the geometry it was trained with ----------------------------------


def _folder_config(root, resize):
    from PIL import Image

    from cudnnnet.config.schema import parse_config

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for index in range(2):
                photo = rng.integers(0, 256, (10, 16, 3), dtype=np.uint8)
                Image.fromarray(photo).save(root / split / name / f"{index}.png")
    raw = load_config(REPO_ROOT / "configs" / "image_folder.yaml").to_dict()
    raw["data"].update(dir=str(root), image_size=[8, 8], resize=resize, augment=False)
    raw["train"].update(epochs=1, batch_size=4)
    raw["device"] = "host"
    return parse_config(raw, source="<folder>")


def test_resuming_an_image_folder_run_with_another_resize_is_refused_and_an_old_checkpoint_reads_as_stretch(tmp_path):
    from cudnnnet.io.checkpoint import save_npz
    from cudnnnet.errors import CheckpointError

    Trainer(_folder_config(tmp_path / "photos", "crop"), tmp_path / "run", progress=False).run()
    checkpoint = tmp_path / "run" / "model.npz"
    with pytest.raises(CheckpointError, match=r"model.npz was trained on images fitted to data.image_size by "
                                              r"data.resize: crop, and this run asks for stretch: resume with "
                                              r"data.resize: crop"):
        Trainer(_folder_config(tmp_path / "photos", "stretch"), tmp_path / "again", resume=checkpoint, progress=False)
    Trainer(_folder_config(tmp_path / "photos", "crop"), tmp_path / "same", resume=checkpoint, progress=False)
    arrays, metadata = load_npz(checkpoint)
    del metadata["config"]["data"]["resize"]  # as a version before the key wrote it: images were stretched
    save_npz(checkpoint, arrays, metadata)
    with pytest.raises(CheckpointError, match=r"by data.resize: stretch, and this run asks for crop"):
        Trainer(_folder_config(tmp_path / "photos", "crop"), tmp_path / "old", resume=checkpoint, progress=False)
    Trainer(_folder_config(tmp_path / "photos", "stretch"), tmp_path / "old-stretched", resume=checkpoint,
            progress=False)


@pytest.mark.parametrize("layer, refused", [
    ({"type": "conv2d", "out_channels": 4, "kernel_size": 9},
     r"model\[0\] \(conv2d\): layer 'conv2d1': kernel 9 \(span 9 with dilation 1\) is larger than its padded input 8×8"),
    ({"type": "dense", "out_size": 2**30},
     r"model\[0\] \(dense\): layer 'dense1': its weight of shape \(1073741824, 192, 1, 1\) would hold \d+ values.*; "
     r"make the model or train\.batch_size / train\.eval_batch_size smaller$"),
])
def test_a_model_that_does_not_fit_the_datas_images_is_refused_naming_the_config_and_the_layer(small_npz, tmp_path, layer,
                                                                                                  refused):
    """An npz set's shape is known once it is read: the Trainer then checks the model as cudnnnet-train checks one
    whose shape the config says (a bare ShapeError or ModelSizeError without the file or the key before)."""
    from cudnnnet.config.schema import parse_config

    settings = {"model": [layer, {"type": "dense", "out_size": 10}, {"type": "softmax"}],
                "data": {"dataset": "npz", "train_file": str(small_npz / "train.npz"),
                         "test_file": str(small_npz / "test.npz")},
                "train": {"optimizer": {"lr": 0.1}}, "device": "host"}
    with pytest.raises(ConfigError, match=rf"^small\.yaml: {refused}"):
        Trainer(parse_config(settings, source="small.yaml"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_trainer_refuses_to_resume_a_checkpoint_without_its_training_config(host, small_npz, tmp_path):
    """cudnnnet-train refused it; the Trainer resumed it without knowing which model it was trained with."""
    from cudnnnet.io.checkpoint import save_npz
    from cudnnnet.config.schema import parse_config

    settings = dropout_settings(small_npz, "host", 2)
    Trainer(parse_config(settings), tmp_path / "first", progress=False).run()
    arrays, metadata = load_npz(tmp_path / "first" / "model.npz")
    save_npz(tmp_path / "no_config.npz", arrays, {key: value for key, value in metadata.items() if key != "config"})
    with pytest.raises(CheckpointError, match=r"no_config\.npz: no training config in its metadata; it can be loaded "
                                              r"but not resumed$"):
        Trainer(parse_config({**settings, "train": {**settings["train"], "steps": 4}}), tmp_path / "second",
                resume=tmp_path / "no_config.npz", progress=False)
