//! The crate's layers only look down: each module of `src/` names items of
//! the modules docs/architecture.md lets it use, and of no other.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Each top-level module of `src/`, and those it may use, lowest first.
const LAYERS: &[(&str, &[&str])] = &[
    ("values", &[]),
    ("lanes", &[]),
    ("config", &[]),
    ("arrays", &["values", "lanes"]),
    ("keys", &["values", "lanes", "arrays"]),
    ("backend", &["keys", "arrays", "values", "lanes", "config"]),
    ("testing", &["backend", "values"]),
    ("pinned_batches", &["backend", "arrays", "values"]),
    ("algorithms", &["backend", "keys", "arrays", "values", "lanes", "config"]),
    ("exec", &["algorithms", "backend", "keys", "arrays", "values", "lanes", "config", "testing"]),
    ("rule", &["exec", "algorithms", "backend", "keys", "arrays", "values", "config"]),
    ("session", &["rule", "exec", "algorithms", "backend", "pinned_batches", "keys", "config"]),
    ("distributed", &["rule", "config"]),
];

fn source_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            source_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// `source` without comments and the contents of string and char literals,
/// which may spell paths that are no imports.
fn code_of(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let (mut code, mut i) = (String::with_capacity(source.len()), 0);
    let at = |i: usize, text: &str| text.chars().enumerate().all(|(k, c)| chars.get(i + k) == Some(&c));
    while i < chars.len() {
        if at(i, "//") {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            while i < chars.len() && !at(i, "*/") {
                i += 1;
            }
            i += 2;
        } else if chars[i] == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            code.push_str("\"\"");
        } else if chars[i] == '\'' && (chars.get(i + 2) == Some(&'\'') || chars.get(i + 1) == Some(&'\\')) {
            // A char literal ('x' or an escape), not a lifetime.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            code.push_str("' '");
        } else {
            code.push(chars[i]);
            i += 1;
        }
    }
    code
}

/// The top-level modules a file names through `crate::`, its tests left out.
fn named_modules(source: &str) -> BTreeSet<String> {
    let code = code_of(source);
    let code = code.split("#[cfg(test)]").next().unwrap_or_default();
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let preceded = code[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
        let module: String = code[at + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !preceded && !module.is_empty() {
            named.insert(module);
        }
    }
    named
}

#[test]
fn layers_only_name_the_layers_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    source_files(&src, &mut files);
    let layer_of = |top: &str| LAYERS.iter().find(|(name, _)| *name == top);
    let mut wrong = vec![];
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let top = relative.components().next().and_then(|c| c.as_os_str().to_str()).unwrap_or_default();
        let top = top.trim_end_matches(".rs");
        if top == "lib" {
            continue;
        }
        let Some((_, allowed)) = layer_of(top) else {
            wrong.push(format!("{}: module `{top}` is in no layer of this test", relative.display()));
            continue;
        };
        let source = fs::read_to_string(file).expect("a source file is readable");
        for named in named_modules(&source) {
            if named != top && !allowed.contains(&named.as_str()) {
                wrong.push(format!("{} names `crate::{named}`, which `{top}` may not use", relative.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "layers that look up or sideways:\n{}", wrong.join("\n"));
}

#[test]
fn the_check_sees_imports_and_paths_but_not_comments_or_strings() {
    let source = "use crate::exec::GpuJoinExec;\n\
                  // crate::rule in a comment\n\
                  let s = \"crate::session in a string\";\n\
                  let c = '\"';\n\
                  fn f() { crate::keys::KeyEncoder::new(); }\n\
                  #[cfg(test)]\nmod tests { use crate::config; }";
    let named: Vec<String> = named_modules(source).into_iter().collect();
    assert_eq!(named, ["exec", "keys"]);
}
