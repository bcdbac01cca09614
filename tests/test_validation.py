"""data.validation, best.npz and early stopping (issue 31, items 1 and 2), on small synthetic data."""

import json
import signal

import numpy as np
import pytest

from cudnnnet.io.checkpoint import load_npz, save_npz
from cudnnnet.config.schema import parse_config
from cudnnnet.errors import ConfigError, DataError
from cudnnnet.train.evaluation import Evaluation
from cudnnnet.train.trainer import Interrupted, Trainer, load_data
from run_helpers import offline_tools


def settings(root, validation=0.2, epochs=3, **train) -> dict:
    """An MLP on ``small_npz``'s 100 8×8 RGB images; with validation 0.2, 80 train in 4 steps of 20 an epoch."""
    return {"model": [{"type": "dense", "out_size": 16}, {"type": "activation", "mode": "relu"},
                      {"type": "dense", "out_size": 10}, {"type": "softmax"}],
            "data": {"dataset": "npz", "train_file": str(root / "train.npz"), "test_file": str(root / "test.npz"),
                     "normalize": "computed", "validation": validation},
            "train": {"batch_size": 20, "epochs": epochs, "log_every": 1000, "optimizer": {"lr": 0.1}, **train},
            "device": "host"}


def scripted(monkeypatch, losses):
    """Each epoch's validation (or, without one, test) loss from ``losses`` in turn; the end's test set evaluated
    for real. Returns the list of sets evaluated ("validation" / "test")."""
    script, evaluated = iter(losses), []
    real = Trainer._evaluate

    def evaluate(trainer, validation=False):
        evaluated.append("validation" if validation else "test")
        if validation or not trainer.validating:
            return Evaluation(next(script), 0.5)
        return real(trainer, validation)

    monkeypatch.setattr(Trainer, "_evaluate", evaluate)
    return evaluated


# ---- the config ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value, message", [
    (0, "data.validation: expected a number in (0, 1), got 0"),
    (1.5, "data.validation: expected a number in (0, 1), got 1.5"),
    (True, "data.validation: expected a fraction of the training set in (0, 1) or the path of an .npz file"),
    ([0.1], "data.validation: expected a fraction"),
])
def test_a_bad_validation_is_one_line(small_npz, value, message):
    with pytest.raises(ConfigError, match=r"^<dict>: " + message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(settings(small_npz, validation=value))


@pytest.mark.parametrize("validation, train, message", [
    (None, {"monitor": "validation_loss"}, "train.monitor: validation_loss needs data.validation"),
    (0.2, {"monitor": "test_accuracy"}, "train.monitor: with data.validation the test set is evaluated once"),
    (0.2, {"monitor": "val_loss"}, "train.monitor: expected one of auto, validation_loss,"),
    (0.2, {"early_stopping": {"patience": 0}}, "train.early_stopping.patience: expected an integer >= 1, got 0"),
    (0.2, {"early_stopping": {"patience": 2, "min_delta": -1}}, "train.early_stopping.min_delta: expected a number >= 0"),
    (0.2, {"early_stopping": {"patience": 2, "delta": 1}}, "train.early_stopping.delta: unknown key 'delta'"),
    (0.2, {"early_stopping": 3}, "train.early_stopping: expected false or a mapping {patience: P, min_delta: D}"),
])
def test_a_bad_monitor_or_early_stopping_is_one_line(small_npz, validation, train, message):
    with pytest.raises(ConfigError) as refused:
        parse_config(settings(small_npz, validation=validation, **train))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_validation_survives_the_config_s_round_trip(small_npz):
    config = parse_config(settings(small_npz, monitor="validation_accuracy", early_stopping={"patience": 2}))
    assert parse_config(config.to_dict()) == config
    assert "validation" not in parse_config(settings(small_npz, validation=None)).to_dict()["data"]


# ---- the split ------------------------------------------------------------------------------------


def test_a_seeded_share_is_held_out_of_the_training_set_before_its_statistics(small_npz):
    config, (train, train_labels), (test, _), (held, held_labels) = load_data(parse_config(settings(small_npz)))
    again = load_data(parse_config(settings(small_npz)))[3]
    other_seed = settings(small_npz)
    other_seed["data"]["split_seed"] = 1
    moved = load_data(parse_config(other_seed))[3]
    everything = np.load(small_npz / "train.npz")["x"]
    assert (len(train_labels), len(held_labels)) == (80, 20) and len(test.pixels) == 20
    assert np.array_equal(held.pixels, again[0].pixels) and not np.array_equal(held.pixels, moved[0].pixels)
    rows = {image.tobytes() for image in everything}
    assert {image.tobytes() for image in train.pixels} | {image.tobytes() for image in held.pixels} == rows
    assert not {image.tobytes() for image in train.pixels} & {image.tobytes() for image in held.pixels}
    mean = config.data.normalize[0]
    assert np.allclose(mean, train.pixels.mean(axis=(0, 2, 3)) / 255, atol=1e-6)  # the training images' alone
    assert held.normalize == train.normalize == config.data.normalize


def test_a_validation_file_is_read_and_checked(small_npz, tmp_path):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "val.npz", x=rng.integers(0, 256, (7, 3, 8, 8), dtype=np.uint8), y=rng.integers(0, 10, 7))
    _, (_, train_labels), _, (held, held_labels) = load_data(parse_config(settings(small_npz, str(tmp_path / "val.npz"))))
    assert len(train_labels) == 100 and len(held_labels) == 7
    np.savez(tmp_path / "small.npz", x=rng.integers(0, 256, (7, 3, 4, 4), dtype=np.uint8), y=rng.integers(0, 10, 7))
    with pytest.raises(DataError, match=r"small.npz: its images are \(3, 4, 4\), the training images \(3, 8, 8\)"):
        load_data(parse_config(settings(small_npz, str(tmp_path / "small.npz"))))
    with pytest.raises(DataError, match=r"absent.npz: no such file or folder"):
        load_data(parse_config(settings(small_npz, str(tmp_path / "absent.npz"))))


# ---- a run with a validation set ---------------------------------------------------------------


def test_each_epoch_is_evaluated_on_the_validation_set_and_the_test_set_once_at_the_end(small_npz, tmp_path,
                                                                                         monkeypatch):
    evaluated = scripted(monkeypatch, [1.0, 0.8, 0.9])
    trainer = Trainer(parse_config(settings(small_npz)), tmp_path / "run", progress=False)
    metrics = trainer.run()
    assert evaluated == ["validation"] * 3 + ["test"]
    header = (tmp_path / "run" / "history.csv").read_text().splitlines()[0]
    assert header == ("epoch,steps,learning_rate,train_loss,train_accuracy,validation_loss,validation_accuracy,"
                      "epoch_seconds")
    assert metrics["validation_loss"] == 0.9 and metrics["validation_images"] == 20
    assert metrics["test_loss"] == trainer.final_test.loss and np.isfinite(metrics["test_loss"])
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["best"] == {
        "monitor": "validation_loss", "value": 0.8, "epoch": 2, "step": 8, "checkpoint": "best.npz"}


def test_best_npz_holds_the_weights_of_the_best_epoch_and_loads_as_a_model(small_npz, tmp_path, monkeypatch):
    from cudnnnet import Network

    scripted(monkeypatch, [1.0, 0.7, 0.9])
    trainer = Trainer(parse_config(settings(small_npz)), tmp_path / "run", progress=False)
    after_epoch = []
    end_epoch = trainer._end_epoch
    monkeypatch.setattr(trainer, "_end_epoch", lambda *args, **kwargs: (
        after_epoch.append(trainer.network.state_dict()), end_epoch(*args, **kwargs)))
    trainer.run()
    arrays, metadata = load_npz(tmp_path / "run" / "best.npz")
    assert metadata["best"] == {"monitor": "validation_loss", "value": 0.7, "epoch": 2, "step": 8}
    assert all(np.array_equal(arrays[name], value) for name, value in after_epoch[1].items())
    assert not np.array_equal(arrays["dense1.weight"], after_epoch[2]["dense1.weight"])
    assert Network.load(tmp_path / "run" / "best.npz").training_config.data.validation == 0.2


def test_without_validation_rows_stay_test_figures_and_best_npz_follows_the_test_loss(small_npz, tmp_path,
                                                                                       monkeypatch):
    evaluated = scripted(monkeypatch, [1.0, 0.5, 0.9])
    metrics = Trainer(parse_config(settings(small_npz, validation=None)), tmp_path / "run", progress=False).run()
    assert evaluated == ["test"] * 3
    assert "test_loss,test_accuracy" in (tmp_path / "run" / "history.csv").read_text().splitlines()[0]
    assert metrics["test_loss"] == 0.9 and "validation_loss" not in metrics
    assert metrics["best"]["monitor"] == "test_loss" and metrics["best"]["epoch"] == 2
    assert load_npz(tmp_path / "run" / "best.npz")[1]["best"]["epoch"] == 2


@pytest.mark.parametrize("losses, min_delta, stopped, best", [
    ([1.0, 0.9, 0.95, 0.96, 0.97, 0.98], 0.0, 4, 2),  # two epochs without a better loss after epoch 2
    ([1.0, 0.99, 0.98, 0.97, 0.96, 0.95], 0.05, 3, 3),  # better, never by more than min_delta: the best still moves
    ([1.0, 0.9, 0.8, 0.7, 0.6, 0.5], 0.0, None, 6),
])
def test_early_stopping_ends_the_run_after_patience_epochs_without_improvement(small_npz, tmp_path, monkeypatch,
                                                                               losses, min_delta, stopped, best):
    scripted(monkeypatch, losses)
    config = parse_config(settings(small_npz, epochs=6, early_stopping={"patience": 2, "min_delta": min_delta}))
    metrics = Trainer(config, tmp_path / "run", progress=False).run()
    assert metrics["steps"] == 4 * (stopped or 6)
    assert metrics["early_stopping"] == {"patience": 2, "min_delta": min_delta, "monitor": "validation_loss",
                                         "wait": 2 if stopped else 0, "stopped": stopped is not None,
                                         "stopped_epoch": stopped}
    assert metrics["best"]["epoch"] == load_npz(tmp_path / "run" / "best.npz")[1]["best"]["epoch"] == best
    assert np.isfinite(metrics["test_loss"])


class RankStandIn:
    """The Replicas of one rank of two, without a GPU: the epoch totals already averaged, no signal, and
    ``agreed`` answering from ``decisions`` (rank 0's early stops, one an epoch) or, on rank 0, its own flag."""

    def __init__(self, rank, decisions=None):
        self.rank, self.decisions, self.flags = rank, decisions, []

    writes = property(lambda self: self.rank == 0)

    world_size = 2

    def average(self, tensor):
        pass

    def layer_done(self, layer):
        pass

    def average_gradients(self):
        pass

    def agreed_stop(self, signum):
        return None

    def agreed(self, flag):
        self.flags.append(flag)
        return flag if self.decisions is None else self.decisions[len(self.flags) - 1]

    def finish(self, graphs=(), exit_code=0):
        pass


@pytest.mark.parametrize("rank", [0, 1])
def test_on_several_ranks_every_rank_stops_after_the_epoch_rank_0_s_monitor_stops_at(small_npz, tmp_path,
                                                                                     monkeypatch, rank):
    """Rank 0 evaluates and counts the patience; each epoch its decision goes to every rank (``agreed``),
    so rank 1, whose monitor never sees a figure, stops after the same epoch."""
    scripted(monkeypatch, [1.0, 0.9, 0.95, 0.96, 0.97, 0.98])
    config = parse_config(settings(small_npz, epochs=6, early_stopping={"patience": 2}))
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.replicas = RankStandIn(rank, None if rank == 0 else [False, False, False, True, False, False])
    trainer.run()
    assert trainer.position.step == 4 * 4 and trainer.position.epoch == 4
    assert trainer.replicas.flags == ([False, False, False, True] if rank == 0 else [False] * 4)
    assert trainer.monitor.should_stop == (rank == 0)


# ---- resuming -----------------------------------------------------------------------------------




def test_the_best_epoch_and_the_patience_counter_survive_resume(small_npz, tmp_path, monkeypatch):
    losses = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    config = parse_config(settings(small_npz, epochs=6, early_stopping={"patience": 3}, checkpoint_every=1))
    scripted(monkeypatch, losses)
    straight = Trainer(config, tmp_path / "straight", progress=False).run()
    scripted(monkeypatch, losses)
    first = Trainer(config, tmp_path / "run", progress=False)
    train_batch = first.train_batch

    def stop_in_epoch_three(index):
        size = train_batch(index)
        if first.position.step == 2 * 4:  # during the first step of epoch 3: epochs 1 and 2 evaluated
            first.stop_signal = signal.SIGINT
        return size

    first.train_batch = stop_in_epoch_three
    with pytest.raises(Interrupted):
        first.run()
    best_before = load_npz(tmp_path / "run" / "best.npz")[0]
    scripted(monkeypatch, losses[2:])
    resumed = Trainer(config, tmp_path / "run", resume=tmp_path / "run", progress=False)
    assert (resumed.monitor.wait, resumed.monitor.best["epoch"]) == (1, 1)
    assert all(np.array_equal(resumed.monitor.best_arrays[name], value) for name, value in best_before.items())
    metrics = resumed.run()
    assert metrics["steps"] == straight["steps"] == 4 * 4  # stopped after epoch 4 both times
    assert metrics["early_stopping"] == straight["early_stopping"] and metrics["best"] == straight["best"]


def test_a_checkpoint_from_before_the_monitor_resumes_with_a_fresh_one(small_npz, tmp_path, monkeypatch):
    config = parse_config(settings(small_npz, epochs=3, early_stopping={"patience": 1}))
    scripted(monkeypatch, [1.0, 2.0])
    run = Trainer(parse_config(settings(small_npz, epochs=2, early_stopping={"patience": 1})), tmp_path / "run",
                  progress=False)
    run.run()
    assert run.monitor.should_stop
    arrays, metadata = load_npz(tmp_path / "run" / "model.npz")
    del metadata["monitor"]
    old = tmp_path / "old" / "model.npz"
    old.parent.mkdir()
    save_npz(old, arrays, metadata)
    scripted(monkeypatch, [0.5])
    resumed = Trainer(config, tmp_path / "resumed", resume=old, progress=False)
    assert (resumed.monitor.wait, resumed.monitor.best) == (0, None)
    assert resumed.run()["best"]["epoch"] == 3


def test_resuming_a_run_that_stopped_early_names_the_patience(small_npz, tmp_path, monkeypatch):
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings(small_npz, epochs=5, early_stopping={"patience": 1})))
    scripted(monkeypatch, [1.0, 2.0, 0.1, 0.2, 0.3])
    with offline_tools(tmp_path) as call:
        first = call("train", "--config", path, "--output", tmp_path / "run")
        assert first.returncode == 0, first.stderr
        assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 8
        again = call("train", "--config", path, "--output", tmp_path / "run", "--resume", tmp_path / "run")
        assert again.returncode == 2
        assert again.stderr.splitlines() == [
            f"cudnnnet-train: error: {tmp_path / 'run'} stopped early: validation_loss did not improve for 1 epochs; "
            f"to train on, raise its patience (--set train.early_stopping.patience=2) or remove train.early_stopping"]
        more = call("train", "--config", path, "--output", tmp_path / "run", "--resume", tmp_path / "run",
                    "--set", "train.early_stopping.patience=3")
    assert more.returncode == 0, more.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["best"]["epoch"] == 3


def test_a_run_without_validation_does_not_resume_with_one(small_npz, tmp_path):
    from cudnnnet.errors import CheckpointError

    Trainer(parse_config(settings(small_npz, validation=None, epochs=1)), tmp_path / "run", progress=False).run()
    with pytest.raises(CheckpointError, match="was trained without data.validation; resume it without"):
        Trainer(parse_config(settings(small_npz, epochs=2)), tmp_path / "run", resume=tmp_path / "run",
                progress=False)


def write_folder(root, classes, count, seed):
    """``count`` 8×8 RGB PNGs in root/<class>/ for each class."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True)
        for index in range(count):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB").save(root / name / f"{index}.png")
    return root


def test_an_image_folder_validates_on_a_folder_of_its_classes(tmp_path):
    write_folder(tmp_path / "photos", ("cat", "dog"), 5, 0)
    write_folder(tmp_path / "val", ("dog",), 3, 1)
    raw = {"model": [{"type": "dense", "out_size": 2}, {"type": "softmax"}],
           "data": {"dataset": "image-folder", "dir": str(tmp_path / "photos"), "validation": str(tmp_path / "val")},
           "train": {"optimizer": {"lr": 0.1}}, "device": "host"}
    config, (train, _), _, (held, held_labels) = load_data(parse_config(raw))
    assert held.pixels.shape == (3,) + train.pixels.shape[1:] and held_labels.tolist() == [1, 1, 1]
    write_folder(tmp_path / "val", ("bird",), 1, 2)
    with pytest.raises(DataError, match=r"val: class folder 'bird' is no training class; the classes are cat, dog"):
        load_data(parse_config(raw))


def test_the_validation_set_resident_on_the_device_gives_the_host_s_figures(backend, small_npz, tmp_path):
    """On CUDA both evaluated sets are resident on the device; their figures are the host evaluation's of the
    same weights."""
    from cudnnnet.train.evaluation import evaluate

    config = parse_config({**settings(small_npz, epochs=1), "device": backend.name})
    trainer = Trainer(config, tmp_path / "run", progress=False)
    metrics = trainer.run()
    host_weights = trainer.network.state_dict()
    reference = Trainer(parse_config(settings(small_npz, epochs=1)), tmp_path / "host", progress=False)
    reference.network.load_state_dict(host_weights)
    pixels, labels = reference.validation
    expected = evaluate(reference.network, pixels.floats, labels, 1000)
    assert metrics["validation_loss"] == pytest.approx(expected.loss, rel=1e-4)
    assert metrics["validation_accuracy"] == pytest.approx(expected.accuracy)
    test = evaluate(reference.network, reference.test_pixels.floats, reference.test_labels, 1000)
    assert metrics["test_loss"] == pytest.approx(test.loss, rel=1e-4)
