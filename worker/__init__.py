"""The worker: warm diffusion pipelines that drain a Redis queue. Its rooms, by concern
(docs/architecture.md draws them and their import rules):

- ``serving/``: the RQ side (worker class, job function, recovery, failures, signals);
- ``pipelines/``: loading, generating, speed levers, presets;
- ``output/``: writing images and metadata;
- ``supervision/``: the per-GPU launcher and GPU leases;
- ``group/``: xDiT worker groups under torchrun;
- ``cli.py`` (the ``worker`` command), ``task.py`` (the queued jobs' address). Fault injection
  lives in the tests (``tests/faults.py``), which wrap the shipped worker.
"""
