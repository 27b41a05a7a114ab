//! `docs/architecture.md` names the workspace's crates and the files that hold its
//! `unsafe` code. Both drifted once (a crate missing from the table, a file missing from
//! the list: issue 51), so this checks them against the workspace itself: every member
//! has its row, every row that is a crate is a member, the files named are exactly those
//! of the production sources that hold unsafe code, and every crate root says so (`deny`
//! where a named file is, `forbid` everywhere else).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

fn members() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let doc: toml::Value = toml::from_str(&text).unwrap();
    doc["workspace"]["members"]
        .as_array()
        .expect("workspace.members")
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect()
}

fn page() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).unwrap()
}

/// The backticked words of `text`.
fn ticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The directories the crate table's first column names.
fn table_dirs(page: &str) -> BTreeSet<String> {
    let start = page.find("## Crates").expect("a Crates section");
    let section = &page[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    section[..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| ticked(l.split('|').nth(1).unwrap_or("")))
        .map(|d| d.trim_end_matches('/').to_string())
        .collect()
}

/// Whether a line of Rust holds unsafe code (not a type of unsafe function pointer, not
/// a comment, not a lint).
fn unsafe_line(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    if code.contains("unsafe {") || code.contains("unsafe fn ") || code.contains("unsafe impl ") {
        return true;
    }
    // `unsafe extern "C" fn name(`: a definition; `fn(` alone is a pointer type.
    code.split("unsafe extern \"C\" fn ")
        .skip(1)
        .any(|rest| rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_crate_of_the_workspace_has_its_row_and_every_row_its_crate() {
    let members: BTreeSet<String> = members().into_iter().collect();
    let dirs = table_dirs(&page());
    let missing: Vec<_> = members.difference(&dirs).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's crate table has no row for {missing:?}"
    );
    for d in &dirs {
        let path = root().join(d);
        assert!(
            path.is_dir(),
            "the crate table names {d}/, which does not exist"
        );
        if path.join("Cargo.toml").is_file() {
            assert!(
                members.contains(d),
                "the crate table names {d}/, which is not a workspace member"
            );
        }
    }
}

#[test]
fn the_unsafe_list_names_exactly_the_files_with_unsafe_code() {
    let page = page();
    let start = page
        .find("The project's `unsafe` code is in")
        .expect("the sentence that lists the unsafe code");
    let end = start + page[start..].find("those crates deny it").expect("its end");
    let named: BTreeSet<String> = ticked(&page[start..end])
        .into_iter()
        .filter(|t| t.ends_with(".rs"))
        .map(str::to_string)
        .collect();
    let mut found = BTreeSet::new();
    for m in members() {
        let mut files = Vec::new();
        rust_files(&root().join(&m).join("src"), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            if text.lines().any(unsafe_line) {
                let rel = f.strip_prefix(root()).unwrap();
                found.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    assert_eq!(
        named, found,
        "docs/architecture.md lists these files as holding the unsafe code (left), the \
         sources have it in these (right)"
    );
    // Each crate root says where unsafe code may be: denied (allowed in the named
    // modules only) where a named file is, forbidden everywhere else.
    for m in members() {
        let holds = found.iter().any(|f| f.starts_with(&format!("{m}/")));
        let want = if holds {
            "#![deny(unsafe_code)]"
        } else {
            "#![forbid(unsafe_code)]"
        };
        for root_file in ["src/lib.rs", "src/main.rs"] {
            let p = root().join(&m).join(root_file);
            if let Ok(text) = std::fs::read_to_string(&p) {
                assert!(text.contains(want), "{m}/{root_file} does not say {want}");
            }
        }
    }
}
