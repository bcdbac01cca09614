"""Progress lines where no bar is drawn, the TensorBoard event log and the learning-rate curve (issue 31, item 4)."""

import logging
import re
import struct
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

from cudnnnet.config.schema import parse_config
from cudnnnet.train.trainer import Trainer
from run_helpers import offline_tools


def settings(root, **train) -> dict:
    """An MLP on ``small_npz``'s 100 8×8 RGB images, a fifth held out: 4 steps of 20 an epoch, 2 epochs."""
    return {"model": [{"type": "dense", "out_size": 16}, {"type": "activation", "mode": "relu"},
                      {"type": "dense", "out_size": 10}, {"type": "softmax"}],
            "data": {"dataset": "npz", "train_file": str(root / "train.npz"), "test_file": str(root / "test.npz"),
                     "validation": 0.2},
            "train": {"batch_size": 20, "epochs": 2, "log_every": 2, "optimizer": {"lr": 0.1},
                      "schedule": {"name": "cosine", "warmup_steps": 3}, **train},
            "device": "host"}


class Recorder:
    """A stand-in for live_log.TensorBoardLog: every scalar by tag, and whether it was closed."""

    def __init__(self):
        self.values, self.closed = {}, False

    def scalars(self, step, values):
        assert not self.closed
        for tag, value in values.items():
            self.values.setdefault(tag, []).append((step, value))

    def close(self):
        self.closed = True


def test_a_progress_line_every_log_every_steps(small_npz, tmp_path, caplog):
    trainer = Trainer(parse_config(settings(small_npz)), tmp_path / "run", progress=False, log_lines=True)
    with caplog.at_level(logging.INFO, logger="cudnnnet.train.trainer"):
        trainer.run()
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("step ")]
    assert [line.split(":")[0] for line in lines] == [
        "step 2/8 (epoch 1/2)", "step 4/8 (epoch 1/2)", "step 6/8 (epoch 2/2)", "step 8/8 (epoch 2/2)"]
    pattern = r"step \d/8 \(epoch \d/2\): loss \d+\.\d{4} accuracy \d\.\d{4} lr [\d.e-]+ [\d,]+ img/s"
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    rates = [float(line.split(" lr ")[1].split()[0]) for line in lines]
    warm_cosine = 0.1 * 0.5 * (1 + np.cos(np.pi / 8)) * 2 / 3  # the second step (1): cosine, 2/3 of the warm-up
    assert rates[0] == pytest.approx(warm_cosine, rel=1e-3)


def test_no_progress_line_without_log_lines(small_npz, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="cudnnnet.train.trainer"):
        Trainer(parse_config(settings(small_npz)), tmp_path / "run", progress=False).run()
    assert not [record for record in caplog.records if record.getMessage().startswith("step ")]


def test_the_event_log_gets_each_figure_at_its_step_and_is_closed(small_npz, tmp_path):
    events = Recorder()
    trainer = Trainer(parse_config(settings(small_npz)), tmp_path / "run", progress=False, events=events)
    metrics = trainer.run()
    assert events.closed
    assert {tag: [step for step, _ in values] for tag, values in events.values.items()} == {
        **{tag: [2, 4, 6, 8] for tag in ("train/loss", "train/accuracy", "train/learning_rate",
                                         "train/images_per_second")},
        **{f"epoch/{key}": [4, 8] for key in ("learning_rate", "train_loss", "train_accuracy", "validation_loss",
                                              "validation_accuracy", "epoch_seconds")},
        "test/loss": [8], "test/accuracy": [8]}
    history = trainer.position.history
    assert [value for _, value in events.values["epoch/validation_loss"]] == [row["validation_loss"] for row in history]
    assert events.values["test/accuracy"] == [(8, metrics["test_accuracy"])]
    schedule = trainer.config.train.schedule
    assert [value for _, value in events.values["train/learning_rate"]] == pytest.approx(
        [schedule.learning_rate(0.1, step - 1, (step - 1) // 4, 8) for step in (2, 4, 6, 8)])


def read_events(folder) -> dict:
    """{tag: [(step, value)]} of the scalars in the TensorBoard event files under ``folder`` (TFRecord framing:
    length, its CRC, the Event message, its CRC)."""
    from tensorboardX.proto import event_pb2

    scalars = {}
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_the_cli_writes_a_tensorboard_log_that_tensorboard_reads(small_npz, tmp_path):
    pytest.importorskip("tensorboardX")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings(small_npz)))
    with offline_tools(tmp_path) as call:
        finished = call("train", "--config", path, "--output", tmp_path / "run", "--tensorboard", tmp_path / "tb")
    assert finished.returncode == 0, finished.stderr
    scalars = read_events(tmp_path / "tb")
    assert [step for step, _ in scalars["train/loss"]] == [2, 4, 6, 8]
    assert [step for step, _ in scalars["epoch/validation_accuracy"]] == [4, 8]
    assert scalars["train/learning_rate"][0][1] == pytest.approx(0.1 * 0.5 * (1 + np.cos(np.pi / 8)) * 2 / 3, rel=1e-5)
    assert len(scalars["test/loss"]) == 1 and np.isfinite(scalars["test/loss"][0][1])


def test_without_the_extra_tensorboard_is_one_line_naming_it_before_anything_is_read(small_npz, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # an import of it fails, as where it is not installed
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings(small_npz)))
    with offline_tools(tmp_path) as call:
        finished = call("train", "--config", path, "--output", tmp_path / "run", "--tensorboard", tmp_path / "tb")
    assert finished.returncode == 2
    assert finished.stderr.splitlines() == [
        f"cudnnnet-train: error: --tensorboard {tmp_path / 'tb'}: writing TensorBoard logs needs the tensorboard "
        f"extra: pip install 'cudnnnet[tensorboard]'"]
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()


def test_curves_png_draws_the_learning_rate_of_every_step(small_npz, tmp_path, monkeypatch):
    from cudnnnet.train import curves

    drawn = {}
    plot = curves.plot_curves

    def keep(history, path, steps_per_epoch=None, learning_rates=None):
        drawn["rates"] = learning_rates
        plot(history, path, steps_per_epoch, learning_rates)

    monkeypatch.setattr("cudnnnet.train.trainer.plot_curves", keep)
    trainer = Trainer(parse_config(settings(small_npz)), tmp_path / "run", progress=False)
    trainer.run()
    schedule = trainer.config.train.schedule
    assert drawn["rates"] == [(step / 4, pytest.approx(schedule.learning_rate(0.1, step, step // 4, 8)))
                              for step in range(8)]
    with Image.open(tmp_path / "run" / "curves.png") as image:
        assert image.size == (3 * curves.PANEL_WIDTH, curves.HEIGHT)
        third = np.asarray(image.convert("RGB"))[:, 2 * curves.PANEL_WIDTH:].astype(int)
    green = (np.abs(third - np.array(curves.LEARNING_RATE[1])).sum(axis=-1) < 30).mean()
    assert green > 1e-3  # the learning rate's line


def test_the_cli_logs_progress_lines_where_stderr_is_not_a_terminal(small_npz, tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings(small_npz)))
    with offline_tools(tmp_path) as call, caplog.at_level(logging.INFO, logger="cudnnnet.train.trainer"):
        finished = call("train", "--config", path, "--output", tmp_path / "run", "--set", "train.log_every=4")
    assert finished.returncode == 0, finished.stderr
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 4/8 (epoch 1/2)", "step 8/8 (epoch 2/2)"]
