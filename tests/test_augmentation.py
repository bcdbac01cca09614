"""The training batches' random crop and flip (cudnnnet/augmentation.py): its draws and crops on the
host against an independent padded-crop formulation, the CUDA kernel against the host bit for bit,
the step counter on the device (graph replays draw fresh crops), streamed against resident data,
and a resumed run drawing the crops of an uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnnet import augmentation
from cudnnnet.augmentation import augment, draws
from cudnnnet.config.schema import AugmentConfig, parse_config
from cudnnnet.data.resident import ResidentData
from cudnnnet.data.streamed import StreamedData
from cudnnnet.errors import InvalidArgumentError, ShapeError
from cudnnnet.tensor import Tensor
from cudnnnet.train.trainer import Trainer
from run_helpers import interrupted_then_resumed

CLASSES = 10


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def distinct_images(count: int, channels: int, height: int, width: int) -> np.ndarray:
    """float32 (N, C, H, W) of distinct non-zero values, so that a copied pixel names where it came from."""
    return np.arange(1, 1 + count * channels * height * width, dtype=np.float32).reshape(count, channels, height, width)


def padded_crop(image: np.ndarray, dy: int, dx: int, flipped: bool, padding: int) -> np.ndarray:
    """The crop at (P + dy, P + dx) of ``image`` (C, H, W) zero-padded by P, then mirrored left-right
    where ``flipped``: the way torchvision's RandomCrop(padding) + RandomHorizontalFlip describe it."""
    channels, height, width = image.shape
    padded = np.pad(image, ((0, 0), (padding, padding), (padding, padding)))
    crop = padded[:, padding + dy:padding + dy + height, padding + dx:padding + dx + width]
    return crop[:, :, ::-1] if flipped else crop


# ---- the draws and the crop, on the host -------------------------------------------------------
@pytest.mark.parametrize("padding, flip", [(0, True), (1, False), (4, True), (6, True)])
@pytest.mark.parametrize("shape", [(1, 5, 7), (3, 8, 8), (3, 4, 9)])
def test_each_augmented_sample_is_a_zero_padded_crop_flipped_as_drawn(padding, flip, shape):
    images = distinct_images(24, *shape)
    out = augment(images, seed=3, step=17, padding=padding, flip=flip)
    dy, dx, flipped = draws(3, 17, 24, padding, flip)
    assert out.dtype == np.float32 and out.shape == images.shape
    for b in range(24):
        np.testing.assert_array_equal(out[b], padded_crop(images[b], int(dy[b]), int(dx[b]), bool(flipped[b]), padding))
    assert (np.abs(dy) <= padding).all() and (np.abs(dx) <= padding).all()
    assert flip or not flipped.any()
    assert not np.signbit(out).any()  # the padding is +0.0 (the kernel's bits), never -0.0


def test_the_draws_are_uniform_offsets_and_fair_flips():
    padding, count = 3, 7000
    dy, dx, flipped = draws(11, 5, count, padding, True)
    for offsets in (dy, dx):
        counts = np.bincount(offsets + padding, minlength=2 * padding + 1)
        assert counts.size == 2 * padding + 1  # every offset in [-P, P], each drawn
        assert np.all(np.abs(counts - count / counts.size) < 0.1 * count / counts.size), counts
    assert abs(flipped.mean() - 0.5) < 0.03
    assert abs(np.corrcoef(dy, dx)[0, 1]) < 0.05 and abs(np.corrcoef(dy, flipped)[0, 1]) < 0.05


def test_the_same_seed_and_step_draw_the_same_crops_and_others_differ():
    images = distinct_images(32, 3, 8, 8)
    first = augment(images, seed=1, step=40, padding=4, flip=True)
    np.testing.assert_array_equal(augment(images, seed=1, step=40, padding=4, flip=True), first)
    assert not np.array_equal(augment(images, seed=1, step=41, padding=4, flip=True), first)
    assert not np.array_equal(augment(images, seed=2, step=40, padding=4, flip=True), first)
    dy, dx, flipped = draws(1, 40, 32, 4, True)
    assert len({(a, b, c) for a, b, c in zip(dy, dx, flipped)}) > 16  # the samples of a batch draw apart


def test_the_hash_is_splitmix64():
    """splitmix64 seeded with 0 gives 0xE220A8397B1DCDAF first (Vigna's reference); mix is its step."""
    assert int(augmentation.mix(np.array([0], np.uint64))[0]) == 0xE220A8397B1DCDAF


# ---- the backends -----------------------------------------------------------------------------
def augmented_gather(backend, images, labels, order, start, batch, step, padding, flip, seed):
    """(x, one-hot target, counter after) of one gather_augmented_batch on ``backend``."""
    tensors = [Tensor.from_numpy(array, backend) for array in (images, labels, order, np.array([start], np.float32))]
    counter = Tensor.from_numpy(np.array([step, 0], np.uint32).view(np.float32), backend)
    x, target = Tensor((batch,) + images.shape[1:], backend), Tensor((batch, CLASSES), backend)
    backend.gather_augmented_batch(*tensors, counter, x, target, padding, flip, seed)
    return x.numpy(), target.numpy().reshape(batch, CLASSES), counter.numpy().reshape(-1).view(np.uint32)


@pytest.mark.parametrize("padding, flip", [(0, True), (1, False), (2, True), (4, True), (7, False)])
@pytest.mark.parametrize("shape, batch", [((1, 28, 28), 33), ((3, 32, 32), 16), ((3, 5, 7), 9), ((1, 3, 1), 50)])
def test_the_augmented_gather_follows_the_host_formula(backend, rng, padding, flip, shape, batch):
    """Both backends: x = augment(images[order[start:start + B]], seed, step), the one-hot labels, and
    the step counter advanced by one. On CUDA this is the host's bits (the oracle) exactly."""
    images = rng.standard_normal((60, *shape)).astype(np.float32)
    labels = rng.integers(0, CLASSES, 60).astype(np.float32)
    order = rng.permutation(60).astype(np.float32)
    start, step, seed = 60 - batch, 123_456, 2**31 - 1
    x, target, counter = augmented_gather(backend, images, labels, order, start, batch, step, padding, flip, seed)
    samples = order[start:].astype(np.int64)
    expected = augment(images[samples], seed, step, padding, flip)
    assert np.array_equal(x.view(np.uint32), expected.view(np.uint32))
    np.testing.assert_array_equal(target, np.eye(CLASSES, dtype=np.float32)[labels[samples].astype(np.int64)])
    assert counter.tolist() == [step + 1, 0]


def test_the_augmented_gather_refuses_bad_operands(backend, rng):
    images = rng.standard_normal((8, 1, 4, 4)).astype(np.float32)
    tensors = [Tensor.from_numpy(a, backend) for a in (images, np.zeros(8), np.arange(8), np.zeros(1))]
    x, target = Tensor((4, 1, 4, 4), backend), Tensor((4, CLASSES), backend)
    with pytest.raises(ShapeError, match="counter must hold 2 values"):
        backend.gather_augmented_batch(*tensors, Tensor((1,), backend), x, target, 2, True, 0)
    with pytest.raises(InvalidArgumentError, match=r"padding must be an integer in \[0, 65535\], got -1"):
        backend.gather_augmented_batch(*tensors, Tensor.zeros((2,), backend), x, target, -1, True, 0)
    with pytest.raises(InvalidArgumentError, match="seed must be an integer"):
        backend.gather_augmented_batch(*tensors, Tensor.zeros((2,), backend), x, target, 2, True, -5)


@pytest.mark.gpu
def test_the_augmented_gather_is_one_launch_the_slides_engine_allows(cuda, rng):
    from cudnnnet.backends.cuda import kernel
    from cudnnnet.engine import SLIDES

    images = rng.standard_normal((20, 3, 6, 6)).astype(np.float32)
    kernel.reset_launches()
    augmented_gather(cuda, images, np.zeros(20, np.float32), np.arange(20, dtype=np.float32), 0, 8, 0, 2, True, 0)
    assert dict(kernel.launches) == {"gather_augmented_batch": 1} and SLIDES.allows_kernel("gather_augmented_batch")


# ---- the data sets: the step each batch draws by ---------------------------------------------------
def resident_batches(data, indices):
    """The (x, target) arrays that select(i) + gather give for each i, in turn."""
    batches = []
    for index in indices:
        x, target = data.select(index)
        data.gather(x, target)
        batches.append((x.numpy(), target.numpy()))
    return batches


def test_resident_batches_draw_by_the_global_step_and_the_counter_follows(backend, rng):
    images = rng.standard_normal((50, 3, 6, 6)).astype(np.float32)
    labels = rng.integers(0, CLASSES, 50)
    order = rng.permutation(50)
    data = ResidentData(backend, images, labels, 16, CLASSES, AugmentConfig(3, True), seed=9)
    data.start_epoch(order, first_step=100)
    for index, (x, _) in zip((0, 1, 3, 2), resident_batches(data, (0, 1, 3, 2))):  # 3 and 2: out of order
        samples = order[16 * index:16 * index + 16]
        np.testing.assert_array_equal(x, augment(images[samples], 9, 100 + index, 3, True))
    assert data.counter.numpy().reshape(-1).view(np.uint32).tolist() == [103, 0]


def test_no_augmentation_or_an_identity_one_gathers_the_plain_batch(backend, rng):
    images = rng.standard_normal((20, 1, 5, 5)).astype(np.float32)
    labels, order = rng.integers(0, CLASSES, 20), rng.permutation(20)
    batches = []
    for augment_config in (None, AugmentConfig(0, False)):
        data = ResidentData(backend, images, labels, 8, CLASSES, augment_config)
        data.start_epoch(order, first_step=7)
        assert data.augment is None
        batches.append(resident_batches(data, (0, 1)))
    for (x, _), (y, _), index in zip(*batches, (0, 1)):
        np.testing.assert_array_equal(x, images[order[8 * index:8 * index + 8]])
        np.testing.assert_array_equal(y, x)


def test_streamed_batches_are_augmented_on_the_host_as_resident_ones_on_the_device(backend, rng):
    images = rng.standard_normal((45, 3, 5, 7)).astype(np.float32)
    labels, order = rng.integers(0, CLASSES, 45), rng.permutation(45)
    augment_config = AugmentConfig(2, True)
    resident = ResidentData(backend, images, labels, 10, CLASSES, augment_config, seed=4)
    streamed = StreamedData(backend, images, labels, 10, CLASSES, augment_config, seed=4)
    for data in (resident, streamed):
        data.start_epoch(order, first_step=30)
    indices = (0, 1, 2, 3, 4)  # the last batch holds 5
    for (x, target), (y, expected) in zip(resident_batches(resident, indices), resident_batches(streamed, indices)):
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
        np.testing.assert_array_equal(target, expected)


@pytest.mark.gpu
def test_graph_replays_draw_fresh_crops_from_the_counter_on_the_device(cuda, rng):
    """The gather captured once: replaying it twice on the same batch draws the crops of two
    consecutive steps, the step advanced by the device alone."""
    images = rng.standard_normal((64, 3, 8, 8)).astype(np.float32)
    labels, order = rng.integers(0, CLASSES, 64), rng.permutation(64)
    data = ResidentData(cuda, images, labels, 32, CLASSES, AugmentConfig(4, True), seed=5)
    data.start_epoch(order, first_step=20)
    x, target = data.select(0)
    with cuda.capture() as graph:
        data.gather(x, target)
    replays = []
    for _ in range(2):
        graph.launch()
        replays.append(x.numpy())
    assert not np.array_equal(replays[0], replays[1])
    for step, replay in zip((20, 21), replays):
        assert np.array_equal(replay.view(np.uint32), augment(images[order[:32]], 5, step, 4, True).view(np.uint32))
    data.select(1)  # the counter is already at step 22: nothing is written, the replay reads it
    graph.launch()
    assert np.array_equal(x.numpy(), augment(images[order[32:]], 5, 22, 4, True))
    assert data.counter.numpy().reshape(-1).view(np.uint32).tolist() == [23, 0]


# ---- the config and the trainer -------------------------------------------------------------------
def small_settings(root, device: str, steps: int, augment) -> dict:
    return {"model": [{"type": "dense", "out_size": 16}, {"type": "activation", "mode": "relu"},
                      {"type": "dense", "out_size": CLASSES}, {"type": "softmax"}],
            "data": {"dataset": "npz", "train_file": str(root / "train.npz"), "test_file": str(root / "test.npz"),
                     "normalize": "computed", "augment": augment},
            "train": {"batch_size": 16, "steps": steps, "seed": 3, "log_every": 1000, "checkpoint_every": "never",
                      "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}},
            "device": device}


def recording(trainer) -> list:
    """The training batches ``trainer`` runs from now on, (global step, x) each, read after the step."""
    batches, selected = [], []
    select, train_batch = trainer.data.select, trainer.train_batch

    def select_and_remember(index):
        x, target = select(index)
        selected[:] = [x]
        return x, target

    def train_and_record(index):
        size = train_batch(index)
        batches.append((trainer.position.step, selected[0].numpy()))
        return size

    trainer.data.select, trainer.train_batch = select_and_remember, train_and_record
    return batches


def test_a_resumed_run_draws_the_augmented_batches_of_an_uninterrupted_one(backend, small_npz, tmp_path):
    """18 steps over three epochs straight, and stopped after step 9 (mid-epoch) then resumed: the
    same crops at every step from 9 on, and the same weights (graph replay on CUDA)."""
    config = parse_config(small_settings(small_npz, backend.name, 18, {"crop_padding": 2, "flip": True}))
    assert config.data.augment == AugmentConfig(2, True)
    straight = Trainer(config, tmp_path / "straight", progress=False)
    straight_batches = recording(straight)
    straight.run()
    resumed = interrupted_then_resumed(config, tmp_path / "resumed", stop_after=9)
    assert resumed.position.batch == 2
    resumed_batches = recording(resumed)
    resumed.run()
    assert [step for step, _ in resumed_batches] == list(range(9, 18))
    for (step, x), (_, y) in zip(straight_batches[9:], resumed_batches):
        assert np.array_equal(x, y), f"step {step}"
    steps_per_epoch = straight.loader.steps_per_epoch
    for step, x in straight_batches:  # each drawn by its global step, not its place in the epoch
        epoch, batch = divmod(step, steps_per_epoch)
        samples = straight.loader.permutation(epoch)[16 * batch:16 * batch + 16]
        np.testing.assert_array_equal(x, augment(straight.train_images[samples], 3, step, 2, True), f"step {step}")
    for name, value in straight.network.state_dict().items():
        np.testing.assert_allclose(resumed.network.state_dict()[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_training_batches_are_augmented_and_the_test_set_is_not(host, small_npz, tmp_path):
    plain = Trainer(parse_config(small_settings(small_npz, "host", 1, False)), tmp_path / "plain", progress=False)
    augmented = Trainer(parse_config(small_settings(small_npz, "host", 1, {"crop_padding": 3, "flip": True})),
                        tmp_path / "augmented", progress=False)
    assert plain.data.augment is None and augmented.data.augment == AugmentConfig(3, True)
    batches = [recording(trainer) for trainer in (plain, augmented)]
    for trainer in (plain, augmented):
        trainer.run()
    (_, x), (_, y) = batches[0][0], batches[1][0]
    np.testing.assert_array_equal(y, augment(x, 3, 0, 3, True))
    for plain_view, augmented_view in zip(plain.test_set.batches(20), augmented.test_set.batches(20)):
        np.testing.assert_array_equal(augmented_view[0].numpy(), plain_view[0].numpy())
