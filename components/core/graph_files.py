"""A graph's files: `model.onnx`, and its weights in `model.onnx.data` beside it when they pass
what one protobuf file holds (2 GB; a 0.5B-parameter decoder in fp32 is 2 GB). The data file's
name is written inside the graph, so a graph renamed is saved again, never copied under a new
name alone."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ortpack.kernel.bundle import DATA_SUFFIX

# Weights beyond this go to a data file: one protobuf file holds at most 2 GB, with room for the graph
EXTERNAL_DATA_BYTES = 1_800_000_000


def data_file(graph: Path) -> Path:
    return graph.with_name(graph.name + DATA_SUFFIX)


def graph_files(graph: Path) -> list[Path]:
    """The graph's file and, where it has one, its data file."""
    return [graph, *([data_file(graph)] if data_file(graph).is_file() else [])]


def needs_external_data(model: Any) -> bool:
    """Whether a graph's weights are past what one protobuf file holds (with a margin)."""
    return sum(t.ByteSize() for t in model.graph.initializer) > EXTERNAL_DATA_BYTES


def copy_graph(src: Path, dst: Path) -> None:
    """Copy a graph and its data file; under another name, the graph is saved again so that it
    names its new data file (the data file's name is written inside the graph)."""
    import onnx

    if not data_file(src).is_file():
        shutil.copyfile(src, dst)
    elif src.name == dst.name:
        shutil.copyfile(src, dst)
        shutil.copyfile(data_file(src), data_file(dst))
    else:
        model = onnx.load(str(src))
        onnx.save(
            model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True, location=data_file(dst).name
        )


def remove_graph(graph: Path) -> None:
    for file in (graph, data_file(graph)):
        file.unlink(missing_ok=True)


def save_graph(graph: Any, path: Path) -> list[Path]:
    """Save `graph` at `path`, its weights in `path` + ".data" when they pass EXTERNAL_DATA_BYTES;
    returns the files written."""
    import onnx

    size = sum(t.ByteSize() for t in graph.graph.initializer)
    data = path.with_name(path.name + DATA_SUFFIX)
    if data.exists():
        data.unlink()
    if size <= EXTERNAL_DATA_BYTES:
        onnx.save(graph, str(path))
        return [path]
    onnx.save(graph, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name)
    return [path, data]
