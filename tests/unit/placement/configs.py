"""Pipeline configs the placement tests share."""

from __future__ import annotations

PIPELINE_WITH_TP = """\
pipeline:
  name: tp-demo
  stages:
    - {name: preprocessing, process: front, factory: "m:f", next: engine}
    - name: engine
      factory: "m:f"
      gpu: [0, 1]
      tp_size: 2
      runtime: {resources: {total_gpu_memory_fraction: 0.5}}
      next: vocoder
    - {name: vocoder, process: vocoder, factory: "m:f", gpu: 0,
       runtime: {resources: {total_gpu_memory_fraction: 0.2}}}
"""
"""A tensor-parallel engine (two ranks on GPUs 0 and 1) between a CPU front and a vocoder on GPU 0."""
