"""``python -m worker.group`` with the test faults of :mod:`faults`, for torchrun in tests/test_group.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

if __name__ == "__main__":
    from faults import install_group_faults

    install_group_faults()
    from worker.group.cli import main

    main()
