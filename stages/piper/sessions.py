"""onnxruntime sessions for the Piper voice's graphs, with their optimized forms cached across worker restarts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from stagevisor.stages.piper.graphs import GRAPH_REVISION


def session_options(threads: int) -> Any:
    """onnxruntime options computing on `threads` threads, one operator at a time."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    return opts


def cache_key(model_path: Path) -> str:
    """Names the optimized graphs of one voice file under one onnxruntime version."""
    import hashlib

    import onnxruntime

    stat = model_path.stat()
    text = f"{model_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{onnxruntime.__version__}|{GRAPH_REVISION}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def open_session(graph: bytes | Callable[[], bytes], threads: int, cached: Path | None, options: Any = None) -> Any:
    """An onnxruntime session for `graph`; with `cached`, its optimized form is saved there and reused.

    `graph` may be a function that returns it: called only when there is no
    usable cached file (cutting the voice graph costs a worker half a second).

    onnxruntime spends most of a session's creation optimizing the graph. The
    first worker saves the optimized graph; a restarted one loads it with
    optimization off, which runs the same kernels (the audio is bit-identical)
    in a fraction of the time. The file is written under a temporary name and
    renamed, so a reader never sees half of it; one that fails to load is
    rebuilt. `options`: session options to use instead of session_options(threads).
    """
    import onnxruntime

    providers = ["CPUExecutionProvider"]
    if cached is not None and cached.is_file():
        opts = options or session_options(threads)
        opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return onnxruntime.InferenceSession(str(cached), opts, providers=providers)
        except Exception:  # a damaged file: optimize again below and replace it
            pass
    if callable(graph):
        graph = graph()
    opts = options or session_options(threads)
    opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    if cached is None:
        return onnxruntime.InferenceSession(graph, opts, providers=providers)
    cached.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = cached.with_name(f".{cached.name}.{os.getpid()}")
    opts.optimized_model_filepath = str(partial)
    # Optimizations for this machine's CPU are expected here: the file never leaves it.
    opts.log_severity_level = 3
    session = onnxruntime.InferenceSession(graph, opts, providers=providers)
    try:
        os.replace(partial, cached)
    except OSError:
        partial.unlink(missing_ok=True)
    return session
