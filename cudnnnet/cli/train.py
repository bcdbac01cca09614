"""cudnnnet-train: train a network from a YAML config.

    python scripts/train.py --config configs/mnist_mlp.yaml --device host --epochs 1 --output /tmp/run
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from pathlib import Path

from ..backends import DEVICES, no_gpu_reason
from ..config.schema import load_config
from ..config.shipped import shipped_config_names
from ..errors import UsageError
from ..io import checkpoint
from ..train.checks import check_model, check_resumed_model, check_size
from ..train.distributed import replicas as distributed
from ..train.distributed.launcher import spawn_ranks
from ..train.live_log import TensorBoardLog, require_tensorboard
from ..train.outputs import checkpoint_to_resume, is_output_folder, refuse_replacing
from ..train.trainer import Interrupted, Trainer
from ..util.printable import one_line
from .common import ArgumentParser, add_common_arguments, add_engine_argument, path_argument, run

log = logging.getLogger("cudnnnet.train")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="cudnnnet-train", description="Train a network from a YAML config.")
    parser.add_argument("--config", required=True, type=path_argument,
                        help=f"a YAML config file, or a shipped config by name: {', '.join(shipped_config_names())}")
    parser.add_argument("--device", choices=DEVICES, help="override the config's device (auto uses a GPU when usable)")
    parser.add_argument("--data-dir", type=path_argument,
                        help="the data set's folder: overrides data.dir for every data set (MNIST default: "
                             "$CUDNNNET_DATA, else the user cache, downloading)")
    parser.add_argument("--epochs", type=positive_int, help="override train.epochs")
    parser.add_argument("--steps", type=positive_int, help="stop after this many steps (overrides --epochs)")
    parser.add_argument("--batch-size", type=positive_int, help="override train.batch_size")
    parser.add_argument("--seed", type=non_negative_int, help="override train.seed")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY.PATH=VALUE",
                        help="replace one config value, e.g. --set train.optimizer.lr=0.01 --set model.fc1.out_size=800 "
                             "(layers by name or index; the value read as YAML; may be repeated)")
    parser.add_argument("--output", type=path_argument,
                        help="output directory (default: the output folder --resume names, else runs/<config name>)")
    parser.add_argument("--resume", type=path_argument, metavar="CHECKPOINT",
                        help="continue from an output folder (its latest checkpoint) or a model.npz file; with the "
                             "batch size it was trained with")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the outputs of an earlier training in --output (they stay published until "
                             "this run publishes its first checkpoint); without it such a folder is refused")
    parser.add_argument("--export-original", type=path_argument, metavar="DIR",
                        help="after training, also write the weights as the C++ original's .bin files into DIR")
    parser.add_argument("--gpus", type=positive_int, metavar="N",
                        help="train on N GPUs of this host, one process each, data-parallel through NCCL "
                             "(batch_size per GPU; see train.lr_scaling)")
    parser.add_argument("--tensorboard", type=path_argument, metavar="DIR",
                        help="also write a TensorBoard event log into DIR: loss, accuracy, learning rate, loss scale, "
                             "images/s (needs the extra: pip install 'cudnnnet[tensorboard]')")
    parser.add_argument("--no-graph", action="store_true", help="on the GPU, run each step eagerly, not as a CUDA graph")
    add_engine_argument(parser, default=None, default_text="default: the config's engine, else slides")
    add_common_arguments(parser)
    return parser


def check_output(output: Path, flag: str = "--output") -> None:
    """``output`` is a directory, or can be created as one, and can be written to."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"{flag} {output} is a file, not a directory")
    existing = next(parent for parent in (output, *output.absolute().parents)
                    if parent.exists() or parent.is_symlink())
    if not existing.exists():
        raise UsageError(f"{flag} {output}: {existing} is a broken link (to {os.readlink(existing)}); remove it or "
                         f"give another folder")
    if not existing.is_dir():
        raise UsageError(f"{flag} {output}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {output}: cannot write in {existing} (permission denied)")


def check_exportable(network, directory: str) -> None:
    """Every parameter and buffer of ``network`` has a file in the original's format, and no folder
    stands where one goes (checked before training)."""
    for name in {**network.parameters(), **network.buffers()}:
        try:
            path = Path(directory) / checkpoint.original_file_name(name)
        except UsageError as error:
            raise UsageError(f"--export-original {directory}: {error}") from None
        if path.is_dir():
            raise UsageError(f"--export-original {directory}: {path} (where {name} goes) is a folder; remove it or "
                             f"give another directory")


def prepare(args, config_text: dict | None = None) -> tuple[Trainer, Path]:
    """Check everything the run needs, then build the trainer; nothing is written before it runs.

    ``config_text`` maps a config path to its bytes where they were read already (a pipe such as
    ``--config <(...)`` can be read once only)."""
    config = load_config(args.config, data=(config_text or {}).get(args.config), overrides=args.overrides)
    check_model(config)
    config = config.with_overrides(
        epochs=args.epochs, steps=args.steps, batch_size=args.batch_size, seed=args.seed, device=args.device,
        data_dir=args.data_dir, graph=False if args.no_graph else None, engine=args.engine,
    )
    check_size(config)  # again: --batch-size may have changed the largest batch
    output = output_folder(args)
    check_output(output)
    if args.export_original:
        check_output(Path(args.export_original), "--export-original")
    resume = None if args.resume is None else checkpoint_to_resume(args.resume)
    if resume is not None:
        check_resumed_model(resume, checkpoint.load_npz_metadata(resume), config, args.config)
    launch = distributed.from_environment()
    if launch is not None:
        distributed.pin_device(launch)
        check_rank_device(launch, config.device)
    group = None if launch is None else distributed.join(launch, config)
    writes = launch is None or launch.rank == 0
    if args.tensorboard:
        require_tensorboard(args.tensorboard)
    bar = not args.quiet and sys.stderr.isatty() and writes  # else a log line every log_every steps
    trainer = Trainer(config, output, resume=resume, progress=bar, group=group, overwrite=args.overwrite,
                      log_lines=not bar and writes)
    if args.export_original:
        check_exportable(trainer.network, args.export_original)
    check_batch_size(trainer)
    if trainer.position.step >= trainer.total_steps:
        raise UsageError(f"{args.resume} is at step {trainer.position.step} and the run asks for "
                         f"{trainer.total_steps} steps: nothing left to train; raise --epochs or --steps")
    if trainer.monitor.should_stop:
        raise UsageError(f"{args.resume} stopped early: {trainer.monitor.metric} did not improve for "
                         f"{trainer.monitor.wait} epochs; to train on, raise its patience (--set "
                         f"train.early_stopping.patience={trainer.monitor.wait + 1}) or remove train.early_stopping")
    if args.tensorboard and writes:
        trainer.events = TensorBoardLog(args.tensorboard)
    return trainer, output


def check_batch_size(trainer: Trainer) -> None:
    """A batch larger than the training set is taken (a small folder of one's own images with a shipped
    config), and said: every step then trains on the whole set, one step an epoch."""
    batch_size, images = trainer.config.train.batch_size, trainer.loader.num_samples
    if batch_size > images:
        log.warning("train.batch_size %d is larger than the %d training images: each step trains on all %d, one "
                    "step per epoch (give --batch-size %d or less for several steps per epoch)", batch_size, images,
                    images, max(1, images // 2))


def check_rank_device(launch, device: str) -> None:
    """Ranks train on GPUs only: where the device is host, or this rank has no GPU, UsageError saying that
    the CPU trains as one process (not "use --device host", which the ranks would refuse in turn)."""
    if device == "host":
        problem = "the device is host"
    else:
        reason = no_gpu_reason()
        if reason is None:
            return
        problem = f"rank {launch.rank} has no GPU ({reason})"
    raise UsageError(f"{launch.launcher} started {launch.world_size} ranks, but {problem}: training over several "
                     f"processes needs one GPU per rank; to train on the CPU, run one process, without "
                     f"{launch.launcher}, with --device host or auto")


def output_folder(args) -> Path:
    """The folder the run writes into: --output; else the output folder --resume names (by itself or by its
    model.npz), so a resumed run goes on where it was; else runs/<config name>."""
    if args.output:
        return Path(args.output)
    resumed = None if args.resume is None else Path(args.resume)
    if resumed is not None and resumed.name == "model.npz" and is_output_folder(resumed.parent):
        resumed = resumed.parent
    if resumed is not None and resumed.is_dir():
        log.info("--resume %s without --output: the run goes on in %s", args.resume, resumed)
        return resumed
    return Path(f"runs/{Path(args.config).stem}")


def main_with_args(args, config_text: dict | None = None, argv: list[str] | None = None) -> int:
    if args.gpus is not None:  # refused here, before any rank starts (rank 0 checks again, as every Trainer does)
        refuse_replacing(output_folder(args), args.resume, args.overwrite)
        return spawn_ranks(args.gpus, sys.argv[1:] if argv is None else argv)
    trainer, output = prepare(args, config_text)
    try:
        metrics = trainer.run()
    except Interrupted as interrupted:
        if trainer.writes:
            print(f"cudnnnet-train: {one_line(str(interrupted))}", file=sys.stderr)
        return 128 + interrupted.signum
    if not trainer.writes:
        return 0
    if args.export_original:
        trainer.network.save_original(args.export_original)
    log.info("test accuracy %.4f, test loss %.4f, %.1f s, %s images/s on %s; outputs in %s",
             metrics["test_accuracy"], metrics["test_loss"], metrics["train_seconds"],
             _rate_text(metrics["images_per_second"]), metrics["device"], output)
    print(json.dumps({key: metrics[key] for key in ("device", "epochs", "steps", "test_accuracy", "test_loss",
                                                      "train_seconds", "images_per_second")}))
    return 0


def _rate_text(rate) -> str:
    return "?" if rate is None else f"{rate:,.0f}"


def main(argv=None, config_text: dict | None = None) -> int:
    """cudnnnet-train; ``config_text``: {config path: its bytes} already read (see ``launch``)."""
    return run(functools.partial(main_with_args, config_text=config_text, argv=argv), build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
