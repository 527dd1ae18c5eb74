"""Imports flow one way: a module may import only modules of a lower layer (or its own).

The layers, bottom to top, as the README's layout section states them. A module missing
from this table fails the test too, so a new module must be given its place.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = [
    {"errors", "timing", "seeding", "distributed"},  # no tinyattn imports at all
    {"files", "kv_cache"},
    {"config", "plotting", "download", "run_folder", "cpu"},
    {"tokenizer", "runtime"},
    {"model", "optim", "sources", "hf"},  # sources cuts text where the tokenizer allows
    {"splits", "token_cache"},
    {"data"},  # prepare_data, the batch sampler and evaluation windows, over sources and the cache
    {"checkpoint", "generate", "packing", "evaluate", "attention_maps"},
    {"relevance"},  # token and head ablation, measured beside attention_maps' weights
    {"explorer"},  # the HTML page of the weights and the relevance
    {"finetune", "trainer"},  # train.init_from's source; the step and the owners the loop calls
    {"resume", "budget"},  # what a run continues from and where it writes; its step count
    {"train_log"},  # what a run shows: console, TensorBoard, train.log
    {"train"},
    {"bench"},
    {"cli"},  # tinyattn/cli/*: argument parsing for the commands
]
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT / "tinyattn").with_suffix("").parts
    return "cli" if parts[0] == "cli" else parts[0]


def tinyattn_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tinyattn":
            names = [node.module] if node.module != "tinyattn" else [f"tinyattn.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "tinyattn"]
        found.update(name.split(".")[1] for name in names if "." in name)
    return found


MODULES = sorted(p for p in (ROOT / "tinyattn").rglob("*.py") if p.name != "__init__.py" or p.parent.name == "cli")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_higher_layer(path):
    name = module_name(path)
    assert name in LAYER_OF, f"{name} has no layer in tests/test_layering.py: give it one"
    for imported in tinyattn_imports(path):
        assert imported in LAYER_OF, f"{path.name} imports tinyattn.{imported}, which has no layer"
        if imported == name:
            continue
        assert LAYER_OF[imported] < LAYER_OF[name], (
            f"{path.relative_to(ROOT)} (layer {LAYER_OF[name]}: {name}) imports tinyattn.{imported} "
            f"(layer {LAYER_OF[imported]}): imports must flow downwards")


def test_the_check_catches_an_upward_import(tmp_path):
    fake = tmp_path / "model.py"
    fake.write_text("from tinyattn.train import Trainer\n", encoding="utf-8")
    assert tinyattn_imports(fake) == {"train"} and LAYER_OF["train"] > LAYER_OF["model"]


MAX_FUNCTION_LINES = 60


def test_no_function_in_the_package_is_longer_than_a_screen():
    """Every function and method of tinyattn/ fits in 60 lines, from `def` to its last line."""
    long = []
    for path in MODULES + [ROOT / "tinyattn" / "__init__.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split into named steps: " + ", ".join(long)
