"""Exception types. Every error the package raises on purpose derives from CudnnnetError.

The command-line tools turn a ``UsageError`` (bad config, bad data, bad checkpoint, bad image) into
one line on stderr and exit code 2, and any other ``CudnnnetError`` into one line and exit code 1.
"""


class CudnnnetError(Exception):
    """Base class of every error cudnnnet raises deliberately."""


class UsageError(CudnnnetError):
    """The user gave something invalid: a config, a data file, a checkpoint, an image, a flag."""


class ConfigError(UsageError):
    """A YAML config is malformed; the message names the file and the key."""


class DataError(UsageError):
    """A dataset file is missing, truncated, of the wrong format or has a wrong checksum."""


class CheckpointError(UsageError):
    """A checkpoint is missing, corrupt, pickled, or does not fit the network."""


class ImageError(UsageError):
    """An image file cannot be read or holds no usable digit."""


class InvalidArgumentError(UsageError, ValueError):
    """A function or layer was given an argument outside its valid range; the message says what is valid."""


class ShapeError(UsageError, ValueError):
    """A tensor or layer received a shape it cannot take; the message names the layer and both shapes."""


class OutputInUseError(UsageError):
    """Another training is writing into the output folder asked for."""


class OutputExistsError(UsageError):
    """The output folder asked for holds the published outputs of an earlier training, which this
    run would replace without being told to (resume it or overwrite it)."""


class ExportError(UsageError):
    """A network cannot be written in the format asked for (a layer or setting it cannot express)."""


class MissingExtraError(UsageError):
    """A feature needs an optional dependency that is not installed; the message names the extra."""


class WriteError(CudnnnetError):
    """A file could not be written (a full disk, a lost permission): a runtime failure, not bad input."""


class DTypeError(UsageError, TypeError):
    """A tensor's dtype is not one a call takes (a 16-bit tensor given to a float32-only verb); the message
    names the call, the dtype and what would be valid."""


class TensorSizeError(ShapeError):
    """A tensor, or a model's tensors together, would be larger than the libraries or the machine can hold."""


class TrainingError(CudnnnetError):
    """Training cannot go on (for example the loss became NaN or infinite)."""


class DeviceError(CudnnnetError):
    """No usable GPU, a missing CUDA library, or a device-side failure."""


class DeviceUnavailableError(DeviceError, UsageError):
    """``--device cuda`` was asked for where no usable GPU or CUDA library is present."""


class OutOfMemoryError(DeviceError):
    """The GPU ran out of memory. ``function`` and ``status_name`` name the failing call where known."""

    def __init__(self, message: str, function: str | None = None, status_name: str | None = None):
        self.function, self.status_name = function, status_name
        super().__init__(message)


class DeviceInitError(DeviceError):
    """The GPU is present but could not be initialised (its context, stream or library handles)."""


class _LibraryStatusError(DeviceError):
    """A library call returned a failure status. Carries the function and the status name."""

    library = "library"

    def __init__(self, function: str, status: int, status_name: str, detail: str = ""):
        self.function = function
        self.status = status
        self.status_name = status_name
        message = f"{function} failed with {status_name} ({status})"
        if detail:
            message += f": {detail}"
        super().__init__(message)


class CudaError(_LibraryStatusError):
    """A CUDA runtime or driver call failed."""

    library = "CUDA"


class CublasError(_LibraryStatusError):
    """A cuBLAS call failed."""

    library = "cuBLAS"


class CudnnError(_LibraryStatusError):
    """A cuDNN call failed."""

    library = "cuDNN"


class NcclError(_LibraryStatusError):
    """An NCCL call failed (the message carries NCCL's own last error where it has one)."""

    library = "NCCL"


class DistributedError(CudnnnetError):
    """Training over several processes cannot start or go on: the launcher's environment, the
    rendezvous, a mismatched config or a rank that stopped answering; the message names the rank."""


class NvrtcError(_LibraryStatusError):
    """NVRTC could not compile one of our kernels; the message carries the compile log."""

    library = "NVRTC"
