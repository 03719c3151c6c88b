"""Pipelines: the warm cache (``cache``), one batch through SDXL or FLUX (``generate``), speed
levers (``speedups``), the preset models (``models``), download/load progress (``loading``)
and the interface a generation backend offers the job function (``backend``).

Imports torch and diffusers; may import ``common``, never the RQ side,
so a pipeline can be driven (benchmarks, xDiT ranks) without Redis."""
