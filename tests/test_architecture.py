"""The package's shape: imports point one way (no cycles), no module is too long, and the library
core does not pull in the tuner, the benchmark or heavy optional stacks when it is imported.

The sources are parsed with :mod:`ast` (nothing is imported). The repo's ``tuner/`` and
``cl_kernels/`` are named as installed, ``clmf.autotune`` and ``clmf.cl_kernels``.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES = 800
# the parts of clmf that are not the library core (they may import anything, lazily or not)
NOT_CORE = ("clmf.bench", "clmf.cli", "clmf.cli_workflow", "clmf.__main__", "clmf.autotune")
# never imported at module level by the library core, directly or through other modules
FORBIDDEN_INTERNAL = ("clmf.autotune", "clmf.bench")
FORBIDDEN_EXTERNAL = ("torch", "dask", "pyspark")


def _under(name, prefixes):
    """Whether the dotted ``name`` is one of ``prefixes`` or inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def source_modules(roots):
    """{module name: path} for every ``.py`` under ``roots`` ({directory: package name})."""
    out = {}
    for directory, package in roots.items():
        for path in sorted(pathlib.Path(directory).rglob("*.py")):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _local_scopes(tree):
    """ids of the import nodes inside a function (or lambda) body."""
    local = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    local.add(id(inner))
    return local


def _resolve(name, modules, aliases):
    """The internal module that ``name`` names (its nearest known ancestor), else None."""
    head, _, rest = name.partition(".")
    if head in aliases:
        name = aliases[head] + ("." + rest if rest else "")
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(modules, aliases=None):
    """Imports of every module: {module: [(target, is_internal, at_module_level, lineno)]}.

    Module-level and function-local imports, absolute and relative; ``from P import x`` counts as
    an import of the module ``P.x`` when that is a module, else of ``P``.
    """
    aliases = aliases or {}
    graph = {}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        local = _local_scopes(tree)
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        edges = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module
                names = [f"{stem}.{a.name}" if _resolve(f"{stem}.{a.name}", modules, aliases)
                         == f"{stem}.{a.name}" else stem for a in node.names]
            else:
                continue
            top = id(node) not in local
            for name in names:
                target = _resolve(name, modules, aliases)
                if target is None:
                    edges.append((name, False, top, node.lineno))
                elif target != mod:
                    edges.append((target, True, top, node.lineno))
        graph[mod] = edges
    return graph


def find_cycles(graph):
    """One cycle (a list of modules, first == last) per strongly connected component."""
    adj = {m: sorted({t for t, internal, _, _ in edges if internal}) for m, edges in graph.items()}
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(set(comp))

    for v in sorted(adj):
        if v not in index:
            strong(v)
    cycles = []
    for comp in sccs:                       # a path back to the start inside the component
        start = min(comp)
        prev, frontier = {start: None}, [start]
        while frontier:
            v = frontier.pop(0)
            for w in adj[v]:
                if w == start:
                    chain = [v]
                    while prev[chain[-1]] is not None:
                        chain.append(prev[chain[-1]])
                    cycles.append([*reversed(chain), start])
                    frontier = []
                    break
                if w in comp and w not in prev:
                    prev[w] = v
                    frontier.append(w)
    return cycles


def forbidden_imports(graph, not_core=NOT_CORE, internal=FORBIDDEN_INTERNAL,
                      external=FORBIDDEN_EXTERNAL):
    """["core module -> ... -> forbidden"]: what the core reaches through module-level imports."""
    bad = []
    for mod in sorted(graph):
        if _under(mod, not_core):
            continue
        prev, frontier = {mod: None}, [mod]
        while frontier:
            v = frontier.pop(0)
            for target, is_internal, top, _ in graph[v]:
                if not top:
                    continue
                hit = (_under(target, internal) if is_internal
                       else target.split(".")[0] in external)
                if hit:
                    chain = [target, v]
                    while prev[chain[-1]] is not None:
                        chain.append(prev[chain[-1]])
                    bad.append(" -> ".join(reversed(chain)))
                elif is_internal and target not in prev:
                    prev[target] = v
                    frontier.append(target)
    return sorted(set(bad))


def _repo_graph():
    """The import graph of the repo's clmf/, tuner/ and cl_kernels/ (as installed)."""
    roots = {REPO / "clmf": "clmf", REPO / "tuner": "clmf.autotune",
             REPO / "cl_kernels": "clmf.cl_kernels"}
    modules = source_modules(roots)
    aliases = {"tuner": "clmf.autotune", "cl_kernels": "clmf.cl_kernels"}
    return modules, import_graph(modules, aliases)


def test_no_import_cycles():
    modules, graph = _repo_graph()
    assert "clmf.model.estimator" in modules and "clmf.autotune.strategies" in modules
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_over_max_lines():
    modules, _ = _repo_graph()
    long = {m: n for m, p in modules.items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_core_does_not_import_tuner_bench_or_heavy_stacks():
    _, graph = _repo_graph()
    bad = forbidden_imports(graph)
    assert not bad, "module-level imports the library core must not make: " + "; ".join(bad)


# the one home of the device rules (issue 32): the grammar, ":all", the worker rank rule, the
# environment variables that pick devices, the "platform | device" label
DEVICE_HOME = "clmf.engine.device"
DEVICE_ENV_NAMES = ("CLMF_DEVICE", "PYOPENCL_CTX", "CLMF_REQUIRE_PLATFORMS")


def _reads(node, names):
    """Whether an expression reads one of ``names`` (``x.platform``, ``x["platform"]``,
    ``platform``)."""
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Attribute) and sub.attr in names
                or isinstance(sub, ast.Constant) and sub.value in names
                or isinstance(sub, ast.Name) and sub.id in names):
            return True
    return False


def device_rule_sites(modules):
    """["module:line what"]: device rules written outside :data:`DEVICE_HOME` — a "platform |
    device" label built by hand (an f-string joining a platform to the next value by " | ", or a
    "%s | %s" format), an environment variable of :data:`DEVICE_ENV_NAMES` named, ":all" parsed
    or built, the device types listed as spec words, or OpenCL's platforms listed."""
    out = []
    for mod, path in sorted(modules.items()):
        if mod == DEVICE_HOME:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            what = None
            if isinstance(node, ast.JoinedStr):
                v = node.values
                if any(isinstance(a, ast.FormattedValue) and _reads(a.value, ("platform",))
                       and isinstance(b, ast.Constant) and b.value.startswith(" | ")
                       and isinstance(c, ast.FormattedValue) and _reads(c.value, ("name", "device"))
                       for a, b, c in zip(v, v[1:], v[2:])):
                    what = "label"
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "%s | %s" in node.value:
                    what = "label"
                elif node.value in DEVICE_ENV_NAMES:
                    what = node.value
                elif node.value == ":all":
                    what = ":all"
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                words = {e.value.lower() for e in node.elts
                         if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if {"gpu", "cpu"} <= words:
                    what = "device types"
            elif isinstance(node, ast.Attribute) and node.attr == "get_platforms":
                what = "get_platforms"
            if what:
                out.append(f"{mod}:{node.lineno} {what}")
    return sorted(set(out))


def test_device_rules_have_one_home():
    modules, _ = _repo_graph()
    assert DEVICE_HOME in modules
    bad = device_rule_sites(modules)
    assert not bad, f"device rules outside {DEVICE_HOME}: " + "; ".join(bad)


def _planted(tmp_path, files):
    """The source modules of a package ``clmf`` planted under ``tmp_path`` (``files``: path
    inside it → text), for the checkers' own tests."""
    pkg = tmp_path / "clmf"
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return source_modules({pkg: "clmf"})


def test_device_rule_check_finds_copies(tmp_path):
    """The checker finds the copies this repository had (a label per module, ":all" parsed, the
    rank rule's type words and CLMF_DEVICE, a child's own platform walk) and nothing in the home."""
    files = {
        "__init__.py": "",
        "engine/__init__.py": "",
        "engine/device.py": 'E = "CLMF_DEVICE"\ndef label(p, d):\n    return f"{p} | {d}"\n',
        "a.py": 'def f(d):\n    return f"{d.platform.name.strip()} | {d.name.strip()}"\n',
        "b.py": 'def f(j):\n    raise SystemExit(f"device {j[\'platform\']} | {j[\'device\']}")\n',
        "c.py": 'import os\ndef f(s):\n    return s.endswith(":all") or os.environ["CLMF_DEVICE"]'
                '\n',
        "d.py": 'def f(s):\n    return s in ("auto", "gpu", "cpu")\n',
        "e.py": 'import logging\nlogging.info("%s | %s", 1, 2)\n',
        "f.py": 'def f(cl):\n    return cl.get_platforms()\n',
        "g.py": 'def f(r):\n    return f"| {r[\'dataset\']} | {r[\'mode\']} |"\n',
        "h.py": 'def f(s, r):\n    return f"{s[\'device\'][\'platform\']} | {r[\'dataset\']}"\n',
    }
    found = device_rule_sites(_planted(tmp_path, files))
    assert found == ["clmf.a:2 label", "clmf.b:2 label", "clmf.c:3 :all", "clmf.c:3 CLMF_DEVICE",
                     "clmf.d:2 device types", "clmf.e:2 label", "clmf.f:2 get_platforms"]


def test_checks_catch_a_cycle_and_a_forbidden_import(tmp_path):
    """The checkers themselves find what they look for (a cycle through a function-local relative
    import, and a core module reaching torch and the benchmark at module level)."""
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def f():\n    from .c import g\n    return g\n",
        "c.py": "import numpy\nfrom .a import b as _b\ndef g():\n    pass\n",
        "d.py": "from .e import x\n",
        "e.py": "import torch.nn\nx = 1\ndef h():\n    import dask\n",
        "f.py": "from .bench import runner\n",
        "bench/__init__.py": "",
        "bench/runner.py": "import torch\n",
    }
    graph = import_graph(_planted(tmp_path, files))
    cycles = find_cycles(graph)
    assert len(cycles) == 1 and set(cycles[0]) == {"clmf.a", "clmf.b", "clmf.c"}
    assert cycles[0][0] == cycles[0][-1]
    bad = forbidden_imports(graph)
    assert "clmf.d -> clmf.e -> torch.nn" in bad
    assert "clmf.f -> clmf.bench.runner" in bad
    assert not any("dask" in b for b in bad)           # function-local: allowed
    assert not any(b.startswith("clmf.bench") for b in bad)


# the functions that enqueue the ALS kernels (clmf.engine.launch)
LAUNCHES = ("launch_batch", "launch_split_batch", "launch_solve", "launch_gram")


def kernel_launchers(modules):
    """``{"module.Class" or "module": [launch calls]}``: where the ALS kernels are enqueued
    (calls of :data:`LAUNCHES`, by name or attribute), by class, else by module."""
    out = {}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        in_class = {}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                in_class.setdefault(id(node), f"{mod}.{cls.name}")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
            if name in LAUNCHES:
                out.setdefault(in_class.get(id(node), mod), []).append(name)
    return out


def test_one_engine_class_does_device_fits():
    """One device engine: a one-device fit, every device of a multi-device one and the Dask
    workers run the same class (no second worker class enqueuing the same kernels), and the
    launches live in the engine package only."""
    modules, _ = _repo_graph()
    where = kernel_launchers(modules)
    classes = sorted(k for k in where if k.rpartition(".")[2][:1].isupper())
    assert classes == ["clmf.engine.core.Engine"], classes
    assert all(k.startswith("clmf.engine.") for k in where), sorted(where)


def test_the_launcher_check_sees_classes_and_modules(tmp_path):
    """The check itself tells a second engine class from module functions."""
    where = kernel_launchers(_planted(tmp_path, {
        "__init__.py": "",
        "a.py": "class Engine:\n    def f(self):\n        launch_batch(1)\n",
        "b.py": ("from . import L\nclass Worker:\n    def g(self):\n"
                 "        def h():\n            L.launch_solve(2)\n        h()\n"
                 "def k():\n    launch_gram(3)\n")}))
    assert where == {"clmf.a.Engine": ["launch_batch"], "clmf.b.Worker": ["launch_solve"],
                     "clmf.b": ["launch_gram"]}


@pytest.mark.parametrize("name", ["ALS", "load", "evaluate", "data", "metrics", "select_device",
                                  "KernelConfig", "errors"])
def test_public_api_is_listed(name):
    import clmf
    assert name in dir(clmf) and name in clmf.__all__
    assert getattr(clmf, name) is not None


# modules renamed by issue 32 (new name): tuner/ installs as clmf.autotune; clmf.data is the one
# home of the data API and of the splits; the data modules that functions of clmf.data now name
RENAMED_MODULES = {"clmf.tuner": "clmf.autotune", "clmf.datasets": "clmf.data",
                   "clmf.splits": "clmf.data.splits", "clmf.data.synthetic": "clmf.data.generator",
                   "clmf.data.default": "clmf.data.demo"}


def test_renamed_modules_are_gone_from_the_installed_package():
    """No module, file or directory of the old names in the installed clmf, the new ones there."""
    import importlib.util
    root = pathlib.Path(importlib.util.find_spec("clmf").submodule_search_locations[0])
    for old, new in RENAMED_MODULES.items():
        rel = pathlib.Path(*old.split(".")[1:])
        assert not (root / rel).exists() and not (root / rel).with_suffix(".py").exists(), old
        assert importlib.util.find_spec(new) is not None, new
        try:
            spec = importlib.util.find_spec(old)
        except ModuleNotFoundError:
            spec = None
        assert spec is None or spec.origin is None, f"{old} is still installed ({spec.origin})"


# ----- one home for each fact of a fit (issue 32) -------------------------------------------------
# code (comments and strings left out) that computes a fact whose home is clmf.tuning.spec: the
# unknowns or row width of a biased fit, a leading dimension (a width rounded up to a vector width
# or tile), the common leading dimension of several configurations, the weighted-λ default and
# implicit feedback's confidence shift
FACT_RULES = {
    "unknowns or row width (f + 1 / f + 2 with biases)":
        r"\bf\W*\s*\+\s*[12]\s+if\b|\+\s*\(\s*1\s+if\b[^)]*bias",
    "a leading dimension (a width rounded up to a multiple)":
        r"-\(-\s*(?:self\.)?(?:f|fs|width)\s*//\s*([A-Za-z_][\w.]*)\)\s*\*\s*\1\b",
    "the common leading dimension of several configurations": r"max\([^()]*\.ldf\(",
    "the weighted-λ default": r"weighted_regularization\w*\s+is\s+None",
    "the confidence shift of alpha*r": r"/\s*float\([^()]*alpha",
}
FACTS_HOME = "clmf.tuning"


def _code_only(text):
    """The source ``text`` with comments and docstrings blanked (so prose that describes a rule
    does not count as computing it); one line per source line."""
    import io
    import tokenize
    out = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            for r in range(body[0].lineno, body[0].end_lineno + 1):
                out[r - 1] = ""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            r, c = tok.start
            out[r - 1] = out[r - 1][:c]
    return out


def fact_violations(modules, home=FACTS_HOME):
    """["module:line: what"]: code outside ``home`` computing a fact of :data:`FACT_RULES`."""
    import re
    bad = []
    for mod, path in sorted(modules.items()):
        if _under(mod, (home,)):
            continue
        for no, line in enumerate(_code_only(path.read_text(encoding="utf-8")), 1):
            for what, rx in FACT_RULES.items():
                if re.search(rx, line):
                    bad.append(f"{mod}:{no}: {what}: {line.strip()}")
    return bad


def _subpackage(mod):
    """``clmf.x`` of a module ``clmf.x.y`` (the root package ``clmf`` for itself)."""
    return ".".join(mod.split(".")[:2])


def private_imports(modules, aliases=None):
    """["module:line imports _name from other"]: private names imported from another subpackage."""
    aliases = aliases or {}
    bad = []
    for mod, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            target = _resolve(stem, modules, aliases)
            if target is None or _subpackage(target) == _subpackage(mod):
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    bad.append(f"{mod}:{node.lineno} imports {a.name} from {target}")
    return bad


def upward_arrows(graph, lower=("clmf.parallel", "clmf.inference"), upper=("clmf.model",)):
    """["module:line -> target"]: imports (module-level or local) from ``lower`` up to ``upper``."""
    return [f"{mod}:{line} -> {target}" for mod, edges in sorted(graph.items())
            if _under(mod, lower) for target, internal, _, line in edges
            if internal and _under(target, upper)]


def test_fit_facts_live_in_tuning_spec():
    """No module outside clmf.tuning computes a factor width, a leading dimension, the
    weighted-λ default or the confidence shift: they import them from clmf.tuning.spec."""
    modules, _ = _repo_graph()
    bad = fact_violations(modules)
    assert not bad, "facts of a fit computed outside clmf.tuning.spec:\n" + "\n".join(bad)


def test_no_private_names_across_subpackages():
    modules, _ = _repo_graph()
    bad = private_imports(modules, {"tuner": "clmf.autotune", "cl_kernels": "clmf.cl_kernels"})
    assert not bad, "private names imported from another subpackage:\n" + "\n".join(bad)


def test_no_arrow_from_parallel_or_inference_up_to_model():
    _, graph = _repo_graph()
    bad = upward_arrows(graph)
    assert not bad, "imports from clmf.parallel/clmf.inference up to clmf.model:\n" + "\n".join(bad)


def test_fact_and_import_checks_find_what_they_look_for(tmp_path):
    """The three checks above catch planted violations (and leave comments, docstrings, the
    home itself and same-subpackage private imports alone)."""
    files = {"__init__.py": "", **{f"{d}/__init__.py": "" for d in ("tuning", "engine",
                                                                       "parallel", "model")},
        "tuning/spec.py": "def row_width(f, biased):\n    return f + 2 if biased else f\n",
        "engine/core.py": ('"""rows are f + 2 if biased"""\n# f + 1 if biased\n'
                           "width = f + 2 if biased else f\n"
                           "def ldf(f, w):\n    return -(-f // w) * w\n"
                           "from ._own import _helper\n"),
        "engine/_own.py": "def _helper():\n    pass\n",
        "parallel/worker.py": ("fs = f + (1 if biased else 0)\n"
                               "from ..engine._own import _helper\n"
                               "def g():\n    from ..model import est\n"),
        "model/est.py": ("lam = x if weighted_regularization is None else y\n"
                         "shift = -1.0 / float(self.alpha)\n"
                         "ld = max(c.ldf(w) for c in cs)\n"),
    }
    modules = _planted(tmp_path, files)
    facts = fact_violations(modules)
    assert {v.split(":")[0] for v in facts} == {"clmf.engine.core", "clmf.parallel.worker",
                                                 "clmf.model.est"}
    assert [v.split(":")[1] for v in facts if v.startswith("clmf.engine.core")] == ["3", "5"]
    assert len([v for v in facts if v.startswith("clmf.model.est")]) == 3
    assert private_imports(modules) == [
        "clmf.parallel.worker:2 imports _helper from clmf.engine._own"]
    assert upward_arrows(import_graph(modules)) == ["clmf.parallel.worker:4 -> clmf.model.est"]


# non-blocking copies whose event must outlive the call (pyopencl's NannyEvent waits for its copy,
# holding the GIL, when released: a dropped event makes the copy blocking and stops every thread)
NONBLOCKING = {"enqueue_copy": "is_blocking", "write_rows": "blocking", "read_rows": "blocking"}


def dropped_copy_events(modules):
    """``["module:line"]`` of non-blocking copies called as bare statements (event dropped)."""
    out = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
                continue
            fn = node.value.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
            flag = NONBLOCKING.get(name)
            if flag and any(k.arg == flag and isinstance(k.value, ast.Constant)
                            and k.value.value is False for k in node.value.keywords):
                out.append(f"{mod}:{node.lineno}")
    return out


def test_no_nonblocking_copy_drops_its_event():
    """Every non-blocking copy's event is kept (returned, stored, or held by ``Engine.keep``)
    until the copy completes: issue 29's four GPUs ran one at a time because dropped events
    waited with the GIL held, and the fit engine's exchange did the same."""
    modules, _ = _repo_graph()
    bad = dropped_copy_events(modules)
    assert not bad, f"non-blocking copies whose event is dropped at once: {bad}"


def test_the_dropped_event_check_sees_bare_copies(tmp_path):
    """The check flags a bare non-blocking copy and nothing else."""
    bad = dropped_copy_events(_planted(tmp_path, {
        "__init__.py": "",
        "a.py": ("def f(cl, q, e, h, b):\n"
                 "    cl.enqueue_copy(q, b, h, is_blocking=False)\n"
                 "    ev = cl.enqueue_copy(q, b, h, is_blocking=False)\n"
                 "    cl.enqueue_copy(q, h, b)\n"
                 "    e.write_rows('users', h, 0, 1, blocking=False)\n"
                 "    e.keep(e.write_rows('users', h, 0, 1, blocking=False))\n"
                 "    return ev\n")}))
    assert bad == ["clmf.a:2", "clmf.a:5"]
