#!/usr/bin/env python3
"""Module-level dependency graph of a Rust crate's src/ (issue 26).

Usage: modgraph.py [SRC_DIR] [--items] [--with-tests] [--files] [--layers]
  --items   every reference inside an SCC, not just three per edge
  --files   SCCs of the file-level graph instead (mod.rs/child cycles included)
  --layers  edges that go up against the proposed layering (LAYERS below)
  --check   exit 1 if an edge goes up a layer, a module is in no layer, or
            modules form a cycle (core/tests/layering.rs runs this in CI)
  --closure=a,b::c  files reachable (by reference) from these modules
  --drop=a>b,c>d    remove module edges before Tarjan (what-if for the plan)

A "module" is a top-level file or directory under SRC_DIR (config.rs,
metrics/, ...).  An edge A -> B is counted for every path that resolves to
crate::B::... while written in a file of A, found in
  * `use` / `pub use` trees (`crate::`, `super::`, `self::`, child modules,
    brace groups expanded), and
  * paths in code (`crate::x::y`, `super::x`, and `alias::y` where `alias`
    was imported by a `use` that names a module of this crate).
Crate-root re-exports in lib.rs (`pub use modes::mps`, `pub use config::Config`)
are followed, so `crate::mps::X` counts as an edge to `modes`.

Comments and string/char literals are blanked first (line numbers kept).
Unless --with-tests: every item under `#[cfg(test)]` is removed (inline
`mod tests { .. }`, test-only fns, `mod stand_in`), and files only reached
through a `#[cfg(test)] mod x;` declaration (tests.rs, apply_tests.rs, ...)
are skipped.

Prints: per-module out-edges, Tarjan SCCs, and for each non-trivial SCC every
edge inside it with file:line examples (all of them with --items).
"""
import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# ---------------------------------------------------------------- lexing
def blank(src):
    """Replace comments and string/char literal contents by spaces."""
    out = list(src)
    n = len(src)
    i = 0

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth += 1
                    j += 2
                elif src.startswith("*/", j):
                    depth -= 1
                    j += 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif re.match(r'b?r#*"', src[i:i + 70]) and (i == 0 or not re.match(r"\w", src[i - 1])):
            m = re.match(r'(b?r)(#*)"', src[i:])
            hashes = m.group(2)
            start = i + len(m.group(0))
            end = src.find('"' + hashes, start)
            end = n if end < 0 else end + 1 + len(hashes)
            wipe(start, end - 1 - len(hashes))
            i = end
        elif c == '"' or (c == "b" and src.startswith('b"', i) and (i == 0 or not re.match(r"\w", src[i - 1]))):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            wipe(i + 1, j)
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'])'", src[i:i + 12])
            if m:
                wipe(i + 1, i + len(m.group(0)) - 1)
                i += len(m.group(0))
            else:
                i += 1  # lifetime
        else:
            i += 1
    return "".join(out)


def item_end(text, pos):
    """End offset of the item starting at pos (after its attributes)."""
    n = len(text)
    depth = 0
    i = pos
    while i < n:
        c = text[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1
        elif c == "{" and depth == 0:
            b = 1
            i += 1
            while i < n and b:
                if text[i] == "{":
                    b += 1
                elif text[i] == "}":
                    b -= 1
                i += 1
            return i
        i += 1
    return n


ATTR = re.compile(r"#!?\[")


def skip_attrs(text, i):
    while True:
        m = re.compile(r"\s*#\[").match(text, i)
        if not m:
            return i
        j = m.end()
        depth = 1
        while j < len(text) and depth:
            if text[j] == "[":
                depth += 1
            elif text[j] == "]":
                depth -= 1
            j += 1
        i = j


def strip_cfg_test(text):
    """Blank every item under #[cfg(test)]; return text and test-only mod names."""
    test_mods = []
    out = list(text)
    for m in list(re.finditer(r"#\[cfg\(test\)\]", text)):
        if all(ch == " " for ch in out[m.start():m.end()]):
            continue  # already inside a removed item
        start = skip_attrs(text, m.end())
        end = item_end(text, start)
        mm = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text[start:end])
        if mm:
            test_mods.append(mm.group(1))
        for k in range(m.start(), end):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out), test_mods


# ---------------------------------------------------------------- modules
def file_modpath(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main") and len(rel) == 1:
        return []
    if rel[-1] == "mod":
        rel = rel[:-1]
    return rel


def expand_use(tree):
    """`a::{b, c::{d, e as f}, self}` -> [(['a','b'], 'b'), ...] (path, bound name)."""
    tree = re.sub(r"\s+", "", tree)
    res = []

    def rec(prefix, s):
        # split top-level commas
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        for p in parts:
            if not p:
                continue
            if "{" in p:
                head, rest = p.split("{", 1)
                rest = rest[: rest.rfind("}")]
                hp = [x for x in head.split("::") if x]
                rec(prefix + hp, rest)
            else:
                segs = p.split("::")
                last = segs[-1]
                res.append((prefix + segs, last if last not in ("self", "*") else None))
    rec([], tree)
    return res


class Crate:
    def __init__(self, src, with_tests=False):
        self.src = src
        self.with_tests = with_tests
        self.files = {}  # path -> modpath
        for root, _, fs in os.walk(src):
            for f in fs:
                if f.endswith(".rs"):
                    p = os.path.join(root, f)
                    self.files[p] = file_modpath(src, p)
        self.modules = {tuple(mp) for mp in self.files.values()}
        self.texts = {}
        self.excluded = set()
        test_only = set()
        for p, mp in self.files.items():
            raw = open(p, encoding="utf-8").read()
            t = blank(raw)
            if not with_tests:
                t, tm = strip_cfg_test(t)
                for name in tm:
                    test_only.add(tuple(mp) + (name,))
            self.texts[p] = t
        if not with_tests:
            # a test-only module and everything under it
            for p, mp in self.files.items():
                if any(tuple(mp[: len(t)]) == t for t in test_only):
                    self.excluded.add(p)
        self.root_alias = {}
        lib = os.path.join(src, "lib.rs")
        if os.path.exists(lib):
            for stmt, _ in self.use_stmts(self.texts[lib]):
                for path, name in self.expand(stmt):
                    if name and path and path[0] in {m[0] for m in self.modules if m}:
                        self.root_alias[name] = path

    @staticmethod
    def use_stmts(text):
        for m in re.finditer(r"(?<![A-Za-z0-9_])use\s+([^;]*);", text):
            yield m.group(1), text.count("\n", 0, m.start()) + 1

    @staticmethod
    def expand(stmt):
        stmt = re.sub(r"\s+as\s+(" + IDENT + r")", r"@\1", stmt)
        out = []
        for path, name in expand_use(stmt):
            alias = None
            if path and "@" in path[-1]:
                path[-1], alias = path[-1].split("@")
                name = alias
            if path and path[-1] == "self":
                path = path[:-1]
                name = alias or (path[-1] if path else None)
            out.append((path, name))
        return out

    def resolve(self, mp, segs, aliases):
        """Absolute path (list, without 'crate') or None if not in this crate."""
        segs = list(segs)
        if not segs:
            return None
        if segs[0] == "crate":
            abs_ = segs[1:]
            if abs_ and abs_[0] in self.root_alias:
                abs_ = self.root_alias[abs_[0]] + abs_[1:]
            return abs_
        if segs[0] in ("super", "self"):
            base = list(mp)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    if not base:
                        return None
                    base = base[:-1]
                segs = segs[1:]
            return base + segs
        if tuple(list(mp) + [segs[0]]) in self.modules:
            return list(mp) + segs
        if segs[0] in aliases:
            return aliases[segs[0]] + segs[1:]
        return None

    def refs(self):
        """Yield (file, line, from_top, to_top, abs_path, kind)."""
        for p, mp in sorted(self.files.items()):
            if p in self.excluded or not mp:
                continue
            text = self.texts[p]
            inline = inline_mods(text)

            def mp_at(off, mp=mp):
                return list(mp) + [name for a, b, name in inline if a <= off < b]
            aliases = {}
            use_spans = []
            for m in re.finditer(r"(?<![A-Za-z0-9_])use\s+([^;]*);", text):
                use_spans.append((m.start(), m.end()))
                line = text.count("\n", 0, m.start()) + 1
                here = mp_at(m.start())
                for path, name in self.expand(m.group(1)):
                    r = self.resolve(here, path, {})
                    if r is None or not r:
                        continue
                    if path and path[-1] == "*":
                        r = r[:-1]
                    if not r:
                        continue
                    if name and tuple(r) in self.modules:
                        aliases[name] = r
                    yield p, line, mp[0], r[0], r, "use"
            # paths in code
            for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:" + IDENT + r"\s*::\s*)+" + IDENT + ")", text):
                if any(a <= m.start() < b for a, b in use_spans):
                    continue
                segs = [s.strip() for s in m.group(1).split("::")]
                here = mp_at(m.start())
                if segs[0] not in ("crate", "super", "self") and segs[0] not in aliases and tuple(here + [segs[0]]) not in self.modules:
                    continue
                r = self.resolve(here, segs, aliases)
                if not r:
                    continue
                line = text.count("\n", 0, m.start()) + 1
                yield p, line, mp[0], r[0], r, "path"


# Proposed layering (issue 26, part C). Lower index = lower layer. Keys are
# module paths; a reference is placed by its longest matching key, so
# `modes` splits into its three modes and the dispatch in modes/mod.rs.
LAYERS = [
    ("L0 base", "fsutil command procfs privdrop runtime persist hostlist failure gpu_mode gpu_lock watchdog drain skipped_prolog signal signal_state compute_mode"),
    ("L1 config", "config log"),
    ("L2 job", "job_env gres state grant metrics submit mps_daemons"),
    ("L3 devices", "gpu criu cuda_ckpt cuda_pattern mode_driver"),
    ("L4 mps", "modes::mps"),
    ("L5 mig/preempt", "mig preempt modes::checkpoint"),
    ("L6 modes", "modes"),
    ("L7 health", "health"),
    # the metrics' families, events and store stay in L2; keeping them and
    # rendering the textfile with the node's records is observe's
    ("L8 observe", "status observe"),
    ("L9 node", "lifecycle node_check cli"),
]


# `--crate-is=NAME`: the crate checked is the module NAME of the layering,
# moved out into a crate of its own (gpu-mode-preempt is `preempt`): its
# own top-level modules are placed as NAME's submodules.
CRATE_IS = None
OWN_MODULES = set()


def layer_of(path):
    if CRATE_IS and path and path[0] in OWN_MODULES:
        path = [CRATE_IS] + list(path)
    best, lvl = None, None
    for i, (_, mods) in enumerate(LAYERS):
        for m in mods.split():
            k = m.split("::")
            if path[: len(k)] == k and (best is None or len(k) > len(best)):
                best, lvl = k, i
    return ("::".join(best) if best else None), lvl


def layer_report(c, src):
    up = defaultdict(list)
    same = defaultdict(int)
    for p, line, a, b, r, kind in c.refs():
        fa, la = layer_of(list(c.files[p]))
        fb, lb = layer_of(r)
        if la is None or lb is None or fa == fb:
            continue
        if lb > la:
            up[(fa, fb)].append((f"{os.path.relpath(p, src)}:{line}", "::".join(r)))
        elif lb == la:
            same[(fa, fb)] += 1
    print("## layers")
    for name, mods in LAYERS:
        print(f"{name}: {mods}")
    print(f"\n## upward edges ({len(up)} module pairs, {sum(len(v) for v in up.values())} references)")
    for (fa, fb), ex in sorted(up.items(), key=lambda kv: (layer_of(kv[0][0].split('::'))[1], kv[0])):
        items = sorted({e[1] for e in ex})
        locs = sorted({e[0] for e in ex}, key=lambda x: (x.split(':')[0], int(x.split(':')[1])))
        print(f"{fa} ({LAYERS[layer_of(fa.split('::'))[1]][0]}) -> {fb} ({LAYERS[layer_of(fb.split('::'))[1]][0]}): {', '.join(items)}")
        print(f"    at {', '.join(locs)}")
    print("\n## same-layer edges (allowed between modules; they fix the crate order inside a tier)")
    for (fa, fb), n in sorted(same.items()):
        print(f"{fa} -> {fb} ({n})")
    return sum(len(v) for v in up.values())


def check(c, src):
    """The layering as a rule: no upward edge, every module placed, no cycle."""
    upward = layer_report(c, src)
    nodes = {mp[0] for p, mp in c.files.items() if mp and p not in c.excluded}
    unplaced = sorted(m for m in nodes if layer_of([m])[1] is None)
    edges = defaultdict(set)
    for p, line, a, b, r, kind in c.refs():
        if a != b and b in nodes:
            edges[a].add(b)
    cycles = [comp for comp in tarjan(nodes, edges) if len(comp) > 1]
    print(f"\n## check: {upward} upward reference(s), unplaced modules {unplaced or 'none'}, cycles {cycles or 'none'}")
    if unplaced:
        print("place each new module in LAYERS (scripts/modgraph.py) and docs/architecture.md's table")
    return 1 if upward or unplaced or cycles else 0


def inline_mods(text):
    """(start, end, name) of every inline `mod name { .. }` (nesting kept)."""
    out = []
    for m in re.finditer(r"(?<![A-Za-z0-9_])mod\s+(" + IDENT + r")\s*\{", text):
        end = item_end(text, m.start())
        out.append((m.end(), end, m.group(1)))
    return out


def tarjan(nodes, edges):
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
            sccs.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return sccs


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = {a for a in sys.argv[1:] if a.startswith("--")}
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core", "src")
    c = Crate(src, with_tests="--with-tests" in flags)
    global CRATE_IS, OWN_MODULES
    for f in flags:
        if f.startswith("--crate-is="):
            CRATE_IS = f.split("=", 1)[1]
            OWN_MODULES = {mp[0] for mp in c.modules if mp}
    edges = defaultdict(set)
    examples = defaultdict(list)  # (a,b) -> [(file:line, path, kind)]
    nodes = {mp[0] for p, mp in c.files.items() if mp and p not in c.excluded}
    if "--check" in flags:
        sys.exit(check(c, src))
    if "--layers" in flags:
        layer_report(c, src)
        return
    if any(f.startswith("--closure=") for f in flags):
        # file-level reachability from the given modules (comma-separated
        # module paths, e.g. the SPANK plugin's entry points)
        start = [x for f in flags if f.startswith("--closure=") for x in f.split("=", 1)[1].split(",")]
        g = defaultdict(set)
        for p, line, a, b, r, kind in c.refs():
            tgt = max((r[:k] for k in range(1, len(r) + 1) if tuple(r[:k]) in c.modules), key=len, default=None)
            if tgt is not None:
                g["::".join(c.files[p])].add("::".join(tgt))
        seen, todo = set(), list(start)
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            todo.extend(g[m] - seen)
        ext = {}
        for p, mp in c.files.items():
            name = "::".join(mp)
            if name in seen:
                used = sorted({x for x in re.findall(r"\b(nvml_wrapper(?:_sys)?|cudarc|libloading|serde_saphyr|clap)::", c.texts[p])})
                if used:
                    ext[name] = used
        print(f"closure of {','.join(start)}: {len(seen)} files")
        print(" ".join(sorted(seen)))
        print("of which use heavy crates:", "; ".join(f"{k}: {','.join(v)}" for k, v in sorted(ext.items())))
        return
    if "--files" in flags:
        # file level: target = the deepest file-backed module the path names
        # (an item re-exported by a mod.rs counts against that mod.rs).
        fnodes, fedges, fex = set(), defaultdict(set), defaultdict(list)
        for p, line, a, b, r, kind in c.refs():
            tgt = max((r[:k] for k in range(1, len(r) + 1) if tuple(r[:k]) in c.modules), key=len, default=None)
            if tgt is None:
                continue
            fa = "::".join(c.files[p]); fb = "::".join(tgt)
            if fa == fb:
                continue
            fnodes |= {fa, fb}
            fedges[fa].add(fb)
            fex[(fa, fb)].append(f"{os.path.relpath(p, src)}:{line} {'::'.join(r)}")
        for comp in tarjan(fnodes, fedges):
            if len(comp) > 1:
                print(f"FILE-SCC[{len(comp)}]: {' '.join(comp)}")
                if "--items" in flags:
                    for fa in comp:
                        for fb in sorted(fedges[fa] & set(comp)):
                            print(f"    {fa} -> {fb}: {fex[(fa, fb)][0]}")
        return
    for p, line, a, b, r, kind in c.refs():
        if a == b or b not in nodes:
            continue
        edges[a].add(b)
        examples[(a, b)].append((f"{os.path.relpath(p, src)}:{line}", "::".join(r), kind))
    print(f"# source: {src}  (cfg(test) items and test-only files "
          f"{'INCLUDED' if c.with_tests else 'excluded: ' + ', '.join(sorted(os.path.relpath(x, src) for x in c.excluded))})")
    print("\n## out-edges per module (count of references)")
    for a in sorted(nodes):
        outs = ", ".join(f"{b}({len(examples[(a, b)])})" for b in sorted(edges[a]))
        print(f"{a}: {outs}")
    dropped = [tuple(x.split(">")) for f in flags if f.startswith("--drop=") for x in f.split("=", 1)[1].split(",")]
    for a, b in dropped:
        edges[a].discard(b)
    if dropped:
        print("\n(dropped, as the plan removes them: " + ", ".join(f"{a}->{b}" for a, b in dropped) + ")")
    sccs = tarjan(nodes, edges)
    print("\n## strongly connected components (Tarjan)")
    for comp in sccs:
        if len(comp) > 1:
            print(f"SCC[{len(comp)}]: {' '.join(comp)}")
    print("singletons:", " ".join(sorted(x[0] for x in sccs if len(x) == 1)))
    for comp in sccs:
        if len(comp) < 2:
            continue
        s = set(comp)
        print(f"\n## edges inside SCC {{{', '.join(comp)}}}")
        for a in comp:
            for b in sorted(edges[a] & s):
                ex = examples[(a, b)]
                # distinct items: strip to the path below the target module
                items = sorted({e[1] for e in ex})
                print(f"{a} -> {b}  [{len(ex)} refs]  items: {', '.join(items)}")
                shown = ex if "--items" in flags else ex[:3]
                for loc, path, kind in shown:
                    print(f"    {loc}  {path}  ({kind})")


if __name__ == "__main__":
    main()
