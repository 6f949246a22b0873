#!/usr/bin/env python3
"""The module graph of a crate, measured from its sources: which file imports which.

    scripts/module_graph.py host/src [--dot FILE] [--json]

Unit tests (`#[cfg(test)] mod tests`) are left out: they are not the library's dependencies.
A module is a `.rs` file (`a/mod.rs` is module `a`, `a/b.rs` is `a::b`). An arrow A -> B is A
naming `crate::B...` anywhere (a `use` or a path in code) or, inside B's parent, `super::B`;
the longest module prefix of the path is its target, and arrows from a module to its own
descendants or ancestors (a folder's `mod.rs` naming its children, re-exports) are not counted:
they are the folder's own structure. Printed:

- modules per folder;
- arrows in all;
- import depth: the longest chain of arrows after each import cycle is merged into one node;
- arrows that run back up: arrows inside an import cycle (a cycle means some arrow in it runs
  against the layering), and the pairs of modules that import each other;
- arrows between top-level folders that run against the order given by `--layers` (a
  comma-separated list, lowest first), where one is given.

Only the standard library: the measurement needs nothing installed.
"""

import argparse
import json
import os
import re
import sys
from collections import defaultdict

PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
# `use crate::{a, b::c}` groups: the names inside the braces after `crate::`.
GROUP = re.compile(r"\bcrate::\{([^}]*)\}", re.S)
COMMENT = re.compile(r"//[^\n]*")


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def scan(root):
    modules = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".rs"):
                p = os.path.join(dirpath, f)
                modules[module_of(root, p)] = p
    return modules


def resolve(modules, parts):
    for n in range(len(parts), 0, -1):
        if tuple(parts[:n]) in modules:
            return tuple(parts[:n])
    return None


def root_exports(modules):
    """Names the crate root re-exports (`pub use a::b::{X, Y};` in lib.rs): `crate::X` is a::b."""
    lib = modules.get(())
    names = {}
    if lib is None:
        return names
    for path, items in re.findall(r"pub use ([A-Za-z_:]+?)::\{?([A-Za-z0-9_, ]+)\}?;", open(lib, encoding="utf-8").read()):
        for name in items.split(","):
            names[name.strip()] = path.split("::")
    return names


def edges(modules):
    out = defaultdict(set)
    exports = root_exports(modules)
    for m, p in modules.items():
        text = COMMENT.sub("", open(p, encoding="utf-8").read())
        # Unit tests (a file's `#[cfg(test)] mod tests`, last by convention) are not the library's
        # dependencies: a test may use anything above it.
        cut = re.search(r"#\[cfg\(test\)\]\s*mod tests\b", text)
        if cut:
            text = text[: cut.start()]
        targets = []
        for kind, rest in PATH.findall(text):
            parts = rest.strip(":").split("::")
            if kind == "super":
                # super:: from a mod.rs is its parent's child; from a.rs, a's sibling.
                is_dir = os.path.basename(p) == "mod.rs"
                base = list(m[:-1]) if is_dir else list(m[:-1])
                parent = base if not is_dir else list(m[:-1])
                targets.append(parent + parts)
            else:
                targets.append(parts)
        for group in GROUP.findall(text):
            for name in re.split(r"[,\s]+", group):
                name = name.strip()
                if name and name not in ("self",):
                    targets.append(name.split("::"))
        for t in targets:
            if t and t[0] in exports:
                t = exports[t[0]] + t[1:]
            r = resolve(modules, t)
            if r is None or r == m or r == ():
                continue
            # A folder and its own descendants: structure, not a dependency.
            if r[: len(m)] == m or m[: len(r)] == r:
                continue
            out[m].add(r)
    return out


def sccs(nodes, graph):
    index, low, stack, on, comp, res = {}, {}, [], set(), {}, []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            c = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp[w] = len(res)
                c.append(w)
                if w == v:
                    break
            res.append(c)

    for v in nodes:
        if v not in index:
            visit(v)
    return comp, res


def measure(root, layers=None):
    modules = scan(root)
    graph = edges(modules)
    nodes = sorted(modules)
    comp, comps = sccs(nodes, graph)
    cdag = defaultdict(set)
    for a, bs in graph.items():
        for b in bs:
            if comp[a] != comp[b]:
                cdag[comp[a]].add(comp[b])
    memo = {}

    def depth(c):
        if c not in memo:
            memo[c] = 1 + max((depth(d) for d in cdag[c]), default=0)
        return memo[c]

    n_arrows = sum(len(b) for b in graph.values())
    in_cycles = [(a, b) for a, bs in graph.items() for b in bs if comp[a] == comp[b]]
    mutual = sorted({tuple(sorted((a, b))) for a, b in in_cycles if a in graph.get(b, ())})
    folders = defaultdict(int)
    for m in nodes:
        if not m:
            continue
        # A folder's own mod.rs counts in that folder.
        in_folder = m if modules[m].endswith("mod.rs") else m[:-1]
        folders["/".join(in_folder) or "."] += 1
    against = []
    if layers:
        rank = {name: i for i, name in enumerate(layers)}
        for a, bs in graph.items():
            for b in bs:
                fa, fb = a[0] if a else "", b[0] if b else ""
                if fa in rank and fb in rank and rank[fb] > rank[fa]:
                    against.append((a, b))
    return {
        "root": root,
        "modules": len([m for m in nodes if m]),
        "modules_per_folder": dict(sorted(folders.items())),
        "arrows": n_arrows,
        "import_depth": max((depth(c) for c in range(len(comps))), default=0),
        "arrows_in_cycles": len(in_cycles),
        "cycles": [sorted("::".join(m) for m in c) for c in comps if len(c) > 1],
        "mutual_pairs": ["::".join(a) + " <-> " + "::".join(b) for a, b in mutual],
        "arrows_against_layers": ["::".join(a) + " -> " + "::".join(b) for a, b in against],
    }, graph


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="a crate's src folder, e.g. host/src")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--dot", help="write the graph in Graphviz's dot format to this file")
    ap.add_argument("--layers", help="top-level folders, lowest first: arrows from a lower to a higher one are reported")
    args = ap.parse_args()
    if not os.path.isdir(args.root):
        sys.exit(f"{args.root}: not a folder")
    layers = args.layers.split(",") if args.layers else None
    fig, graph = measure(args.root, layers)
    if args.dot:
        with open(args.dot, "w") as f:
            f.write("digraph modules {\n  rankdir=BT;\n")
            for a, bs in sorted(graph.items()):
                for b in sorted(bs):
                    f.write(f'  "{"::".join(a)}" -> "{"::".join(b)}";\n')
            f.write("}\n")
    if args.json:
        print(json.dumps(fig, indent=2))
        return
    print(f"{fig['root']}: {fig['modules']} modules, {fig['arrows']} arrows, import depth {fig['import_depth']}")
    print("modules per folder: " + ", ".join(f"{k} {v}" for k, v in fig["modules_per_folder"].items()))
    print(f"arrows inside import cycles: {fig['arrows_in_cycles']}")
    for c in fig["cycles"]:
        print("  cycle: " + ", ".join(c))
    for p in fig["mutual_pairs"]:
        print("  mutual: " + p)
    if layers:
        print(f"arrows against the layers {','.join(layers)}: {len(fig['arrows_against_layers'])}")
        for a in fig["arrows_against_layers"]:
            print("  " + a)


if __name__ == "__main__":
    main()
