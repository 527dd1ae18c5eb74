"""notebooks/tour.ipynb: committed without outputs, a valid notebook whose imports resolve, and,
executed (`make tour`, marked slow and tour: `make test` leaves it to that step), every cell runs
and each step shows what its markdown promises.

The executed copy goes to notebooks/runs/tour.executed.ipynb (git-ignored), also when a cell fails,
so the failing cell's traceback can be read there as well as in pytest's report.
"""

import ast
import importlib
import importlib.util
import json
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "notebooks" / "tour.ipynb"
EXECUTED = ROOT / "notebooks" / "runs" / "tour.executed.ipynb"
CELL_TIMEOUT = 900  # seconds a cell may run: the training cell takes about a minute on an idle 2-core CPU
STEPS = ["setup", "train", "sample", "heatmaps", "explorer", "relevance"]  # the code cells' tags, in order


def code_cells(notebook: dict) -> list[dict]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def source(cell: dict) -> str:
    text = cell["source"]
    return text if isinstance(text, str) else "".join(text)


def cell_tagged(notebook: dict, tag: str) -> dict:
    (cell,) = [c for c in code_cells(notebook) if tag in c.get("metadata", {}).get("tags", [])]
    return cell


# ----------------------------------------------------------------------------- as committed


def test_tour_is_committed_without_outputs_or_execution_counts():
    # Plain JSON, no nbformat: this holds with the core install too. Outputs belong to a run
    # (`make tour` writes them to notebooks/runs/), not to the repository.
    notebook = json.loads(TOUR.read_text(encoding="utf-8"))
    dirty = [f"code cell {n} ({cell.get('metadata', {}).get('tags')}): "
             f"{len(cell.get('outputs', []))} outputs, execution_count {cell.get('execution_count')}"
             for n, cell in enumerate(code_cells(notebook))
             if cell.get("outputs") or cell.get("execution_count") is not None]
    assert not dirty, "clear the outputs before committing notebooks/tour.ipynb:\n" + "\n".join(dirty)


def test_tour_is_a_valid_notebook_with_one_tagged_code_cell_per_step():
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[dev]')")
    notebook = nbformat.read(TOUR, as_version=4)
    nbformat.validate(notebook)  # raises ValidationError naming the field
    tags = [tag for cell in code_cells(notebook) for tag in cell.metadata.get("tags", [])]
    assert tags == STEPS


def test_tour_asks_for_the_python3_kernel():
    # "python3" is the kernel of whatever environment runs Jupyter (or `make tour`); a personal
    # kernel name saved by one user's Jupyter would leave everyone else choosing a kernel.
    notebook = json.loads(TOUR.read_text(encoding="utf-8"))
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"


def imported_names(code: str) -> list[tuple[str, str | None]]:
    """(module, name) for each `from module import name`, (module, None) for `import module`."""
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [(node.module, alias.name) for alias in node.names]
    return names


def unresolved(module: str, name: str | None) -> str | None:
    """Why `from module import name` (or `import module`) would fail, or None if it would not."""
    try:
        imported = importlib.import_module(module)
    except ImportError as e:
        return f"{module}: {e}"
    if name is None or hasattr(imported, name):
        return None
    if hasattr(imported, "__path__") and importlib.util.find_spec(f"{module}.{name}"):  # a submodule
        return None
    return f"{module} has no {name}"


def test_every_import_in_the_tour_resolves():
    # Catches a renamed or moved API in seconds, without running the notebook.
    pytest.importorskip("IPython", reason="IPython is not installed (pip install -e '.[dev]')")
    notebook = json.loads(TOUR.read_text(encoding="utf-8"))
    names = [pair for cell in code_cells(notebook) for pair in imported_names(source(cell))]
    assert ("tinyattn.train.loop", "train") in names  # the parse found the imports
    failures = [why for why in (unresolved(module, name) for module, name in names) if why]
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- executed


def tour_kernel():
    """A manager for the native python3 kernel, which runs sys.executable (the project's venv
    under `make tour`): a "python3" kernelspec of the user's own Jupyter might name another
    Python, one without tinyattn, so no kernelspec folder is searched."""
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e '.[dev]')")
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    return KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))


def execute(path: Path, out: Path):
    """Run every cell of `path` in a kernel of this interpreter, from the notebook's folder (as
    Jupyter does); write the executed notebook to `out`, also when a cell raises."""
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[dev]')")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[dev]')")

    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, km=tour_kernel(), timeout=CELL_TIMEOUT,
                                     resources={"metadata": {"path": str(path.parent)}})
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        client.execute(cleanup_kc=True)  # shut the kernel down: nbclient does not for a km it was given
    finally:
        nbformat.write(notebook, out)
    return notebook


def text_of(cell) -> str:
    """Everything a cell printed or displayed as text or HTML."""
    parts = []
    for output in cell.outputs:
        parts.append(output.get("text", ""))
        data = output.get("data", {})
        parts += [data.get("text/html", ""), data.get("text/plain", "")]
    return "".join(parts)


def report(notebook, seconds: float) -> None:
    """Each step's time and its last printed lines (shown by `make tour`, which runs pytest -s)."""
    print(f"\nnotebooks/tour.ipynb executed in {seconds:.0f} s; its executed copy: {EXECUTED.relative_to(ROOT)}")
    for tag in STEPS:
        cell = cell_tagged(notebook, tag)
        timing = cell.metadata.get("execution", {})
        started, done = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        took = ""
        if started and done:
            took = f" {(datetime.fromisoformat(done) - datetime.fromisoformat(started)).total_seconds():.1f} s"
        images = sum("image/png" in o.get("data", {}) for o in cell.outputs)
        text = "".join(o.get("text", "") for o in cell.outputs).rstrip().splitlines()
        print(f"--- {tag}{took}" + (f", {images} images" if images else ""))
        for line in text[-3:]:
            print("    " + line[:160])


@pytest.mark.slow
@pytest.mark.tour
@pytest.mark.timeout(0)  # each cell has a timeout of its own (CELL_TIMEOUT)
def test_the_tour_executes_and_each_step_shows_its_result():
    started = time.perf_counter()
    notebook = execute(TOUR, EXECUTED)  # nbclient raises CellExecutionError on the first cell that does
    report(notebook, time.perf_counter() - started)
    trained = text_of(cell_tagged(notebook, "train"))
    assert "done:" in trained and "best validation loss" in trained
    sample = text_of(cell_tagged(notebook, "sample"))
    assert "ROMEO:" in sample and sample.split("ROMEO:", 1)[1].strip()  # the prompt, then what the model wrote
    heatmaps = cell_tagged(notebook, "heatmaps")
    assert sum("image/png" in o.get("data", {}) for o in heatmaps.outputs) == 2  # one per layer
    assert "query" in text_of(heatmaps)
    explorer = text_of(cell_tagged(notebook, "explorer"))
    assert '<iframe srcdoc="' in explorer and "&lt;script" in explorer  # the whole page, escaped, inline
    relevance = text_of(cell_tagged(notebook, "relevance"))
    assert "rank correlation (Spearman)" in relevance and "Spearman correlation" in relevance


def test_the_tours_kernel_is_this_interpreter_even_with_a_python3_kernelspec_elsewhere(tmp_path, monkeypatch):
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": ["/usr/bin/false", "-f", "{connection_file}"],
                                                  "display_name": "another Python", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    assert tour_kernel().kernel_spec.argv[0] == sys.executable
