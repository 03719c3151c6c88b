"""The worker: warm diffusion pipelines that drain a Redis queue. Its rooms, by concern
(docs/architecture.md draws them and their import rules):

- ``serving/``: the RQ side (worker class, job function, recovery, failures, signals);
- ``pipelines/``: loading, generating, speed levers, presets;
- ``output/``: writing images and metadata;
- ``supervision/``: the per-GPU launcher and GPU leases;
- ``group/``: xDiT worker groups under torchrun;
- ``cli.py`` (the ``worker`` command), ``task.py`` (the queued jobs' address), ``faults.py``
  (fault injection for tests, off unless a ``DIFFQ_FAULT_*`` setting asks).
"""
