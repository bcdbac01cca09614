"""Layers, one per file, each with forward and backward side by side."""

from .activation import Activation
from .base import Layer, Parameter, WeightBiasLayer
from .batchnorm import BatchNorm
from .conv2d import Conv2D
from .dense import Dense
from .dropout import Dropout
from .global_average_pooling import GlobalAveragePooling
from .loss import LossLayer
from .mse import MSE
from .pooling import Pooling
from .softmax import Softmax

LAYER_TYPES = {
    "dense": Dense,
    "activation": Activation,
    "softmax": Softmax,
    "mse": MSE,
    "conv2d": Conv2D,
    "pooling": Pooling,
    "dropout": Dropout,
    "batchnorm": BatchNorm,
    "global_average_pooling": GlobalAveragePooling,
}

__all__ = ["Activation", "BatchNorm", "Conv2D", "Dense", "Dropout", "GlobalAveragePooling", "Layer", "LossLayer", "MSE", "Parameter", "Pooling", "Softmax",
           "WeightBiasLayer", "LAYER_TYPES"]
