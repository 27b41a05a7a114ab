//! A small YAML writer for the generated compose files and Kubernetes manifests.
//!
//! Why not a YAML library: the files are read by three different parsers (PyYAML in
//! docker-compose v1, which is YAML 1.1, Go's yaml.v3 in compose v2 and the docker CLI,
//! and Kubernetes' sigs.k8s.io/yaml), and YAML 1.1 reads plain scalars such as `7700:7700`
//! (sexagesimal), `yes` or `0777` as numbers or booleans. So every string value is written
//! double-quoted with JSON escapes (a JSON string is a valid YAML double-quoted scalar in
//! both 1.1 and 1.2), and only keys that cannot be misread are left plain. The output is
//! block style, with comments where they explain a choice to whoever reads the file.

use std::fmt::Write;

/// A YAML value.
#[derive(Clone, Debug, PartialEq)]
pub enum Yaml {
    Str(String),
    Int(i64),
    Bool(bool),
    /// A block sequence (`- item` per line).
    List(Vec<Yaml>),
    /// A flow sequence of scalars on one line (`["a", "b"]`): commands and the like.
    Flow(Vec<Yaml>),
    /// A mapping, in the given order.
    Map(Vec<Entry>),
}

/// One key of a mapping, with an optional comment written above it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub key: String,
    pub value: Yaml,
    pub comment: Option<String>,
}

pub fn s(v: impl Into<String>) -> Yaml {
    Yaml::Str(v.into())
}

pub fn int(v: impl Into<i64>) -> Yaml {
    Yaml::Int(v.into())
}

pub fn flow<I, T>(items: I) -> Yaml
where
    I: IntoIterator<Item = T>,
    T: Into<String>,
{
    Yaml::Flow(items.into_iter().map(|i| Yaml::Str(i.into())).collect())
}

/// A mapping built key by key.
#[derive(Clone, Debug, Default)]
pub struct MapBuilder(Vec<Entry>);

impl MapBuilder {
    pub fn new() -> MapBuilder {
        MapBuilder(Vec::new())
    }
    pub fn put(mut self, key: impl Into<String>, value: Yaml) -> MapBuilder {
        self.0.push(Entry {
            key: key.into(),
            value,
            comment: None,
        });
        self
    }
    /// A key with a comment line (or several, split on '\n') above it.
    pub fn note(mut self, comment: &str, key: impl Into<String>, value: Yaml) -> MapBuilder {
        self.0.push(Entry {
            key: key.into(),
            value,
            comment: Some(comment.to_string()),
        });
        self
    }
    pub fn push(&mut self, key: impl Into<String>, value: Yaml) {
        self.0.push(Entry {
            key: key.into(),
            value,
            comment: None,
        });
    }
    pub fn build(self) -> Yaml {
        Yaml::Map(self.0)
    }
}

/// Renders one YAML document, ending with a newline.
pub fn render(v: &Yaml) -> String {
    let mut out = String::new();
    match v {
        Yaml::Map(entries) if !entries.is_empty() => map(&mut out, entries, 0),
        Yaml::List(items) if !items.is_empty() => list(&mut out, items, 0),
        other => {
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
    out
}

/// Several documents in one stream, separated by `---`.
pub fn render_all(docs: &[Yaml]) -> String {
    docs.iter().map(render).collect::<Vec<_>>().join("---\n")
}

/// A scalar, an empty collection or a flow sequence on one line.
fn inline(v: &Yaml) -> String {
    match v {
        Yaml::Str(s) => quote(s),
        Yaml::Int(i) => i.to_string(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::List(items) | Yaml::Flow(items) => {
            let parts: Vec<String> = items.iter().map(inline).collect();
            format!("[{}]", parts.join(", "))
        }
        Yaml::Map(entries) => {
            let parts: Vec<String> = entries
                .iter()
                .map(|e| format!("{}: {}", key(&e.key), inline(&e.value)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

/// True for values written on the key's line.
fn is_inline(v: &Yaml) -> bool {
    match v {
        Yaml::List(items) => items.is_empty(),
        Yaml::Map(entries) => entries.is_empty(),
        _ => true,
    }
}

fn comment(out: &mut String, text: &str, indent: usize) {
    for line in text.lines() {
        let _ = writeln!(out, "{:indent$}# {line}", "", indent = indent);
    }
}

fn map(out: &mut String, entries: &[Entry], indent: usize) {
    for e in entries {
        if let Some(c) = &e.comment {
            comment(out, c, indent);
        }
        let _ = write!(out, "{:indent$}{}:", "", key(&e.key), indent = indent);
        value_after_key(out, &e.value, indent);
    }
}

fn value_after_key(out: &mut String, v: &Yaml, indent: usize) {
    if is_inline(v) {
        let _ = writeln!(out, " {}", inline(v));
        return;
    }
    out.push('\n');
    match v {
        Yaml::Map(entries) => map(out, entries, indent + 2),
        Yaml::List(items) => list(out, items, indent + 2),
        _ => unreachable!("scalars are inline"),
    }
}

fn list(out: &mut String, items: &[Yaml], indent: usize) {
    for item in items {
        match item {
            Yaml::Map(entries) if !entries.is_empty() => {
                // The first key shares the dash's line; the others align with it.
                let mut first = true;
                for e in entries {
                    if let Some(c) = &e.comment {
                        comment(out, c, indent + 2);
                    }
                    if first {
                        let _ = write!(out, "{:indent$}- {}:", "", key(&e.key), indent = indent);
                        first = false;
                    } else {
                        let _ = write!(out, "{:w$}{}:", "", key(&e.key), w = indent + 2);
                    }
                    value_after_key(out, &e.value, indent + 2);
                }
            }
            Yaml::List(inner) if !inner.is_empty() => {
                let _ = writeln!(out, "{:indent$}-", "", indent = indent);
                list(out, inner, indent + 2);
            }
            other => {
                let _ = writeln!(out, "{:indent$}- {}", "", inline(other), indent = indent);
            }
        }
    }
}

/// A double-quoted scalar with JSON escapes.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

/// Words YAML 1.1 reads as booleans or null when plain.
const AMBIGUOUS: &[&str] = &[
    "y", "yes", "n", "no", "true", "false", "on", "off", "null", "~",
];

/// A mapping key: plain when it is made of safe characters, starts with a letter and
/// cannot be read as anything but a string; quoted otherwise.
fn key(k: &str) -> String {
    let safe = k
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && !AMBIGUOUS.contains(&k.to_ascii_lowercase().as_str());
    if safe {
        k.to_string()
    } else {
        quote(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_block_style() {
        let doc = MapBuilder::new()
            .note(
                "why",
                "services",
                MapBuilder::new()
                    .put(
                        "M1QAF1",
                        MapBuilder::new()
                            .put("command", flow(["exanetd", "--node", "M1QAF1"]))
                            .put("ports", Yaml::List(vec![s("7700:7700/udp")]))
                            .put("empty", Yaml::Map(vec![]))
                            .build(),
                    )
                    .build(),
            )
            .put(
                "items",
                Yaml::List(vec![
                    MapBuilder::new()
                        .put("a", int(1))
                        .put("b", Yaml::Bool(true))
                        .build(),
                    s("x"),
                ]),
            )
            .build();
        let text = render(&doc);
        assert_eq!(
            text,
            "# why\nservices:\n  M1QAF1:\n    command: [\"exanetd\", \"--node\", \"M1QAF1\"]\n    \
             ports:\n      - \"7700:7700/udp\"\n    empty: {}\nitems:\n  - a: 1\n    b: true\n  - \"x\"\n"
        );
    }

    #[test]
    fn misreadable_keys_and_strings_are_quoted() {
        assert_eq!(key("on"), "\"on\"");
        assert_eq!(key("9090"), "\"9090\"");
        assert_eq!(key("M1QAF1"), "M1QAF1");
        assert_eq!(key("a b"), "\"a b\"");
        assert_eq!(quote("say \"hi\"\n"), "\"say \\\"hi\\\"\\n\"");
    }
}
