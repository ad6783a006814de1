"""The packages import one way, down the layers CONTRIBUTING.md lists: a module imports
only from its own layer or a lower one, and ``import infer`` loads no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import infer

PACKAGE = Path(infer.__file__).parent

# Lowest first; one set per layer.
LAYERS: list[set[str]] = [
    {"config", "speculative_config", "heap", "gil", "text_pieces", "workloads", "routing"},
    {"tokenizer", "contract"},
    {"kernels"},
    {"attention"},
    {"distributed"},
    {"models"},
    {"loader"},
    {"cache"},
    {"engine"},
    {"bench", "kvsim", "dashboard"},
    {"server"},
    {"router"},
    {"cli"},
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def _part(module: str) -> str:
    """``infer.engine.core.runner`` → ``engine``."""
    return module.split(".")[1]


def _imports(path: Path, with_typing_only: bool = True) -> list[str]:
    """The ``infer`` modules ``path`` imports; those under ``if TYPE_CHECKING:`` too unless
    ``with_typing_only`` is False."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if not with_typing_only:
        skipped = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for inner in ast.walk(node)
        }
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [n for n in names if n.startswith("infer.")]


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()}
    parts -= {"__init__", "__pycache__", "py"}
    assert parts - LEVEL.keys() == set()


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if part == "__init__":
            continue
        for name in _imports(path):
            if LEVEL[_part(name)] > LEVEL[part]:
                upward.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert upward == []


# The API process's packages reach the engine only through ``contract`` (and its types, under
# TYPE_CHECKING): the engine process, started by module path, is the one that imports it.
API_SIDE = ("server/http", "server/openai", "server/guards", "server/bridge")
# Modules that import the engine in processes of their own, never in the API process.
ENGINE_IN_OWN_PROCESS = {
    "server/http/grammar_check.py",  # its workers compile grammars as the engine does
    "server/bridge/standin_server.py",  # a server over the stand-in engine (tests, benchmarks)
}


def test_the_api_side_of_the_server_imports_no_engine() -> None:
    found = []
    for folder in API_SIDE:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            module = path.relative_to(PACKAGE).as_posix()
            if module in ENGINE_IN_OWN_PROCESS:
                continue
            found += [
                f"{module} imports {n}"
                for n in _imports(path, with_typing_only=False)
                if _part(n) == "engine"
            ]
    assert found == []


def _loaded(code: str, modules: set[str]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``code``."""
    probe = f"import sys; {code}; print(sorted({modules!r} & sys.modules.keys()))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return list(ast.literal_eval(done.stdout.strip()))


def test_import_infer_and_sampling_params_loads_neither_torch_nor_llguidance() -> None:
    code = "from infer import SamplingParams; SamplingParams(max_tokens=4)"
    assert _loaded(code, {"torch", "llguidance"}) == []


def test_the_routing_policy_loads_neither_torch_nor_the_http_stack() -> None:
    code = "from infer.routing import CacheAwarePolicy; CacheAwarePolicy().add_worker('a')"
    assert _loaded(code, {"torch", "fastapi", "httpx"}) == []


def test_the_contract_loads_neither_torch_transformers_llguidance_nor_numpy() -> None:
    modules = sorted(path.stem for path in (PACKAGE / "contract").glob("*.py"))
    code = "; ".join(f"import infer.contract.{name}" for name in modules)
    assert _loaded(code, {"torch", "transformers", "llguidance", "numpy"}) == []
