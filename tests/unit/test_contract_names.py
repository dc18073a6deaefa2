"""The environment between an image's scripts and its stacks is declared once, in contract.py: the
names the image side spells (dockerfiles/) are exactly the declared ones, and no other module spells one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from builder import contract

ROOT = Path(__file__).resolve().parents[2]
DECLARED = {
    contract.NUMA_ENV,
    contract.HUGETLBFS_ENV,
    contract.API_KEY_FILE_ENV,
    contract.ROUTER_PRESET_ENV,
    contract.PROMETHEUS_CONFIG_ENV,
    contract.PROMPTS_ENV,
    contract.SLOTS_ENV,
    contract.PROMPTS_QUIET_ENV,
    contract.PROMPTS_MAX_ENV,
    contract.SWITCH_INTERVAL_ENV,
    *contract.IMAGE_ENV,
}


def test_the_image_side_spells_exactly_the_declared_names() -> None:
    spelled = {
        name
        for path in (ROOT / "dockerfiles").rglob("*")
        if path.is_file()
        for name in re.findall(r"MOE_STACK_[A-Z_]+", path.read_text(errors="replace"))
    }
    assert spelled == DECLARED


def test_no_module_but_the_contract_spells_one() -> None:
    spelling = []
    for path in (ROOT / "builder").rglob("*.py"):
        if path.name == "contract.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and set(re.findall(r"\bMOE_STACK_[A-Z_]+\b", node.value)) & DECLARED
            ):
                spelling.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not spelling, spelling
