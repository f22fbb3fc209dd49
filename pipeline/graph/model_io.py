"""Load and save ONNX models with errors that name the file, and deterministic bytes."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from pipeline.errors import PackError
from pipeline.source.identify import stand_in

# Protobuf cannot hold more than 2 GiB; larger models must keep weights as external data.
PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: Path) -> onnx.ModelProto:
    """Load a model and any external data beside it."""
    if not path.exists():
        raise PackError(f"{path}: no such file; check the path or the recipe's source")
    if not path.is_file():
        raise PackError(f"{path}: not a file; point at the .onnx model itself")
    found = stand_in(path)
    if found:
        raise PackError(f"{path}: {found[0]}; {found[1]}")
    try:
        model = onnx.load(str(path), load_external_data=True)
    except PermissionError:
        raise PackError(f"{path}: permission denied; make the file readable") from None
    except (DecodeError, RuntimeError, ValueError) as error:
        raise PackError(f"{path}: not a readable ONNX model ({str(error).splitlines()[0][:200]}); the file may be truncated, re-download it") from None
    except FileNotFoundError as error:
        raise PackError(f"{path}: external data file missing ({error.filename}); put it beside the model") from None
    except onnx.checker.ValidationError as error:  # onnx's word for unreadable external data
        raise PackError(f"{path}: external data cannot be read ({str(error).splitlines()[0][:200]}); put the data file beside the model") from None
    except OSError as error:
        raise PackError(f"{path}: cannot read ({error.strerror}); check the file") from None
    if not model.graph.node and not model.graph.output:
        raise PackError(f"{path}: parsed as an empty ONNX model; the file is probably truncated or not ONNX")
    return model


def model_bytes(model: onnx.ModelProto) -> bytes:
    """Serialized bytes; deterministic for equal models (protobuf deterministic mode)."""
    if model.ByteSize() > PROTOBUF_LIMIT:
        raise PackError(f"model '{model.graph.name}' is over 2 GiB; export it with external data, which pack does not ship yet")
    return model.SerializeToString(deterministic=True)


def save_model(model: onnx.ModelProto, path: Path) -> None:
    path.write_bytes(model_bytes(model))
