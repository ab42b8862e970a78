//! Tidy: the layer order of `xtask/src` and its code map, both read from
//! ARCHITECTURE.md, checked against every `crate::`, `super::`, `self::` and
//! child-module path in the code (not only `use` lines; comments, strings
//! and unit-test modules left out).
//!
//! Three rules: a module names only modules of its own layer or lower; no
//! two files import each other in a circle (a folder's `mod.rs` and its own
//! files are one room, so edges between a module and its ancestors do not
//! count); and the layers themselves form no circle. The code map lists
//! every source file of the tree, and nothing else.

use crate::util::source_root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn src() -> PathBuf {
    source_root().join("xtask/src")
}

fn architecture() -> String {
    std::fs::read_to_string(source_root().join("ARCHITECTURE.md")).unwrap()
}

/// The first fenced block after the heading `heading` in ARCHITECTURE.md.
fn fenced_after(doc: &str, heading: &str) -> Vec<String> {
    let at = doc
        .find(heading)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no heading {heading:?}"));
    let rest = &doc[at..];
    let open = rest.find("```").expect("a fenced block after the heading");
    let body = &rest[open..];
    let body = &body[body.find('\n').unwrap() + 1..];
    let close = body.find("\n```").expect("the fenced block closes");
    body[..close].lines().map(str::to_string).collect()
}

/// The layers, bottom first; each a list of module paths (`cache::format`).
fn layers(doc: &str) -> Vec<Vec<Module>> {
    let mut out: Vec<Vec<Module>> = fenced_after(doc, "## Layers")
        .iter()
        .map(|l| l.split('#').next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.split_whitespace()
                .map(|m| m.split("::").map(str::to_string).collect())
                .collect()
        })
        .collect();
    // Written top first, as a building is drawn.
    out.reverse();
    out
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `cache/fetch/mod.rs` -> [cache, fetch]; `lib.rs` and `main.rs` -> [].
fn module_of(rel: &Path) -> Module {
    let mut parts: Module = rel
        .with_extension("")
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code without comments, string and char literals, and without
/// `#[cfg(test)] mod ... { ... }` bodies.
fn code_of(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        if at(i) == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            i += 2;
            while i < c.len() && !(at(i) == '*' && at(i + 1) == '/') {
                i += 1;
            }
            i += 2;
        } else if at(i) == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && matches!(at(i + 2), '#' | '"')))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            while j < c.len() && !(c[j] == '"' && (0..hashes).all(|k| at(j + 1 + k) == '#')) {
                j += 1;
            }
            i = j + 1 + hashes;
            out.push_str("\"\"");
        } else if at(i) == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if at(i) == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('x', '\n', '\''); a lifetime has no closing quote.
            let mut j = i + 1;
            if at(j) == '\\' {
                j += 2;
            }
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            i = j + 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    match out.find("#[cfg(test)]\nmod ") {
        Some(at) if !out[at..].starts_with("#[cfg(test)]\nmod tests;") => out[..at].to_string(),
        _ => out,
    }
}

/// Every module a file names, with the line it names it on.
fn references(
    me: &Module,
    is_mod_file: bool,
    code: &str,
    known: &BTreeSet<Module>,
) -> Vec<(Module, usize)> {
    let mut out = Vec::new();
    let resolve = |path: Vec<String>| -> Option<Module> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| known.contains(p))
    };
    // Inline `mod x { ... }` blocks: their `self` and `super` are one deeper.
    let mut depth = 0usize;
    let mut inline: Vec<(usize, String)> = Vec::new();
    let header = regex_lite::Regex::new(r"^\s*(pub(\([^)]*\))?\s+)?mod\s+(\w+)\s*\{").unwrap();
    for (n, line) in code.lines().enumerate() {
        if let Some(c) = header.captures(line) {
            inline.push((depth, c[3].to_string()));
        }
        let mut me = me.clone();
        me.extend(inline.iter().map(|(_, m)| m.clone()));
        let me = &me;
        for ch in line.chars() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    while inline.last().is_some_and(|(d, _)| *d >= depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
        }
        let words: Vec<&str> = line
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .filter(|w| w.contains("::"))
            .collect();
        for w in words {
            let segs: Vec<String> = w
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let Some(first) = segs.first() else { continue };
            // The module a file's own `super`/`self` mean: a file `x.rs` is
            // module `..::x`; its `self` is itself and `super` its parent.
            let base = match first.as_str() {
                "crate" => Some(Vec::new()),
                "self" => Some(me.clone()),
                "super" => {
                    let mut m = me.clone();
                    let mut rest = &segs[..];
                    while rest.first().is_some_and(|s| s == "super") {
                        m.pop();
                        rest = &rest[1..];
                    }
                    let mut p = m;
                    p.extend(rest.iter().cloned());
                    if let Some(t) = resolve(p) {
                        out.push((t, n + 1));
                    }
                    None
                }
                // `use child::x` in a folder's mod.rs (or a file's own children).
                child
                    if line.trim_start().starts_with("use ")
                        || line.trim_start().starts_with("pub use ") =>
                {
                    let mut p = me.clone();
                    p.push(child.to_string());
                    let _ = is_mod_file;
                    if known.contains(&p) {
                        out.push((p, n + 1));
                    }
                    None
                }
                _ => None,
            };
            if let Some(mut p) = base {
                p.extend(segs[1..].iter().cloned());
                if let Some(t) = resolve(p) {
                    out.push((t, n + 1));
                }
            }
        }
    }
    out.retain(|(t, _)| t != me && !t.is_empty());
    out
}

struct Graph {
    /// module -> (target, file, line)
    edges: BTreeMap<Module, Vec<(Module, String, usize)>>,
    modules: BTreeSet<Module>,
}

fn graph() -> Graph {
    let root = src();
    let mut paths = Vec::new();
    files(&root, &mut paths);
    let mut by_module = BTreeMap::new();
    for p in &paths {
        let rel = p.strip_prefix(&root).unwrap().to_path_buf();
        if rel.file_name().is_some_and(|n| n == "tests.rs") || rel == Path::new("main.rs") {
            continue;
        }
        by_module.insert(module_of(&rel), rel);
    }
    let modules: BTreeSet<Module> = by_module.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (m, rel) in &by_module {
        let text = std::fs::read_to_string(root.join(rel)).unwrap();
        let is_mod = rel.file_name().is_some_and(|n| n == "mod.rs");
        let refs = references(m, is_mod, &code_of(&text), &modules);
        let shown = rel.display().to_string();
        edges.insert(
            m.clone(),
            refs.into_iter()
                .map(|(t, l)| (t, shown.clone(), l))
                .collect(),
        );
    }
    Graph { edges, modules }
}

fn layer_of(layers: &[Vec<Module>], m: &Module) -> Option<(usize, Module)> {
    let mut best: Option<(usize, Module)> = None;
    for (i, layer) in layers.iter().enumerate() {
        for entry in layer {
            if m.starts_with(entry) && best.as_ref().is_none_or(|(_, b)| entry.len() > b.len()) {
                best = Some((i, entry.clone()));
            }
        }
    }
    best
}

fn show(m: &Module) -> String {
    m.join("::")
}

/// Strongly connected components of more than one node (Tarjan).
fn circles(nodes: &BTreeSet<Module>, next: &dyn Fn(&Module) -> Vec<Module>) -> Vec<Vec<Module>> {
    struct S<'a> {
        next: &'a dyn Fn(&Module) -> Vec<Module>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on: BTreeSet<Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit(s: &mut S, v: &Module) {
        let i = s.index.len();
        s.index.insert(v.clone(), i);
        s.low.insert(v.clone(), i);
        s.stack.push(v.clone());
        s.on.insert(v.clone());
        for w in (s.next)(v) {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(&w);
                comp.push(w.clone());
                if &w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = S {
        next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// What the three rules find wrong in `g` under `layers`, one line each.
fn violations(g: &Graph, layers: &[Vec<Module>]) -> Vec<String> {
    let mut bad = Vec::new();
    for m in &g.modules {
        if !m.is_empty() && layer_of(layers, m).is_none() {
            bad.push(format!(
                "{} is in no layer of ARCHITECTURE.md's `## Layers`",
                show(m)
            ));
        }
    }
    for (m, es) in &g.edges {
        if m.is_empty() {
            continue; // lib.rs: the dispatch above every room
        }
        let Some((lm, _)) = layer_of(layers, m) else {
            continue;
        };
        for (t, file, line) in es {
            if let Some((lt, entry)) = layer_of(layers, t)
                && lt > lm
            {
                bad.push(format!(
                    "{file}:{line}: {} names {}, which is in a higher layer ({})",
                    show(m),
                    show(t),
                    show(&entry)
                ));
            }
        }
    }
    // Files in a circle; a module and its own ancestors are one room.
    let related = |a: &Module, b: &Module| a.starts_with(b) || b.starts_with(a);
    let file_next = |m: &Module| -> Vec<Module> {
        g.edges
            .get(m)
            .map(|es| {
                es.iter()
                    .map(|e| e.0.clone())
                    .filter(|t| !related(m, t))
                    .collect()
            })
            .unwrap_or_default()
    };
    for c in circles(&g.modules, &file_next) {
        bad.push(format!(
            "these files import each other in a circle: {}",
            c.iter().map(show).collect::<Vec<_>>().join(", ")
        ));
    }
    // The layers' entries (rooms) themselves.
    let entries: BTreeSet<Module> = layers.iter().flatten().cloned().collect();
    let room_next = |r: &Module| -> Vec<Module> {
        let mut out = BTreeSet::new();
        for (m, es) in &g.edges {
            if layer_of(layers, m).map(|x| x.1).as_ref() != Some(r) {
                continue;
            }
            for (t, _, _) in es {
                if let Some((_, e)) = layer_of(layers, t)
                    && &e != r
                {
                    out.insert(e);
                }
            }
        }
        out.into_iter().collect()
    };
    for c in circles(&entries, &room_next) {
        bad.push(format!(
            "these rooms import each other in a circle: {}",
            c.iter().map(show).collect::<Vec<_>>().join(", ")
        ));
    }
    bad
}

#[test]
fn every_import_follows_the_layer_order_and_no_files_import_in_a_circle() {
    let g = graph();
    assert!(
        g.modules.len() > 50,
        "found too few modules: {}",
        g.modules.len()
    );
    let bad = violations(&g, &layers(&architecture()));
    assert!(
        bad.is_empty(),
        "layer order (ARCHITECTURE.md `## Layers`):\n{}",
        bad.join("\n")
    );
}

/// The checker catches what it is for: each of these imports, added back to
/// the tree as it is, is reported.
#[test]
fn the_layer_check_fails_on_an_import_against_the_order_or_a_circle() {
    let layers = layers(&architecture());
    let cases: [(&str, &str, &str); 4] = [
        // The network watchdog asking the gate runner for signal names.
        ("net", "gates::run", "higher layer"),
        // The manifest parser taking chunk sizes from the publisher.
        (
            "cache::format::manifest",
            "cache::publish::chunks",
            "higher layer",
        ),
        // The cache layer reading the machine restore's plan.
        ("cache::gc", "restore::plan", "higher layer"),
        // Two files of the extractor importing each other.
        ("unpack::create", "unpack::extract", "circle"),
    ];
    for (from, to, says) in cases {
        let mut g = graph();
        let from: Module = from.split("::").map(str::to_string).collect();
        let to: Module = to.split("::").map(str::to_string).collect();
        assert!(
            g.modules.contains(&from) && g.modules.contains(&to),
            "{from:?} {to:?}"
        );
        g.edges
            .get_mut(&from)
            .unwrap()
            .push((to.clone(), "added".into(), 1));
        let bad = violations(&g, &layers);
        assert!(
            bad.iter()
                .any(|l| l.contains(says) && l.contains(&show(&to))),
            "adding {} -> {} was not reported: {bad:#?}",
            show(&from),
            show(&to)
        );
    }
}

#[test]
fn the_code_map_lists_every_source_file_and_nothing_else() {
    let doc = architecture();
    let listed: BTreeSet<String> = fenced_after(&doc, "## Code map")
        .iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|w| w.ends_with(".rs"))
        .collect();
    let root = src();
    let mut paths = Vec::new();
    files(&root, &mut paths);
    let real: BTreeSet<String> = paths
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    let missing: Vec<_> = real.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&real).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "ARCHITECTURE.md's code map (paths under xtask/src, one a line) is stale:\n\
         not in the map: {missing:#?}\nin the map but not in the tree: {gone:#?}"
    );
}

#[test]
fn no_function_opts_out_of_the_length_limit_and_no_code_cites_an_issue_number() {
    let mut paths = Vec::new();
    files(&src(), &mut paths);
    files(&source_root().join("tests/it"), &mut paths);
    let needle_allow = ["allow(clippy::", "too_many_lines"].concat();
    let issue = regex_lite::Regex::new(r"(?i)\bissue \d+|\bissue-\d+").unwrap();
    let mut bad = Vec::new();
    for p in &paths {
        let text = std::fs::read_to_string(p).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains(&needle_allow) || issue.is_match(line) {
                bad.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
