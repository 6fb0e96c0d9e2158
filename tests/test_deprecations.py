"""The package's code reads no name that the installed jax deprecates.

jax deprecates a module's name through the module's `__getattr__` (jax/_src/deprecations.py), which warns once per
process, at the first reader. orbax's import reads `jax.sharding.SingleDeviceSharding` (deprecated in jax 0.12.1)
before the package can, so pyproject.toml's warning filters never see the package's own read of it. This test reads
the source instead: every dotted name that the package, torch_ref, the examples and the benchmarks spell
(`jax.sharding.X`, `jsh.X` after `import jax.sharding as jsh`, `from jax.sharding import X`), against the
`_deprecations` table of each jax module it names. Names only: a name reached another way (`getattr`) is not seen.
"""
from __future__ import annotations

import ast
import functools
import importlib
import sys

import pytest

from tests.test_portability import ROOT, source_files


def dotted_names(source: str) -> set[str]:
    """Every `a.b.c` the source spells, its head replaced by what its import binds (`jnp` -> `jax.numpy`), and
    every `from a.b import c` as `a.b.c`. Imports anywhere in the file bind for the whole file."""
    tree = ast.parse(source)
    bound, names = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import a.b` binds `a`; `import a.b as c` binds `c` to `a.b`
                head = alias.name.split(".")[0]
                bound[alias.asname or head] = alias.name if alias.asname else head
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                names.add(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            while isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name) and node.id in bound:
                names.add(".".join([bound[node.id], *reversed(parts)]))
    return names


@functools.cache
def deprecation(name: str) -> str | None:
    """jax's message if `name` (`jax.sharding.SingleDeviceSharding`) reads a name some jax module deprecates, else
    None: walks the name's modules from `jax` on, importing each, and looks the next part up in the module's table."""
    parts = name.split(".")
    if parts[0] != "jax":
        return None
    module = "jax"
    for part in parts[1:]:
        table = vars(importlib.import_module(module)).get("_deprecations", {})
        if part in table:
            return table[part][0]
        try:
            importlib.import_module(f"{module}.{part}")
        except ImportError:  # an attribute (a function, a class), not a module: nothing deeper is jax's table
            return None
        module = f"{module}.{part}"
    return None


def test_the_code_reads_no_name_the_installed_jax_deprecates():
    found = [f"{path.relative_to(ROOT)}: {name} ({message})" for path in source_files()
             for name in sorted(dotted_names(path.read_text(encoding="utf-8")))
             if (message := deprecation(name)) is not None]
    assert not found, "\n".join(found)


def test_a_deprecated_name_is_found_however_it_is_spelled():
    """The check against a name this jax deprecates (any one: the tables differ from release to release)."""
    import jax  # noqa: F401  (its modules' tables)

    deprecated = [(module, name) for module, m in list(sys.modules.items())
                  if module.split(".")[0] == "jax" and "._" not in module
                  for name, (_, fn) in vars(m).get("_deprecations", {}).items() if fn is not None]  # None: removed
    if not deprecated:
        pytest.skip("this jax deprecates no module name")
    module, name = deprecated[0]
    short = module.rsplit(".", 1)[-1]
    for source in (f"import {module}\n{module}.{name}\n",
                   f"import {module} as alias\nalias.{name}\n",
                   f"from {module} import {name}\n"):
        assert any(deprecation(n) for n in dotted_names(source)), source
    assert not any(deprecation(n) for n in dotted_names(f"import {module} as {short}\n{short}.not_deprecated\n"))
