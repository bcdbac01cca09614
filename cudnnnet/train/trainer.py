"""Training and evaluation from a Config: the C++ design's ``Network::train / test`` loop, made safe.

``Trainer(config, output_dir).run()`` trains, evaluates on the full test set after each epoch and
writes into ``output_dir``: ``model.npz`` (weights, optimiser state and position, so a run can be
resumed), ``metrics.json``, ``history.csv`` and ``curves.png`` (drawn with Pillow), as one set
published at once (``outputs.OutputFolder``): after every ``checkpoint_every`` epochs, at the end,
and when a signal stops the run. Nothing outside ``output_dir`` is written. A folder that already
holds a published training is refused (``OutputFolder.admit``, checked by the Trainer itself so
that the command line and library users alike are protected) unless the run resumes it or is given
``overwrite=True``.

What a run needs before its first step (the input shape, the network, the data and their checks)
is ``training_setup.py``'s, the data sets held on the device ``data/resident.py``'s, the evaluation
``evaluation.py``'s; their names are re-exported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backends import get_backend, warm_up
from ..config.monitor import monitored
from ..config.overrides import config_yaml
from ..config.schema import Config, with_checkpoint_defaults
from ..data.loader import BatchLoader
from ..data.resident import BatchFeed, ResidentData, ResidentTestSet, resident_images  # noqa: F401 (re-exported)
from ..data.sources import class_names  # noqa: F401 (re-exported)
from ..data.streamed import StreamedData, choose_placement
from ..data.validation import epoch_fields
from ..errors import CheckpointError, TrainingError
from ..io import checkpoint
from ..limits import MAX_INTEGER
from ..network import OPTIMIZER_PREFIX
from ..optim.loss_scaling import LossScaler
from ..optim.optimizers import make_optimizer
from ..precision import get_precision
from ..tensor import Tensor
from ..util.background import Background
from .checks import check_batch_statistics, check_class_scores, check_model_fits, check_resumed_model
from .curves import plot_curves
from .distributed.replicas import Replicas, Shard
from .evaluation import Accumulator, Evaluation, evaluate, evaluate_batches  # noqa: F401 (re-exported)
from .history import HISTORY_FIELDS, check_history, history_csv  # noqa: F401 (HISTORY_FIELDS re-exported)
from .live_log import progress_line
from .monitoring import BEST_NAME, STATE_KEY, Monitor
from .outputs import OutputFolder, checkpoint_to_resume
from .setup import (KNOWN_SHAPES, build_network, data_classes, input_shape, load_data,  # noqa: F401
                    load_split, load_split_pixels, local_splits, model_mapping, smallest_input_shape,
                    write_atomic)  # (re-exported: the setup's names)
from .watch import NonFiniteWatch, progress_bar, signals_to

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """Training stopped on a signal after publishing its outputs, a resumable model.npz among them."""

    def __init__(self, signum: int, step: int, output_dir: Path):
        self.signum = signum
        self.output_dir = output_dir
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}; its outputs and checkpoint "
                         f"are in {output_dir} (continue with --resume {output_dir})")


@dataclass
class Position:
    """Where training stands: the next batch to run is ``batch`` of ``epoch``; ``step`` counts all steps."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    history: list = field(default_factory=list)


class Trainer:
    def __init__(self, config: Config, output_dir, resume=None, progress: bool = True, image_limit: int | None = None,
                 group=None, overwrite: bool = False, log_lines: bool = False, events=None):
        """``resume``: an output folder or checkpoint to continue from. ``overwrite``: replace the outputs
        ``output_dir`` already holds; without it (and without ``resume`` naming them) a folder holding
        a published training is refused (OutputExistsError) before anything is read, on the rank that
        writes. ``image_limit``: train and test on the first ``image_limit`` images of each split only
        (the benchmark's smoke tests); None takes every image. ``group``: this rank's
        ``distributed.Group`` where several processes train together (data-parallel over NCCL). ``log_lines``:
        log a progress line every log_every steps (where no progress bar is drawn); ``events``: a
        ``live_log.TensorBoardLog`` (or anything with its ``scalars`` and ``close``), closed by ``run``."""
        self.output_dir = Path(output_dir)
        self.outputs = OutputFolder(self.output_dir)
        if group is None or group.launch.rank == 0:  # the rank that writes (see ``writes``)
            self.outputs.admit(resume, overwrite)  # and again under the folder's lock, when it publishes
        self.config = config
        self.progress = progress
        self.log_lines, self.events = log_lines, events
        warm_up(config.device)  # the GPU starts while the data is read and the libraries load
        reading = Background("cudnnnet-local_splits", local_splits, config)  # what is on disk, while get_backend loads
        self.backend = get_backend(config.device)  # before any download: no GPU is reported first
        loaded = reading.result() or load_data(config)
        config, (self.train_pixels, self.train_labels), (self.test_pixels, self.test_labels), self.validation = loaded
        if image_limit is not None:
            self.train_pixels, self.train_labels = self.train_pixels.head(image_limit), self.train_labels[:image_limit]
            self.test_pixels, self.test_labels = self.test_pixels.head(image_limit), self.test_labels[:image_limit]
            if self.validation is not None:
                self.validation = (self.validation[0].head(image_limit), self.validation[1][:image_limit])
        self.validating = self.validation is not None  # each epoch evaluated on it, the test set once at the end
        self.config = config  # with the data's classes, shape and normalisation, as the checkpoint keeps them
        self.classes = class_names(config)
        check_model_fits(config, (len(self.train_labels), len(self.test_labels)))  # the data's shape, now known
        self.network = build_network(config, self.backend).set_engine(config.engine).set_math(config.math)
        check_class_scores(self.network, self.classes, config)
        train = config.train
        self.optimizer = make_optimizer(self.network, train.optimizer, train.schedule)
        self.loss_scaler = None  # math fp16: dynamic loss scaling on the device (loss_scaling.py)
        if get_precision(config.math).loss_scaling:
            self.loss_scaler = LossScaler.from_config(self.backend, self.optimizer.flat_gradients(), train.loss_scale)
            self.optimizer.loss_scale = self.loss_scaler.state
        self.loader = BatchLoader(self.train_pixels, self.train_labels, train.batch_size, seed=train.seed,
                                  classes=len(self.classes))
        if group is not None:  # this rank's part of every epoch
            self.loader = Shard(self.loader, group.launch.rank, group.launch.world_size)
        check_batch_statistics(self.network, train.batch_size, len(self.loader.permutation(0)), config)
        evaluated = [self.test_pixels] + ([self.validation[0]] if self.validating else [])
        placement = choose_placement(config.data.placement, self.backend, self.train_pixels, self.train_labels,
                                     sum(ResidentTestSet.nbytes(pixels, self.loader.classes) for pixels in evaluated))
        augment = config.data.augment
        if augment is not None and augment.active:
            log.info("training batches augmented: random crop of the image padded by %d, %s", augment.crop_padding,
                     "horizontal flip of half of them" if augment.flip else "no flip")
        if placement == "host":  # augmented on the host before the upload
            self.data = StreamedData(self.backend, self.train_images, self.train_labels, train.batch_size,
                                     self.loader.classes, augment, train.seed)
            self.test_set = self.validation_set = None
        else:  # both sets made on the device from their bytes; the training batches augmented there
            self.data = ResidentData(self.backend, self.train_pixels, self.train_labels, train.batch_size,
                                     self.loader.classes, augment, train.seed)
            self.test_set = ResidentTestSet(self.backend, self.test_pixels, self.test_labels, self.loader.classes)
            self.validation_set = None if not self.validating else ResidentTestSet(
                self.backend, *self.validation, self.loader.classes)
        self.use_graph = train.graph and self.backend.supports_graphs
        self.graphs = {}  # batch size -> the captured training step of that size (the full and the last batch)
        self._eager_sizes = set()  # batch sizes stepped once eagerly: allocated, planned, ready to capture
        self.totals = Accumulator(self.backend)
        self.watch = NonFiniteWatch(self.backend)
        self.position = Position()
        self.stop_signal: int | None = None
        self.train_seconds = 0.0
        self.images_trained = 0
        self.replicas = None
        self.monitor = Monitor(monitored(config), train.early_stopping)  # best.npz and early stopping
        self.ranks_stop_early = False  # several ranks: rank 0's monitor stopped the run, agreed by every rank
        self.final_test: Evaluation | None = None  # with a validation set: the test set's, evaluated at the end
        if group is not None:
            self.replicas = Replicas(group, self.network, self.optimizer, train, self.loader.steps_per_epoch)
        if resume is not None:
            self._resume(Path(resume))
        if self.replicas is not None:
            self.replicas.broadcast_weights()
        self.optimizer.total_steps = self.total_steps

    @property
    def train_images(self) -> np.ndarray:
        """The training images as float32 (N, 1, H, W) on the host (converted on first use)."""
        return self.train_pixels.floats

    @property
    def test_images(self) -> np.ndarray:
        """The test images as float32 (N, 1, H, W) on the host (converted on first use)."""
        return self.test_pixels.floats

    # ---- the plan ------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        train = self.config.train
        return train.steps if train.steps is not None else train.epochs * self.loader.steps_per_epoch

    @property
    def total_epochs(self) -> int:
        return math.ceil(self.total_steps / self.loader.steps_per_epoch)

    # ---- one step --------------------------------------------------------------------------------
    def _step(self, x: Tensor, target: Tensor) -> None:
        """gather → forward → backward with the loss and accuracy counted (on the device) → SGD: device work
        only. Under loss scaling the loss gradient carries S, and the overflow check, the scale's update
        and the skipped step stay on the device too."""
        self.data.gather(x, target)
        scaler = self.loss_scaler
        self.network.forward_backward(x, target, self.totals.loss_sum, self.totals.correct,
                                      loss_scale=None if scaler is None else scaler.scale,
                                      after_backward=None if self.replicas is None else self.replicas.layer_done)
        stepped = self.replicas is not None and self.replicas.average_gradients()  # True: its average stepped
        self.watch.record(self.totals.loss_sum)
        if scaler is not None:
            scaler.check()
        if not stepped:
            self.optimizer.step()

    def train_batch(self, index: int) -> int:
        """Train on batch ``index`` of the current epoch; returns its size. With graphs enabled, the
        second step of each batch size (the full batch; the epoch's shorter last batch, in the second
        epoch) is captured as a CUDA graph and later steps of that size replay it: the first has
        allocated every buffer, planned every convolution and compiled every kernel."""
        x, target = self.data.select(index)
        self.optimizer.set_lr(self.position.epoch)
        graph = self.graphs.get(x.n)
        if graph is not None:
            graph.launch()
            self.optimizer.step_count += 1  # what optimizer.step() counts; the replay ran its kernels
        elif self.use_graph and x.n in self._eager_sizes:
            with self.backend.capture() as graph:
                self._step(x, target)
            self.graphs[x.n] = graph
            graph.launch()
        else:
            self._eager_sizes.add(x.n)
            self._step(x, target)
        return x.n

    @property
    def graph(self):
        """The captured step of a full batch, once captured (None before, or without graphs)."""
        return self.graphs.get(self.data.batch_size)

    # ---- the loop --------------------------------------------------------------------------------
    def run(self) -> dict:
        """Train to the planned step; returns the final metrics. The output folder is locked meanwhile
        (OutputInUseError where another training holds it). Its calls compute in the config's math and
        engine (the network's own settings, in force on the backend for this block only)."""
        try:
            with self.network.settings():
                return self._run()
        finally:
            if self.events is not None:
                self.events.close()

    def _run(self) -> dict:
        with self.outputs if self.writes else contextlib.nullcontext(), signals_to(self):
            log.info("training %s on %s: %d steps of batch %d (epochs: %d)%s", self.config.source,
                     self.backend.device_name, self.total_steps, min(self.loader.batch_size, self.loader.num_samples),
                     self.total_epochs, ", each step replayed as a CUDA graph" if self.use_graph else "")
            self.watch.start(self.position.step)
            while self.position.step < self.total_steps and not self.stopped_early:
                self._run_epoch()
            if self.validating:
                self.final_test = self._evaluate()
                log.info("test loss %.4f accuracy %.4f", self.final_test.loss, self.final_test.accuracy)
                if self.events is not None:
                    self.events.scalars(self.position.step, {"test/loss": self.final_test.loss,
                                                             "test/accuracy": self.final_test.accuracy})
            metrics = self._publish(finished=True)
        self.finish_replicas(exit_code=0)
        return metrics

    def finish_replicas(self, exit_code: int) -> None:
        """Free the communicator of several ranks, the captured step (which holds its all-reduce) first
        (``run`` does it after publishing; a caller that trains epoch by epoch does it at its end).
        ``exit_code``: the process's, should NCCL not let go within CUDNNNET_TEARDOWN_TIMEOUT."""
        if self.replicas is not None:
            graphs, self.graphs = list(self.graphs.values()), {}
            self.replicas.finish(graphs=graphs, exit_code=exit_code)

    @property
    def stopped_early(self) -> bool:
        """Whether early stopping ends the run: the monitor's count reached the patience; on several
        ranks, rank 0's (which evaluates), agreed by every rank after each epoch."""
        return self.monitor.should_stop or self.ranks_stop_early

    @property
    def writes(self) -> bool:
        """Whether this process evaluates and writes the outputs (rank 0 of several; a lone process)."""
        return self.replicas is None or self.replicas.writes

    def _run_epoch(self) -> None:
        first_batch = self.position.batch
        seconds = self.train_epoch()
        self.train_seconds += seconds
        self._end_epoch(self.position.batch - first_batch, seconds,
                        completed=self.position.batch == self.loader.steps_per_epoch)

    def train_epoch(self) -> float:
        """Train the rest of the current epoch (up to the planned steps) without evaluating it.

        Returns the seconds it took, the device synchronised. The loss is read (a synchronisation)
        only every ``log_every`` steps, to show progress and to stop on a NaN. It computes in the
        network's settings, as ``run`` does, whoever calls it.
        """
        with self.network.settings():
            return self._train_epoch()

    def _train_epoch(self) -> float:
        position = self.position
        last = min(self.loader.steps_per_epoch, position.batch + self.total_steps - position.step)
        first = position.batch
        self.totals.reset()
        self.data.start_epoch(self.loader.permutation(position.epoch), position.step - position.batch)
        bar = progress_bar(self.progress, last, first, f"epoch {position.epoch + 1}/{self.total_epochs}")
        started = time.perf_counter()
        for index in range(first, last):
            self.images_trained += self.train_batch(index)
            position.batch, position.step = index + 1, position.step + 1
            if position.step % self.config.train.log_every == 0 or (self.progress and index + 1 == last):
                self._log_progress(bar, started, index + 1 - first)
            bar.update(1)
            if self._stopping(index + 1 == last):
                bar.close()
                self._interrupt(started)
        self.backend.synchronize()
        bar.close()
        return time.perf_counter() - started

    def _stopping(self, epoch_ends: bool) -> bool:
        """Whether to stop after this step on a signal. Several ranks agree on it (a synchronisation)
        every log_every steps and at the end of an epoch, so that every rank stops at the same step."""
        if self.replicas is None:
            return self.stop_signal is not None
        if not epoch_ends and self.position.step % self.config.train.log_every:
            return False
        self.stop_signal = self.replicas.agreed_stop(self.stop_signal)
        return self.stop_signal is not None

    def _log_progress(self, bar, started: float, steps_done: int) -> None:
        loss_sum, correct = self.totals.read()
        loss = loss_sum / max(steps_done, 1)
        self._stop_if_not_finite(loss)
        seen = min(steps_done * self.config.train.batch_size, self.loader.num_samples)
        rate = seen / max(time.perf_counter() - started, 1e-9)
        accuracy = correct / seen
        bar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.4f}", img_s=f"{rate:,.0f}")
        log.debug("step %d: loss %.4f", self.position.step, loss)
        if self.log_lines or self.events is not None:
            self._log_live(loss, accuracy, rate * self.world_size)

    def _log_live(self, loss: float, accuracy: float, rate: float) -> None:
        """A progress line and the TensorBoard scalars of the step just trained (``live_log``)."""
        values = {"train/loss": loss, "train/accuracy": accuracy,
                  "train/learning_rate": self.optimizer.rate_at(self.position.step - 1, self.position.epoch),
                  "train/images_per_second": rate, **self._loss_scale_metrics(prefix="train/")}
        if self.log_lines:
            log.info("%s", progress_line(self.position.step, self.total_steps, self.position.epoch + 1,
                                         self.total_epochs, values))
        if self.events is not None:
            self.events.scalars(self.position.step, values)

    def _end_epoch(self, steps_done: int, seconds: float, completed: bool) -> None:
        """Evaluate on the test set and record the epoch; a run stopped mid-epoch by ``steps`` stays in it.
        Several ranks: the training totals are averaged over the ranks; rank 0 evaluates."""
        if self.replicas is not None:
            self.replicas.average(self.totals.values)
        loss_sum, correct = self.totals.read()
        train_loss = loss_sum / max(steps_done, 1)
        self._stop_if_not_finite(train_loss)
        images_seen = min(steps_done * self.config.train.batch_size, self.loader.num_samples)
        test = self._evaluate(validation=self.validating)
        loss_key, accuracy_key = epoch_fields(self.validating)
        row = {"epoch": self.position.epoch + 1, "steps": self.position.step,
               "learning_rate": self.optimizer.current_lr(self.position.epoch), "train_loss": train_loss,
               "train_accuracy": correct / images_seen, loss_key: test.loss, accuracy_key: test.accuracy,
               "epoch_seconds": seconds}
        self.position.history.append(row)
        log.info("epoch %d: train loss %.4f accuracy %.4f | %s loss %.4f accuracy %.4f | %.1f s%s",
                 row["epoch"], train_loss, row["train_accuracy"], "validation" if self.validating else "test",
                 test.loss, test.accuracy, seconds, self._loss_scale_text())
        if self.events is not None:
            self.events.scalars(self.position.step, {f"epoch/{key}": value for key, value in row.items()
                                                     if key not in ("epoch", "steps")})
        if self.writes and self.monitor.update(row, self.network.state_dict):
            log.info("epoch %d is the best so far by %s (%.4f)", row["epoch"], self.monitor.metric,
                     row[self.monitor.metric])
        if self.replicas is not None and self.monitor.early_stopping is not None:
            self.ranks_stop_early = self.replicas.agreed(self.monitor.should_stop)
        if completed:
            self.position.epoch += 1
            self.position.batch = 0
        every = self.config.train.checkpoint_every
        if (completed and every and self.position.epoch % every == 0 and self.position.step < self.total_steps
                and not self.stopped_early):  # else the run ends here and publishes then
            self._publish(finished=False)

    def _loss_scale_text(self) -> str:
        """" | loss scale S, N skipped steps" under loss scaling (reads the device), else ""."""
        if self.loss_scaler is None:
            return ""
        status = self.loss_scaler.read()
        return f" | loss scale {status.scale:g}, {status.skipped_steps} skipped steps"

    def _stop_if_not_finite(self, loss: float) -> None:
        """TrainingError naming the first step whose loss was NaN or infinite (recorded on the device
        by ``NonFiniteWatch``), where there is one; called where the host reads the totals anyway."""
        first = self.watch.first_step()
        if first is None and math.isfinite(loss):
            return
        first = first or self.position.step
        epoch = (first - 1) // self.loader.steps_per_epoch + 1
        noticed = f", noticed at step {self.position.step}" if first != self.position.step else ""
        raise TrainingError(f"the loss became {'nan' if math.isnan(loss) else loss} at step {first} (epoch {epoch}"
                            f"{noticed}); try a lower learning rate. The outputs published before, if any, are intact")

    def _evaluate(self, validation: bool = False) -> Evaluation:
        """The test set's (or the validation set's) loss and accuracy, from device-resident batches where it
        is resident."""
        batch_size = self.config.train.eval_batch_size
        if not self.writes:
            return Evaluation(math.nan, math.nan)
        resident = self.validation_set if validation else self.test_set
        if resident is None:
            pixels, labels = self.validation if validation else (self.test_pixels, self.test_labels)
            return evaluate(self.network, pixels.floats, labels, batch_size)
        return evaluate_batches(self.network, resident.batches(batch_size), resident.count)

    # ---- outputs ---------------------------------------------------------------------------------
    def _publish(self, **status) -> dict:
        """Write model.npz, metrics.json (with ``status``), history.csv and curves.png as one new set of
        the output folder, published at once; returns the metrics written."""
        metrics = {**self.metrics(), **status}
        if not self.writes:
            return metrics
        with self.outputs.new_set() as folder:
            self._save(folder / "model.npz")
            self.monitor.save_best(folder / BEST_NAME, {**self.network.metadata(),
                                                        "config": self._saved_config().to_dict()})
            write_atomic(folder / "metrics.json", json.dumps(metrics, indent=2) + "\n")
            write_atomic(folder / "history.csv", history_csv(self.position.history, self.validating))
            plot_curves(self.position.history, folder / "curves.png", self.loader.steps_per_epoch,
                        learning_rates=self._learning_rate_curve())
            write_atomic(folder / "config.yaml", config_yaml(self._saved_config()))
        return metrics

    def _learning_rate_curve(self, points: int = 200) -> list[tuple[float, float]]:
        """(fractional epoch, rate) of the steps trained so far, at most ``points`` of them."""
        per_epoch = self.loader.steps_per_epoch
        steps = sorted({int(step) for step in np.linspace(0, max(self.position.step - 1, 0), points)})
        return [(step / per_epoch, self.optimizer.rate_at(step, step // per_epoch)) for step in steps]

    def _save(self, path: Path) -> Path:
        arrays = self.optimizer.state_arrays(OPTIMIZER_PREFIX)
        if self.loss_scaler is not None:
            arrays.update(self.loss_scaler.state_arrays(OPTIMIZER_PREFIX))
        position = {"epoch": self.position.epoch, "batch": self.position.batch, "step": self.position.step}
        return self.network.save(path, extra_arrays=arrays, config=self._saved_config().to_dict(),
                                 position=position, history=self.position.history,
                                 **{STATE_KEY: self.monitor.state()})

    def _saved_config(self) -> Config:
        """The run's config as its outputs keep it: the data's paths absolute."""
        return dataclasses.replace(self.config, data=self.config.data.with_absolute_paths())

    def metrics(self) -> dict:
        last = self.position.history[-1] if self.position.history else {}
        return {**self._base_metrics(last), **self._validation_metrics(last), **self._loss_scale_metrics(),
                **self.monitor.metrics()}

    def _validation_metrics(self, last: dict) -> dict:
        """With a validation set: its last figures, and the test set's from the end of the run (None before)."""
        if not self.validating:
            return {}
        test = self.final_test
        return {"validation_loss": last.get("validation_loss"), "validation_accuracy": last.get("validation_accuracy"),
                "validation_images": len(self.validation[1]), "test_loss": None if test is None else test.loss,
                "test_accuracy": None if test is None else test.accuracy}

    def _loss_scale_metrics(self, prefix: str = "") -> dict:
        """loss_scale (the next step's) and skipped_steps under loss scaling (reads the device), else nothing."""
        if self.loss_scaler is None:
            return {}
        status = self.loss_scaler.read()
        return {f"{prefix}loss_scale": status.scale, f"{prefix}skipped_steps": status.skipped_steps}

    def _base_metrics(self, last: dict) -> dict:
        return {
            "config": self.config.source,
            "device": self.backend.device_name,
            "backend": self.backend.name,
            "math": self.config.math,
            "engine": self.config.engine,
            "epochs": round(self.position.step / self.loader.steps_per_epoch, 4),
            "steps": self.position.step,
            "batch_size": self.config.train.batch_size,
            "gpus": self.world_size,
            "train_loss": last.get("train_loss"),
            "train_accuracy": last.get("train_accuracy"),
            "test_loss": last.get("test_loss"),
            "test_accuracy": last.get("test_accuracy"),
            "train_seconds": self.train_seconds,
            "images_per_second": (self.images_trained * self.world_size / self.train_seconds
                                  if self.train_seconds else None),
        }

    @property
    def world_size(self) -> int:
        return 1 if self.replicas is None else self.replicas.world_size

    # ---- interruption and resumption ---------------------------------------------------------
    def _interrupt(self, epoch_started: float) -> None:
        """Publish the outputs of the steps trained so far (the epoch in progress counted in
        train_seconds) and stop with Interrupted."""
        self.backend.synchronize()
        self.train_seconds += time.perf_counter() - epoch_started
        self._publish(finished=False, interrupted=True)
        self.finish_replicas(exit_code=128 + self.stop_signal)
        raise Interrupted(self.stop_signal, self.position.step, self.output_dir)

    def _resume(self, path: Path) -> None:
        path = checkpoint_to_resume(path)
        arrays, metadata = checkpoint.load_npz(path, self.network.checkpoint_shapes().get)
        check_resumed_model(path, metadata, self.config, self.config.source)
        self._check_batch_size(path, metadata)
        self._check_geometry(path, metadata)
        self.network.load_weights(path)
        position = metadata.get("position")
        if not isinstance(position, dict) or not all(isinstance(position.get(k), int) for k in ("epoch", "batch", "step")):
            raise CheckpointError(f"{path}: no training position in its metadata; it can be loaded but not resumed")
        if not all(0 <= position[key] <= MAX_INTEGER for key in ("epoch", "batch", "step")):
            raise CheckpointError(f"{path}: the training position in its metadata is malformed (epoch, batch and step "
                                  f"must be integers in [0, {MAX_INTEGER}]); it can be loaded but not resumed")
        self._check_reachable(path, position)
        try:
            self.optimizer.load_state_arrays(arrays, OPTIMIZER_PREFIX)
            if self.loss_scaler is not None and not self.loss_scaler.load_state_arrays(arrays, OPTIMIZER_PREFIX):
                log.info("%s holds no loss scale: starting from %g", path, self.config.train.loss_scale.initial)
        except CheckpointError as error:
            raise CheckpointError(f"{path}: {error}") from None
        history = metadata.get("history") or []
        check_history(path, history, self.validating)
        self.monitor.restore(path, metadata, checkpoint.load_npz)
        self.position = Position(position["epoch"], position["batch"], position["step"], list(history))
        if self.position.step < self.total_steps:  # else nothing is left to train, and no mask to skip
            self.network.skip_dropout_masks(self._batches_before(self.position))
        log.info("resumed from %s at epoch %d, batch %d (step %d)", path, self.position.epoch + 1,
                 self.position.batch, self.position.step)

    def _check_reachable(self, path: Path, position: dict) -> None:
        """A position training can reach: no more epochs than steps, no more batches than an epoch has."""
        epoch, batch, step = position["epoch"], position["batch"], position["step"]
        per_epoch = self.loader.steps_per_epoch
        if epoch > step or batch > min(step, per_epoch):
            raise CheckpointError(f"{path}: the training position in its metadata (epoch {epoch}, batch {batch}, step "
                                  f"{step}) cannot be reached: at most one epoch a step, and {per_epoch} batches an "
                                  f"epoch; it can be loaded but not resumed")

    def _batches_before(self, position: Position) -> list[tuple[int, int]]:
        """The (batch size, steps) runs this rank trained before ``position``, in order: each epoch's
        full batches, then its last, smaller one where the epoch does not divide into full batches."""
        size = self.config.train.batch_size
        count = len(self.loader.permutation(0))  # this rank's samples an epoch
        epoch = [(min(size, count - index * size), 1) for index in range(self.loader.steps_per_epoch)]
        runs: list[tuple[int, int]] = []
        for batch_size, _ in epoch * position.epoch + epoch[:position.batch]:
            if runs and runs[-1][0] == batch_size:
                runs[-1] = (batch_size, runs[-1][1] + 1)
            else:
                runs.append((batch_size, 1))
        return runs


    def _check_batch_size(self, path: Path, metadata: dict) -> None:
        """A position counts batches of the size it was trained with: resuming needs that size."""
        config = metadata.get("config")
        train = config.get("train") if isinstance(config, dict) else None
        saved = train.get("batch_size") if isinstance(train, dict) else None
        ours = self.config.train.batch_size
        if isinstance(saved, int) and not isinstance(saved, bool) and saved != ours:
            raise CheckpointError(f"{path} was trained with batch size {saved} and this run asks for {ours}; its "
                                  f"position counts batches of {saved}: resume with --batch-size {saved}")

    def _check_geometry(self, path: Path, metadata: dict) -> None:
        """Resuming fits the folder's images as the checkpoint was trained on them: the same data.resize
        where both resize an image folder (a checkpoint from before the key stretched them)."""
        config = with_checkpoint_defaults(metadata.get("config"))
        data = config.get("data") if isinstance(config, dict) else None
        if not (isinstance(data, dict) and data.get("dataset") == "image-folder" and data.get("image_size")):
            return
        saved, ours = data.get("resize"), self.config.data
        if ours.dataset == "image-folder" and ours.image_size and isinstance(saved, str) and saved != ours.resize:
            raise CheckpointError(f"{path} was trained on images fitted to data.image_size by data.resize: {saved}, "
                                  f"and this run asks for {ours.resize}: resume with data.resize: {saved}")
