"""The package rules: imports flow one way, from the periphery down to the core.

    errors <- system <- config <- model <- data <- checkpoint <- {generate, analysis, hf, train} <- {lab, serve} <- cli

A package may import its own modules and those of the packages to its left; the four on
the same level do not import one another, with the one exception named in LAZY_EXCEPTIONS
(an import inside a function, so importing the package never loads the other). `cli`
imports anything. The README's layout section states the same rules.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ORDER = ["errors", "system", "config", "model", "data", "checkpoint"]
TOP = ["generate", "analysis", "hf", "train"]
ALLOWED = {name: set(ORDER[:i]) for i, name in enumerate(ORDER)}
ALLOWED.update({name: set(ORDER) for name in TOP})
# gguf (GGUF files for llama.cpp) sits above hf: it reuses hf.convert's split of the stacked
# matrices and its RMSNorm epsilon, the route llama.cpp's own converter takes (HF -> GGUF).
ALLOWED["gguf"] = set(ORDER) | {"hf"}
ALLOWED["lab"] = set(ORDER) | set(TOP)  # the chapter's experiments train, generate and analyse
ALLOWED["serve"] = set(ORDER) | set(TOP)  # the server generates and shows the explorer
ALLOWED["cli"] = set(ORDER) | set(TOP) | {"lab", "gguf", "serve"}
ALLOWED["__main__"] = {"cli"}  # tinyattn/__main__.py: `python -m tinyattn` runs the tinyattn command
# (importer, imported): allowed only inside a function, never at the top of a module.
LAZY_EXCEPTIONS = {
    ("train", "hf"),  # train.init_from naming a Hugging Face folder (train/finetune.py)
}
KNOWN_VIOLATIONS: set = set()  # none left: what an evaluation shows is a hook (train/hooks.py)


def package_of(path: Path) -> str:
    return path.relative_to(ROOT / "tinyattn").with_suffix("").parts[0]


def tinyattn_imports(path: Path) -> list[tuple[str, bool]]:
    """(package, at module level?) for every tinyattn import in the file."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tinyattn":
            names = [node.module] if node.module != "tinyattn" else [f"tinyattn.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "tinyattn"]
        found.extend((name.split(".")[1], id(node) in top_level) for name in names if "." in name)
    return found


MODULES = sorted(p for p in (ROOT / "tinyattn").rglob("*.py") if p.parent != ROOT / "tinyattn"
                 or p.name != "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_against_the_package_rules(path):
    package = package_of(path)
    assert package in ALLOWED, f"{package} has no place in tests/test_layering.py: give it one"
    for imported, at_top in tinyattn_imports(path):
        if imported == package or imported in ALLOWED[package] or (package, imported) in KNOWN_VIOLATIONS:
            continue
        lazy_ok = (package, imported) in LAZY_EXCEPTIONS and not at_top
        assert lazy_ok, (f"{path.relative_to(ROOT)} ({package}) imports tinyattn.{imported}: "
                         f"{package} may import only {sorted(ALLOWED[package])}")


def test_the_check_catches_an_upward_import(tmp_path):
    fake = tmp_path / "attention.py"
    fake.write_text("from tinyattn.train.loop import train\n", encoding="utf-8")
    assert tinyattn_imports(fake) == [("train", True)] and "train" not in ALLOWED["model"]


MAX_FUNCTION_LINES = 50
MAX_POSITIONAL = 5  # beyond that, a call site cannot be read without the signature: use keyword-only


def functions(paths):
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path, node


CODE = MODULES + sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))


def test_no_function_is_longer_than_a_screen():
    """Every function and method outside tests/ fits in 50 lines, from `def` to its last line."""
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, node in functions(CODE) if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "split into named steps: " + ", ".join(long)


def test_no_function_takes_more_than_five_positional_parameters():
    many = []
    for path, node in functions(CODE):
        positional = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
        if len(positional) > MAX_POSITIONAL:
            many.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({', '.join(positional)})")
    assert not many, "make the later ones keyword-only (after *): " + "; ".join(many)
