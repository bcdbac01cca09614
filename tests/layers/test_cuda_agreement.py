"""Every layer on CUDA agrees with the host backend: same weights, same inputs, every output and
gradient, in both engines (the ``engine`` fixture); each convolution engine (cuDNN's algorithms, our
explicit-GEMM convolution) is run explicitly, not whichever the timer picks."""

import numpy as np
import pytest

from cudnnnet import Tensor
from cudnnnet.layers import MSE, Activation, Conv2D, Dense, Pooling, Softmax
from layer_checks import build, relative_error

pytestmark = pytest.mark.gpu

BATCHES = [1, 7, 255, 256, 1000]
LAYERS = {
    "dense": (lambda: Dense("fc", 37), (5, 3, 3)),
    "relu": (lambda: Activation("act", "relu"), (3, 5, 4)),
    "sigmoid": (lambda: Activation("act", "sigmoid"), (3, 5, 4)),
    "tanh": (lambda: Activation("act", "tanh"), (3, 5, 4)),
    "clipped_relu": (lambda: Activation("act", "clipped_relu", 0.5), (3, 5, 4)),
    "elu": (lambda: Activation("act", "elu", 0.8), (3, 5, 4)),
    "conv": (lambda: Conv2D("conv", 6, 5), (3, 12, 12)),
    "conv_stride_pad": (lambda: Conv2D("conv", 5, 3, stride=2, padding=1), (4, 11, 9)),
    "conv_dilation": (lambda: Conv2D("conv", 4, 3, stride=1, padding=2, dilation=2), (2, 10, 10)),
    "maxpool": (lambda: Pooling("pool", 2, 0, 2, "max"), (4, 10, 10)),
    "maxpool_overlap_pad": (lambda: Pooling("pool", 3, 1, 2, "max"), (4, 9, 9)),
    "avgpool": (lambda: Pooling("pool", 2, 0, 2, "average"), (4, 10, 10)),
    "avgpool_pad": (lambda: Pooling("pool", 3, 1, 2, "average"), (4, 9, 9)),
}


def run_layer(factory, sample_shape, backend, x, dy):
    layer = build(factory(), sample_shape, backend, seed=3)
    layer.gradient_stop = False
    output = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    grad_input = layer.backward(Tensor.from_numpy(dy, backend)).numpy()
    return output, grad_input, {p.name: p.grad.numpy() for p in layer.parameters()}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_layer_agrees_with_host(cuda, host, kind, batch, engine):
    factory, sample_shape = LAYERS[kind]
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch,) + sample_shape).astype(np.float32)
    output_shape = (batch,) + factory().output_sample_shape(sample_shape)
    dy = rng.standard_normal(output_shape).astype(np.float32)
    on_host = run_layer(factory, sample_shape, host, x, dy)
    on_cuda = run_layer(factory, sample_shape, cuda, x, dy)
    assert relative_error(on_cuda[0], on_host[0]) < 1e-5, "forward output"
    assert relative_error(on_cuda[1], on_host[1]) < 1e-5, "grad_input"
    for name, grad in on_host[2].items():
        assert relative_error(on_cuda[2][name], grad) < 1e-5, name


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("layer_class", [Softmax, MSE])
def test_loss_layer_agrees_with_host(cuda, host, layer_class, batch, engine):
    rng = np.random.default_rng(batch)
    x = (rng.standard_normal((batch, 10)) * 4).astype(np.float32)
    target = np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]
    results = []
    for backend in (host, cuda):
        layer = build(layer_class("loss"), (10, 1, 1), backend)
        output = layer.forward(Tensor.from_numpy(x, backend)).numpy()
        target_tensor = Tensor.from_numpy(target, backend)
        loss = layer.loss(target_tensor, Tensor.zeros((1,), backend)).item()
        correct = layer.correct(target_tensor, Tensor.zeros((1,), backend)).item()
        grad = layer.backward(target_tensor).numpy()
        results.append((output, loss, correct, grad))
    (host_out, host_loss, host_correct, host_grad), (cuda_out, cuda_loss, cuda_correct, cuda_grad) = results
    assert relative_error(cuda_out, host_out) < 1e-5
    assert cuda_loss == pytest.approx(host_loss, rel=1e-5)
    assert cuda_correct == host_correct
    assert relative_error(cuda_grad, host_grad) < 1e-5


CONVOLUTIONS = sorted(kind for kind in LAYERS if kind.startswith("conv"))


def forced_plans(cuda, convolution_engine: str):
    """CudaBackend.convolution_plan giving plans that run ``convolution_engine`` in every direction:
    "cudnn" (cuDNN's first exact choice, cudnnGet*_v7) or "gemm" (our explicit-GEMM convolution)."""
    from cudnnnet.backends.cuda import backend as cuda_backend, convolution

    def plan(desc, x_shape, y_shape):
        args = (cuda.context.cudnn.handle, cuda.context.descriptors, desc, tuple(x_shape), tuple(y_shape), cuda.precision,
                cuda_backend.MATH_MODES[cuda.precision][1], cuda.workspace_limit)
        if convolution_engine == "cudnn":
            made = convolution.make_plan(*args, "heuristic", gemm_candidate=False)
        else:
            gemm = convolution.Algorithm(convolution.GEMM_ALGORITHM, 0)
            made = convolution.plan_with(*args, {name: gemm for name in convolution.DIRECTION_NAMES})
        cuda.context.workspace(made.workspace_bytes)
        cuda.context.ones(x_shape[0])
        return made

    return plan


@pytest.mark.parametrize("batch", [1, 7, 256])
@pytest.mark.parametrize("convolution_engine", ["cudnn", "gemm"])
@pytest.mark.parametrize("kind", CONVOLUTIONS)
def test_each_convolution_engine_agrees_with_host(cuda, host, kind, convolution_engine, batch, monkeypatch):
    from cudnnnet.backends.cuda import convolution

    factory, sample_shape = LAYERS[kind]
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch,) + sample_shape).astype(np.float32)
    dy = rng.standard_normal((batch,) + factory().output_sample_shape(sample_shape)).astype(np.float32)
    monkeypatch.setattr(cuda, "convolution_plan", forced_plans(cuda, convolution_engine))
    layer = build(factory(), sample_shape, cuda, seed=3)
    layer.gradient_stop = False
    on_cuda = (layer.forward(Tensor.from_numpy(x, cuda)).numpy(), layer.backward(Tensor.from_numpy(dy, cuda)).numpy(),
               {p.name: p.grad.numpy() for p in layer.parameters()})
    algorithms = {getattr(layer.plan, name).algo == convolution.GEMM_ALGORITHM for name in convolution.DIRECTION_NAMES}
    assert algorithms == {convolution_engine == "gemm"}, layer.plan
    on_host = run_layer(factory, sample_shape, host, x, dy)
    assert relative_error(on_cuda[0], on_host[0]) < 1e-5, "forward output"
    assert relative_error(on_cuda[1], on_host[1]) < 1e-5, "grad_input"
    for name, grad in on_host[2].items():
        assert relative_error(on_cuda[2][name], grad) < 1e-5, name
