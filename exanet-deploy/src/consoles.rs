//! Prometheus console pages for a rack: a rack view drawn as the rack's topology, a page
//! per link and a page per node, served by the rack's own Prometheus
//! (`--web.console.templates`, `--web.console.libraries`) at `/consoles/<page>`.
//!
//! ```text
//! consoles/exanet-rack.html            the rack: every link direction coloured by utilization
//! consoles/exanet-link.html?node=A&peer=B   one link, both directions, every link view
//! consoles/exanet-node.html?node=A     one node: every node view, its link directions
//! console_libraries/exanet.lib         page head and style, formatters, one template per view
//! ```
//!
//! Prometheus renders console pages server-side with Go's html/template, its `query`
//! function and a few helpers; Debian's package ships no console library and no graph
//! library, so this one is self-contained: plain HTML and inline SVG, no script, nothing
//! fetched. The quantities are [`crate::views`], the same the Grafana dashboards show; the
//! library holds one template per view (`exanet.view.<id>`), called with
//! `(args WINDOW RANGE NODE PEER RATE)`, and its expression takes those through `printf`
//! (`%[1]s` the rate window, `%[2]s` the range, `%[3]s` the node, `%[4]s` the peer,
//! `%[5]s` the link's nominal bit rate). Pages take `w` (rate window, default 1m), `range`
//! (default 1h) and `refresh` (seconds, default 15, 0: never) from their URL.
//!
//! Node and peer names from a URL are checked against the rack's nodes and link
//! directions before they reach a query, so a page never runs PromQL a visitor wrote.
//!
//! Every link direction of the rack view is an SVG element with `data-link="A->B"`,
//! `data-util` (modeled utilization), `data-wire-util` and `data-up`, numbers even when
//! the link is idle (PromQL `or` falls back on `exanet_link_up`), so that tools and tests
//! can read the picture as well as people.

use std::fmt::Write as _;

use exanet_proto::topology::{self, Link, LinkKind};
use exanet_proto::{Coord, NodeId, Shape};

use crate::views::{self, Binding, Scope, Side, View};
use crate::GenFile;

/// Directories, relative to the Prometheus configuration, of the pages and the library.
pub const CONSOLE_DIR: &str = "consoles";
pub const LIBRARY_DIR: &str = "console_libraries";
pub const RACK_PAGE: &str = "exanet-rack.html";
pub const LINK_PAGE: &str = "exanet-link.html";
pub const NODE_PAGE: &str = "exanet-node.html";
pub const LIBRARY: &str = "exanet.lib";

/// The rate window and range pages use unless their URL says otherwise.
const DEFAULT_WINDOW: &str = "1m";
const DEFAULT_RANGE: &str = "1h";
const DEFAULT_REFRESH: &str = "15";

/// Colour classes of the rack view by modeled utilization: the class holds from its lower
/// bound (inclusive) up to the next one. `u0` is exactly 0: an idle link direction.
pub const UTIL_CLASSES: &[(&str, f64, &str, &str)] = &[
    ("u6", 0.9, "#a50f15", "90% and more"),
    ("u5", 0.75, "#e8552d", "75-90%"),
    ("u4", 0.5, "#f8a13f", "50-75%"),
    ("u3", 0.25, "#f2d43d", "25-50%"),
    ("u2", 0.1, "#74c69d", "10-25%"),
    ("u1", f64::MIN_POSITIVE, "#9ecae1", "above 0, below 10%"),
];
const IDLE_COLOUR: &str = "#c9ced6";

/// The page files and the library, paths relative to the Prometheus configuration's
/// directory.
pub fn files(shape: Shape, rack: &str) -> Vec<GenFile> {
    let rack = Rack::new(shape, rack);
    vec![
        GenFile::new(format!("{LIBRARY_DIR}/{LIBRARY}"), library(&rack)),
        GenFile::new(format!("{CONSOLE_DIR}/{RACK_PAGE}"), rack_page(&rack)),
        GenFile::new(format!("{CONSOLE_DIR}/{LINK_PAGE}"), link_page(&rack)),
        GenFile::new(format!("{CONSOLE_DIR}/{NODE_PAGE}"), node_page(&rack)),
    ]
}

/// What every page needs to know of the rack.
struct Rack {
    shape: Shape,
    /// HTML-escaped (and safe inside a template: no braces).
    name: String,
    /// As the rack file has it, for Go string literals (html/template escapes those).
    raw_name: String,
    links: Vec<Link>,
}

impl Rack {
    fn new(shape: Shape, name: &str) -> Rack {
        Rack {
            shape,
            name: html_text(name),
            raw_name: name.to_string(),
            links: topology::links(&shape),
        }
    }

    fn node(&self, id: NodeId) -> String {
        self.shape.display(id)
    }

    /// Every link direction: (sender, receiver, kind).
    fn directions(&self) -> Vec<(NodeId, NodeId, LinkKind)> {
        self.links
            .iter()
            .flat_map(|l| [(l.a, l.b, l.kind), (l.b, l.a, l.kind)])
            .collect()
    }
}

/// Escapes text for HTML, and braces too, so that it cannot open a template action.
fn html_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '{' => out.push_str("&#123;"),
            '}' => out.push_str("&#125;"),
            c => out.push(c),
        }
    }
    out
}

/// A PromQL expression as a Go raw string (PromQL has no backquotes; `%` is doubled for
/// `printf`).
fn go_raw(expr: &str) -> String {
    debug_assert!(!expr.contains('`'), "{expr}");
    format!("`{}`", expr.replace('%', "%%"))
}

/// The binding of console expressions for a view of `scope`: names come from the
/// template's arguments through `printf`.
fn console_binding(scope: Scope) -> (String, String, &'static [&'static str]) {
    match scope {
        Scope::Rack => (r#"node=~".+""#.into(), r#"node=~".+""#.into(), &[]),
        Scope::Node => (
            r#"node="%[3]s""#.into(),
            r#"node="%[3]s""#.into(),
            &["node"],
        ),
        Scope::Link(Side::Sender) => (
            r#"node="%[3]s",peer="%[4]s""#.into(),
            r#"node="%[3]s""#.into(),
            &["node", "peer"],
        ),
        Scope::Link(Side::Receiver) => (
            r#"node="%[4]s",peer="%[3]s""#.into(),
            r#"node="%[4]s""#.into(),
            &["node", "peer"],
        ),
    }
}

/// A view's query `i` as console PromQL with `printf` verbs for the template's arguments.
fn console_expr(v: &View, i: usize) -> String {
    let (sel, node, by) = console_binding(v.scope);
    // The template's verbs are marked with control characters until go_raw has doubled
    // the expression's own `%`s; printf_of puts them back.
    let e = views::expand(
        v.queries[i].expr,
        &Binding {
            sel: &sel,
            node: &node,
            by,
            window: "\u{1}1",
            range: "\u{1}2",
            rate: "\u{1}5",
        },
    );
    e.replace("%[", "\u{2}[")
}

/// The Go template expression computing a view's query `i` from `(args W RANGE NODE PEER
/// RATE)` in `.`.
fn printf_expr(v: &View, i: usize) -> String {
    printf_of(&console_expr(v, i))
}

/// The Go template expression of a console expression (see [`console_expr`]): `printf`
/// over the template's arguments when it names any, else the expression as it is (a
/// `printf` with arguments it does not use would append complaints to the query).
fn printf_of(e: &str) -> String {
    if !e.contains(['\u{1}', '\u{2}']) {
        debug_assert!(!e.contains('`'), "{e}");
        return format!("`{e}`");
    }
    let raw = go_raw(e)
        .replace("\u{1}1", "%[1]s")
        .replace("\u{1}2", "%[2]s")
        .replace("\u{1}5", "%[5]s")
        .replace("\u{2}[", "%[");
    format!("printf {raw} .arg0 .arg1 .arg2 .arg3 .arg4")
}

/// A Grafana legend (`{{reason}} ({{direction}})`) as template text over a sample.
fn legend_template(legend: &str) -> String {
    let mut out = String::new();
    let mut rest = legend;
    while let Some(i) = rest.find("{{") {
        out.push_str(&html_text(&rest[..i]));
        let after = &rest[i + 2..];
        match after.find("}}") {
            Some(j) => {
                let label = after[..j].trim();
                if label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    let _ = write!(out, "{{{{ .Labels.{label} }}}}");
                }
                rest = &after[j + 2..];
            }
            None => {
                rest = after;
            }
        }
    }
    out.push_str(&html_text(rest));
    out
}

/// A legend's fixed words (`p50 {{op}}` is `p50`), for text outside any series.
fn legend_words(legend: &str) -> String {
    let mut out = String::new();
    let mut rest = legend;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        rest = rest[i..].find("}}").map_or("", |j| &rest[i + j + 2..]);
    }
    out.push_str(rest);
    html_text(
        out.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .as_str(),
    )
}

/// The console library: page head and foot, formatters, colour classes, and one template
/// per view and for a link direction and a node of the rack view.
fn library(rack: &Rack) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{{{{/* exanet console library for rack {}, generated by exanet-deploy \
         (consoles.rs) from the views the Grafana dashboards show too. Regenerate \
         rather than edit. */}}}}",
        rack.name
    );
    // Head: args (TITLE W RANGE REFRESH NODE PEER); NODE and PEER, when not empty, are
    // kept by the form that changes the window.
    let mut css = String::from(STYLE);
    for (class, _, colour, _) in UTIL_CLASSES {
        let _ = writeln!(
            css,
            ".ld.{class}{{stroke:{colour}}} .sw.{class}{{background:{colour}}}"
        );
    }
    let _ = writeln!(
        css,
        ".ld.u0{{stroke:{IDLE_COLOUR}}} .sw.u0{{background:{IDLE_COLOUR}}}"
    );
    let _ = write!(
        s,
        r#"{{{{ define "exanet.head" }}}}<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
{{{{ if ne .arg3 "0" }}}}<meta http-equiv="refresh" content="{{{{ .arg3 }}}}">{{{{ end }}}}
<title>{{{{ .arg0 }}}}</title>
<style>
{css}</style></head>
<body><header><strong>exanet</strong><span>rack {name}</span>
<a href="{RACK_PAGE}?w={{{{ .arg1 }}}}&amp;range={{{{ .arg2 }}}}&amp;refresh={{{{ .arg3 }}}}">rack view</a>
<a href="{{{{ pathPrefix }}}}/targets">targets</a><a href="{{{{ pathPrefix }}}}/graph">graph</a>
<form method="get">{{{{ if .arg4 }}}}<input type="hidden" name="node" value="{{{{ .arg4 }}}}">{{{{ end }}}}{{{{ if .arg5 }}}}<input type="hidden" name="peer" value="{{{{ .arg5 }}}}">{{{{ end }}}}
<label>rate window <input name="w" size="4" value="{{{{ .arg1 }}}}"></label>
<label>range <input name="range" size="4" value="{{{{ .arg2 }}}}"></label>
<label>refresh (s) <input name="refresh" size="3" value="{{{{ .arg3 }}}}"></label>
<button>apply</button></form></header>
<main>
{{{{ end }}}}
{{{{ define "exanet.tail" }}}}</main></body></html>
{{{{ end }}}}
"#,
        name = rack.name
    );
    // Formatters: a NaN (a quantile without observations, 0/0) shows as a dash.
    for u in views::Unit::ALL {
        let body = match u {
            views::Unit::Count => "{{ humanize . }}",
            views::Unit::PerSecond => "{{ humanize . }}/s",
            views::Unit::BitsPerSecond => "{{ humanize . }}b/s",
            views::Unit::Bytes => "{{ humanize1024 . }}B",
            views::Unit::Seconds => "{{ humanizeDuration . }}",
            views::Unit::Ratio => "{{ humanizePercentage . }}",
        };
        let _ = writeln!(
            s,
            "{{{{ define \"exanet.fmt.{}\" }}}}{{{{ if ne . . }}}}&#8212;{{{{ else }}}}{body}{{{{ end }}}}{{{{ end }}}}",
            u.key()
        );
    }
    // Colour class of a modeled utilization, from UTIL_CLASSES.
    s.push_str("{{ define \"exanet.ucls\" }}{{ if ne . . }}nodata");
    for (class, low, _, _) in UTIL_CLASSES {
        let low = if *low == f64::MIN_POSITIVE {
            "{{ else if gt . 0.0 }}".to_string()
        } else {
            format!("{{{{ else if ge . {low:?} }}}}")
        };
        let _ = write!(s, "{low}{class}");
    }
    s.push_str("{{ else }}u0{{ end }}{{ end }}\n");
    // The legend of those colours.
    s.push_str(
        "{{ define \"exanet.legend\" }}<div class=\"legend\"><span>modeled utilization:</span>",
    );
    let _ = write!(s, "<span><i class=\"sw u0\"></i>idle (0)</span>");
    for (class, _, _, words) in UTIL_CLASSES.iter().rev() {
        let _ = write!(s, "<span><i class=\"sw {class}\"></i>{words}</span>");
    }
    s.push_str(
        "<span><i class=\"sw down\"></i>link down</span>\
         <span><i class=\"sw nodata\"></i>no data</span></div>{{ end }}\n",
    );
    // One template per view: its current values, each marked with the view and the value.
    for v in views::all() {
        let _ = write!(s, "{{{{ define \"exanet.view.{}\" }}}}", v.id);
        let dir = match v.scope {
            Scope::Link(_) => " data-dir=\"{{ .arg2 }}->{{ .arg3 }}\"",
            _ => "",
        };
        let _ = write!(s, "<span class=\"vals\" data-view=\"{}\"{dir}>", v.id);
        for (i, q) in v.queries.iter().enumerate() {
            let legend = legend_template(q.legend);
            let label = if legend.is_empty() {
                String::new()
            } else {
                format!("<b>{legend}</b> ")
            };
            let _ = write!(
                s,
                "{{{{ $e := {} }}}}{{{{ range query $e }}}}<span class=\"v\" data-value=\"{{{{ printf \"%g\" .Value }}}}\">{label}{{{{ template \"exanet.fmt.{}\" .Value }}}}</span>{{{{ else }}}}<span class=\"none\">{}</span>{{{{ end }}}}<a class=\"g\" title=\"graph of {}\" href=\"{{{{ pathPrefix }}}}{{{{ graphLink $e }}}}\">&#8599;</a>",
                printf_expr(v, i),
                v.unit.key(),
                // A view with several queries says which one has no data.
                if v.queries.len() > 1 && !legend.is_empty() {
                    format!("{}: no data", legend_words(q.legend))
                } else {
                    "no data".to_string()
                },
                html_text(&v.title.to_lowercase()),
            );
        }
        s.push_str("</span>{{ end }}\n");
    }
    // A link direction of the rack view: args (W RANGE NODE PEER RATE PATH). The numbers
    // fall back to 0 for an idle link (a link whose sender's modeled clock did not move
    // has no modeled utilization, an idle one no rate) as long as the link exists.
    let fallback = r#" or (sum by (node, peer) (exanet_link_up{node="%[3]s",peer="%[4]s"}) * 0)"#;
    let with_fallback = |v: &View| {
        let e = console_expr(v, 0);
        printf_of(&format!("({e}){}", fallback.replace("%[", "\u{2}[")))
    };
    let _ = write!(
        s,
        r#"{{{{ define "exanet.linkdir" }}}}{{{{ $u := -1.0 }}}}{{{{ $wu := -1.0 }}}}{{{{ $up := -1.0 }}}}
{{{{- with query ({modeled}) }}}}{{{{ $u = (. | first | value) }}}}{{{{ end }}}}
{{{{- with query ({wire}) }}}}{{{{ $wu = (. | first | value) }}}}{{{{ end }}}}
{{{{- with query ({up}) }}}}{{{{ $up = (. | first | value) }}}}{{{{ end }}}}
<a href="{LINK_PAGE}?node={{{{ .arg2 }}}}&amp;peer={{{{ .arg3 }}}}"><path class="ld {{{{ if lt $up 0.0 }}}}nodata{{{{ else if lt $up 1.0 }}}}down{{{{ else }}}}{{{{ template "exanet.ucls" $u }}}}{{{{ end }}}}" d="{{{{ .arg5 }}}}" marker-end="url(#arrow)" data-link="{{{{ .arg2 }}}}->{{{{ .arg3 }}}}" data-util="{{{{ if lt $u 0.0 }}}}0{{{{ else }}}}{{{{ printf "%.6g" $u }}}}{{{{ end }}}}" data-wire-util="{{{{ if lt $wu 0.0 }}}}0{{{{ else }}}}{{{{ printf "%.6g" $wu }}}}{{{{ end }}}}" data-up="{{{{ if lt $up 0.0 }}}}unknown{{{{ else }}}}{{{{ printf "%.0f" $up }}}}{{{{ end }}}}"><title>{{{{ .arg2 }}}} -> {{{{ .arg3 }}}}: {{{{ if lt $up 0.0 }}}}no data{{{{ else }}}}{{{{ if lt $up 1.0 }}}}DOWN, {{{{ end }}}}modeled utilization {{{{ template "exanet.fmt.ratio" $u }}}}, wire utilization {{{{ template "exanet.fmt.ratio" $wu }}}} of {{{{ humanize .arg4 }}}}b/s{{{{ end }}}}</title></path></a>
{{{{ end }}}}
"#,
        modeled = with_fallback(&views::MODELED_UTIL),
        wire = with_fallback(&views::WIRE_UTIL),
        up = printf_expr(&views::LINK_UP, 0),
    );
    s.push_str(&link_row_template());
    // A node of the rack view: args (W RANGE NODE CX CY LABEL).
    let _ = write!(
        s,
        r#"{{{{ define "exanet.node" }}}}{{{{ $up := -1.0 }}}}{{{{ with query (printf `max(exanet_node_uptime_seconds{{node="%[3]s"}})` .arg0 .arg1 .arg2) }}}}{{{{ $up = (. | first | value) }}}}{{{{ end }}}}
<a href="{NODE_PAGE}?node={{{{ .arg2 }}}}"><g class="node {{{{ if lt $up 0.0 }}}}nodata{{{{ else }}}}up{{{{ end }}}}" data-node="{{{{ .arg2 }}}}"><circle cx="{{{{ .arg3 }}}}" cy="{{{{ .arg4 }}}}" r="{NODE_R}"></circle><text x="{{{{ .arg3 }}}}" y="{{{{ .arg4 }}}}" dy="4">{{{{ .arg5 }}}}</text><title>{{{{ .arg2 }}}}: {{{{ if lt $up 0.0 }}}}no data (daemon not scraped){{{{ else }}}}up {{{{ humanizeDuration $up }}}}{{{{ end }}}}</title></g></a>
{{{{ end }}}}
"#
    );
    s
}

const STYLE: &str = "\
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1f2933;background:#f6f7f9}
header{background:#1f2933;color:#e4e7eb;padding:8px 16px;display:flex;gap:18px;align-items:center;flex-wrap:wrap}
header a{color:#9fd3ff;text-decoration:none}
header form{margin-left:auto;display:flex;gap:8px;align-items:center;font-size:12px}
header input{font-size:12px}
main{padding:12px 16px}
h1{font-size:20px;margin:4px 0 10px}
h2{font-size:16px;margin:18px 0 6px}
.stats{display:flex;gap:10px;flex-wrap:wrap;margin-bottom:10px}
.stat{background:#fff;border:1px solid #d9dde3;border-radius:6px;padding:6px 10px;min-width:120px}
.stat .t{font-size:11px;color:#52606d}
.stat .v{font-size:20px;font-weight:600}
table{border-collapse:collapse;background:#fff;margin-bottom:12px}
th,td{border:1px solid #d9dde3;padding:4px 8px;text-align:left;vertical-align:top}
th{font-weight:500;background:#eef1f4}
.vals .v{display:inline-block;margin-right:10px}
.none{color:#9aa5b1}
a.g{font-size:11px;margin:0 10px 0 4px;color:#7b8794;text-decoration:none}
.error{color:#a50f15;font-weight:600}
.legend{display:flex;gap:12px;flex-wrap:wrap;font-size:12px;margin:6px 0}
.legend span{display:inline-flex;align-items:center;gap:4px}
.sw{display:inline-block;width:22px;height:6px;border-radius:3px}
.sw.down{background:repeating-linear-gradient(90deg,#1f2933 0 5px,transparent 5px 8px)}
.sw.nodata{background:repeating-linear-gradient(90deg,#c9ced6 0 2px,transparent 2px 5px)}
svg.rack{background:#fff;border:1px solid #d9dde3;border-radius:6px;max-width:100%;height:auto}
.ld{fill:none;stroke-width:4;stroke-linecap:round}
.ld.down{stroke:#1f2933;stroke-dasharray:6 4}
.ld.nodata{stroke:#c9ced6;stroke-dasharray:2 4}
a:hover .ld{stroke-width:7}
.node circle{fill:#fff;stroke:#1f2933;stroke-width:2}
.node.nodata circle{stroke:#9aa5b1;stroke-dasharray:3 3}
a:hover .node circle{fill:#e4f1fb}
.node text{font-size:11px;text-anchor:middle;fill:#1f2933;pointer-events:none}
.qfdb{fill:#f3f5f8;stroke:#b8c0ca;stroke-width:1}
.qlabel{font-size:12px;fill:#52606d}
.plabel{font-size:13px;fill:#1f2933;font-weight:600}
#arrow path{fill:#52606d}
";

/// The query parameters every page reads, with defaults, checked before use.
fn params_prelude() -> String {
    format!(
        "{{{{ $w := \"{DEFAULT_WINDOW}\" }}}}{{{{ if match `^[1-9][0-9]{{0,5}}(ms|s|m|h|d)$` .Params.w }}}}{{{{ $w = .Params.w }}}}{{{{ end }}}}\n\
         {{{{ $range := \"{DEFAULT_RANGE}\" }}}}{{{{ if match `^[1-9][0-9]{{0,5}}(ms|s|m|h|d)$` .Params.range }}}}{{{{ $range = .Params.range }}}}{{{{ end }}}}\n\
         {{{{ $refresh := \"{DEFAULT_REFRESH}\" }}}}{{{{ if match `^[0-9]{{1,5}}$` .Params.refresh }}}}{{{{ $refresh = .Params.refresh }}}}{{{{ end }}}}\n"
    )
}

/// Rows of a table of views: one row per view, one cell per `(node, peer)` argument pair
/// (Go template expressions).
fn view_rows(out: &mut String, views: &[&View], cells: &[(&str, &str)], rate: &str) {
    for v in views {
        let _ = write!(out, "<tr><th>{}</th>", html_text(v.title));
        for (node, peer) in cells {
            let _ = write!(
                out,
                "<td>{{{{ template \"exanet.view.{}\" (args $w $range {node} {peer} {rate}) }}}}</td>",
                v.id
            );
        }
        out.push_str("</tr>\n");
    }
}

/// The page head; `node` and `peer` are Go template expressions (`""` when none).
fn head(title: &str, node: &str, peer: &str) -> String {
    format!("{{{{ template \"exanet.head\" (args {title} $w $range $refresh {node} {peer}) }}}}\n")
}

/// A Go template string literal of `s` (control characters, which no name needs, are
/// left out).
fn go_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars().filter(|c| !c.is_control()) {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// A regexp matching exactly one of `words` (made of letters, digits and `>`).
fn one_of(words: impl IntoIterator<Item = String>) -> String {
    let w: Vec<String> = words.into_iter().collect();
    format!("`^({})$`", w.join("|"))
}

/// The rack view.
fn rack_page(rack: &Rack) -> String {
    let shape = rack.shape;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{{{{/* The rack view of rack {}: generated by exanet-deploy (consoles.rs). */}}}}",
        rack.name
    );
    s.push_str(&params_prelude());
    s.push_str(&head(
        &go_str(&format!("exanet rack {}", rack.raw_name)),
        "\"\"",
        "\"\"",
    ));
    let _ = writeln!(
        s,
        "<h1>Rack {} <small>({shape}: {} QFDBs, {} nodes, {} links)</small></h1>",
        rack.name,
        shape.qfdbs(),
        shape.nodes(),
        rack.links.len()
    );
    s.push_str("<div class=\"stats\">\n");
    for v in views::RACK
        .iter()
        .filter(|v| v.display == views::Display::Stat)
    {
        let _ = writeln!(
            s,
            "<div class=\"stat\"><div class=\"t\">{}</div>{{{{ template \"exanet.view.{}\" (args $w $range \"\" \"\" \"\") }}}}</div>",
            html_text(v.title),
            v.id
        );
    }
    s.push_str("</div>\n");
    s.push_str(
        "<p>Each link direction is an arrow from its sender, coloured by its <b>modeled \
         utilization</b> over the last {{ $w }}: the time the modeled hardware's output spent \
         sending over the time its node's modeled clock advanced. Hover for the wire \
         utilization too (the emulator's tx bit rate over the link's nominal rate); click a \
         link or a node for its page.</p>\n{{ template \"exanet.legend\" }}\n",
    );
    s.push_str(&rack_svg(rack));
    s.push_str("<h2>Busiest links</h2>\n<table>\n");
    for v in views::RACK
        .iter()
        .filter(|v| v.display == views::Display::Graph)
    {
        let _ = writeln!(
            s,
            "<tr><th>{}</th><td>{{{{ template \"exanet.view.{}\" (args $w $range \"\" \"\" \"\") }}}}</td></tr>",
            html_text(v.title),
            v.id
        );
    }
    s.push_str("</table>\n{{ template \"exanet.tail\" }}\n");
    s
}

/// A point of the drawing.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pt {
    x: f64,
    y: f64,
}

impl Pt {
    fn add(self, o: Pt) -> Pt {
        Pt {
            x: self.x + o.x,
            y: self.y + o.y,
        }
    }
    fn sub(self, o: Pt) -> Pt {
        Pt {
            x: self.x - o.x,
            y: self.y - o.y,
        }
    }
    fn mul(self, k: f64) -> Pt {
        Pt {
            x: self.x * k,
            y: self.y * k,
        }
    }
    fn len(self) -> f64 {
        self.x.hypot(self.y)
    }
    fn unit(self) -> Pt {
        let l = self.len();
        if l == 0.0 {
            Pt { x: 0.0, y: 0.0 }
        } else {
            self.mul(1.0 / l)
        }
    }
}

/// One path of the drawing: a line or a cubic curve.
#[derive(Clone, Debug)]
enum Segment {
    Line(Pt, Pt),
    Cubic(Pt, Pt, Pt, Pt),
}

impl Segment {
    /// Points along it, to find the drawing's extent.
    fn samples(&self) -> Vec<Pt> {
        match *self {
            Segment::Line(a, b) => vec![a, b],
            Segment::Cubic(a, b, c, d) => (0..=16)
                .map(|i| {
                    let t = f64::from(i) / 16.0;
                    let u = 1.0 - t;
                    a.mul(u * u * u)
                        .add(b.mul(3.0 * u * u * t))
                        .add(c.mul(3.0 * u * t * t))
                        .add(d.mul(t * t * t))
                })
                .collect(),
        }
    }

    fn d(&self, o: Pt) -> String {
        let p = |p: Pt| format!("{:.1} {:.1}", p.x + o.x, p.y + o.y);
        match *self {
            Segment::Line(a, b) => format!("M{} L{}", p(a), p(b)),
            Segment::Cubic(a, b, c, d) => format!("M{} C{} {} {}", p(a), p(b), p(c), p(d)),
        }
    }
}

// Geometry of the rack view, in pixels.
/// Side of a QFDB's box.
const BOX: f64 = 150.0;
/// A node's centre from its box's corner.
const INSET: f64 = 24.0;
/// Distance between the boxes of neighbouring QFDBs.
const PITCH: f64 = 290.0;
/// Extra room between the planes of the Z dimension (drawn side by side).
const PLANE_GAP: f64 = 140.0;
const NODE_R: f64 = 14.0;
/// A link direction's arrow ends this far from the receiver's circle (room for its head).
const ARROW_ROOM: f64 = 7.0;
/// The two directions of a QFDB link run this far either side of the line between nodes.
const LANE: f64 = 4.5;
/// Room right of a QFDB's box for its labels.
const LABEL_WIDTH: f64 = 64.0;
/// Width a small rack's drawing is scaled up towards.
const DISPLAY_WIDTH: f64 = 1200.0;

/// Top-left corner of a QFDB's box.
fn qfdb_origin(shape: &Shape, c: &Coord) -> Pt {
    Pt {
        x: f64::from(c.z) * (f64::from(shape.x()) * PITCH + PLANE_GAP) + f64::from(c.x) * PITCH,
        y: f64::from(c.y) * PITCH,
    }
}

/// A node's centre: F1 top left (its torus links leave up and left, outside the box),
/// F2 top right, F3 bottom left, F4 bottom right.
fn node_centre(shape: &Shape, c: &Coord) -> Pt {
    let o = qfdb_origin(shape, c);
    let right = matches!(c.fpga, 2 | 4);
    let bottom = matches!(c.fpga, 3 | 4);
    Pt {
        x: o.x + if right { BOX - INSET } else { INSET },
        y: o.y + if bottom { BOX - INSET } else { INSET },
    }
}

/// The direction `a -> b` of a link inside a QFDB: a straight arrow beside the line
/// between the nodes, on the sender's right, so the two directions run side by side.
fn straight(a: Pt, b: Pt) -> Segment {
    let u = b.sub(a).unit();
    let n = Pt { x: -u.y, y: u.x };
    Segment::Line(
        a.add(u.mul(NODE_R + 2.0)).add(n.mul(LANE)),
        b.sub(u.mul(NODE_R + ARROW_ROOM)).add(n.mul(LANE)),
    )
}

/// The direction `a -> b` of a torus link: a curve bulging towards `bulge` (a unit
/// vector) by `h`, leaving and entering the circles `tilt` radians from `bulge` towards
/// the other end. The two directions of a link differ in `h` and `tilt`, so that the
/// higher one starts and ends outside the lower one and they never cross.
fn arc(a: Pt, b: Pt, bulge: Pt, h: f64, tilt: f64) -> Segment {
    let u = b.sub(a).unit();
    let l = b.sub(a).len();
    let out = bulge.mul(tilt.cos()).add(u.mul(tilt.sin()));
    let into = bulge.mul(tilt.cos()).sub(u.mul(tilt.sin()));
    Segment::Cubic(
        a.add(out.mul(NODE_R + 2.0)),
        a.add(u.mul(l * 0.25)).add(bulge.mul(h)),
        b.sub(u.mul(l * 0.25)).add(bulge.mul(h)),
        b.add(into.mul(NODE_R + ARROW_ROOM)),
    )
}

/// The two directions (`a -> b`, `b -> a`) of a torus link between the F1s at `pa` and
/// `pb`, in dimension `dim`; `wrap` for the link that closes a ring of more than two.
fn torus_pair(dim: usize, pa: Pt, pb: Pt, wrap: bool, stagger: f64) -> (Segment, Segment) {
    // X links bulge up, Y links left (away from the QFDB's other nodes, which lie right of
    // and below F1); Z links, between planes drawn side by side, bulge up higher than X.
    let (bulge, base) = match dim {
        0 => (Pt { x: 0.0, y: -1.0 }, 50.0),
        1 => (Pt { x: -1.0, y: 0.0 }, 50.0),
        _ => (Pt { x: 0.0, y: -1.0 }, 130.0 + stagger),
    };
    let h = if wrap { base + 48.0 } else { base };
    (
        arc(pa, pb, bulge, h, 40f64.to_radians()),
        arc(pb, pa, bulge, h + 16.0, 12f64.to_radians()),
    )
}

/// The drawing of the rack: QFDB boxes, link directions (each a template call that
/// colours it), nodes.
fn rack_svg(rack: &Rack) -> String {
    let shape = rack.shape;
    let coord = |id: NodeId| shape.coord(id).ok();
    let mut dirs: Vec<(NodeId, NodeId, LinkKind, Segment)> = Vec::new();
    for l in &rack.links {
        let (Some(ca), Some(cb)) = (coord(l.a), coord(l.b)) else {
            continue;
        };
        let (pa, pb) = (node_centre(&shape, &ca), node_centre(&shape, &cb));
        let (ab, ba) = match l.kind {
            LinkKind::IntraQfdb => (straight(pa, pb), straight(pb, pa)),
            kind => {
                let dim = match kind {
                    LinkKind::TorusX => 0,
                    LinkKind::TorusY => 1,
                    _ => 2,
                };
                // `a < b`, so on a ring the link from the last position back to 0 is the
                // one whose ends are more than one step apart.
                let wrap = ca.dim(dim).abs_diff(cb.dim(dim)) > 1;
                let (from, to) = if wrap { (pb, pa) } else { (pa, pb) };
                let stagger = 10.0 * f64::from(ca.x) + 5.0 * f64::from(ca.y);
                let (fwd, back) = torus_pair(dim, from, to, wrap, stagger);
                // The lower curve runs from the lower ring position to the higher one.
                if wrap {
                    (back, fwd)
                } else {
                    (fwd, back)
                }
            }
        };
        dirs.push((l.a, l.b, l.kind, ab));
        dirs.push((l.b, l.a, l.kind, ba));
    }
    // The drawing's extent, to place it with a margin.
    let mut pts: Vec<Pt> = dirs.iter().flat_map(|d| d.3.samples()).collect();
    let mut qfdbs = Vec::new();
    for z in 0..shape.z() {
        for y in 0..shape.y() {
            for x in 0..shape.x() {
                let c = Coord { x, y, z, fpga: 1 };
                let o = qfdb_origin(&shape, &c);
                pts.push(o);
                // Its labels go right of the box, between it and the Y links of the next
                // column, clear of the curves above it.
                pts.push(o.add(Pt {
                    x: BOX + LABEL_WIDTH,
                    y: BOX,
                }));
                qfdbs.push((c, o));
            }
        }
    }
    let margin = 40.0;
    let minx = pts.iter().map(|p| p.x).fold(f64::INFINITY, f64::min) - margin;
    let miny = pts.iter().map(|p| p.y).fold(f64::INFINITY, f64::min) - margin - 24.0;
    let maxx = pts.iter().map(|p| p.x).fold(f64::NEG_INFINITY, f64::max) + margin;
    let maxy = pts.iter().map(|p| p.y).fold(f64::NEG_INFINITY, f64::max) + margin;
    let off = Pt { x: -minx, y: -miny };
    let (w, h) = (maxx - minx, maxy - miny);
    // A small rack is drawn larger, up to a page's width; a large one keeps its size (the
    // page scrolls) and shrinks to the window only as far as CSS lets it.
    let zoom = (DISPLAY_WIDTH / w).clamp(1.0, 1.8);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg class=\"rack\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w:.0} {h:.0}\" width=\"{:.0}\" height=\"{:.0}\" data-directions=\"{}\">",
        w * zoom,
        h * zoom,
        dirs.len()
    );
    s.push_str(
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"2\" refY=\"5\" markerWidth=\"2.6\" \
         markerHeight=\"2.6\" orient=\"auto-start-reverse\"><path d=\"M0 0 L10 5 L0 10 z\"></path></marker></defs>\n",
    );
    // Plane labels (one plane per Z position), then the QFDB boxes.
    for z in 0..shape.z() {
        let o = qfdb_origin(
            &shape,
            &Coord {
                x: 0,
                y: 0,
                z,
                fpga: 1,
            },
        )
        .add(off);
        let (first, last) = (z * shape.y() + 1, z * shape.y() + shape.y());
        let blades = if first == last {
            format!("blade M{first}")
        } else {
            format!("blades M{first}-M{last}")
        };
        let _ = writeln!(
            s,
            "<text class=\"plabel\" x=\"{:.1}\" y=\"22\">z = {z} ({blades})</text>",
            o.x
        );
    }
    for (c, o) in &qfdbs {
        let o = o.add(off);
        let f1 = shape.id(*c).map(|id| rack.node(id)).unwrap_or_default();
        let q = f1.trim_end_matches("F1");
        let _ = writeln!(
            s,
            "<rect class=\"qfdb\" x=\"{:.1}\" y=\"{:.1}\" width=\"{BOX}\" height=\"{BOX}\" rx=\"8\"></rect>\
             <text class=\"qlabel\" x=\"{:.1}\" y=\"{:.1}\">{q}</text>\
             <text class=\"qlabel\" x=\"{:.1}\" y=\"{:.1}\">x{} y{} z{}</text>",
            o.x,
            o.y,
            o.x + BOX + 6.0,
            o.y + BOX / 2.0 - 2.0,
            o.x + BOX + 6.0,
            o.y + BOX / 2.0 + 14.0,
            c.x,
            c.y,
            c.z
        );
    }
    // Links under nodes, so that arrows end at the circles' edges.
    for (a, b, kind, seg) in &dirs {
        let _ = writeln!(
            s,
            "{{{{ template \"exanet.linkdir\" (args $w $range \"{}\" \"{}\" \"{}e9\" \"{}\") }}}}",
            rack.node(*a),
            rack.node(*b),
            kind.gbps(),
            seg.d(off)
        );
    }
    for id in shape.node_ids() {
        let Some(c) = coord(id) else { continue };
        let p = node_centre(&shape, &c).add(off);
        let _ = writeln!(
            s,
            "{{{{ template \"exanet.node\" (args $w $range \"{}\" \"{:.1}\" \"{:.1}\" \"F{}\") }}}}",
            rack.node(id),
            p.x,
            p.y,
            c.fpga
        );
    }
    s.push_str("</svg>\n");
    s
}

/// What a kind of link is called on the pages.
fn kind_words(kind: LinkKind) -> &'static str {
    match kind {
        LinkKind::IntraQfdb => "QFDB link",
        LinkKind::TorusX => "torus X link",
        LinkKind::TorusY => "torus Y link",
        LinkKind::TorusZ => "torus Z link",
    }
}

/// Every kind of link, in the order pages list them.
const KINDS: [LinkKind; 4] = [
    LinkKind::IntraQfdb,
    LinkKind::TorusX,
    LinkKind::TorusY,
    LinkKind::TorusZ,
];

/// The link views of a node page's table of link directions, in column order.
const NODE_LINK_COLUMNS: &[&View] = &[
    &views::LINK_UP,
    &views::THROUGHPUT,
    &views::MODELED_UTIL,
    &views::WIRE_UTIL,
    &views::STALL,
];

/// The link page: `?node=A&peer=B`, both directions of the link, every link view.
fn link_page(rack: &Rack) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{{{{/* One link of rack {}, both directions: generated by exanet-deploy (consoles.rs). */}}}}",
        rack.name
    );
    s.push_str(&params_prelude());
    s.push_str(
        "{{ $node := .Params.node }}{{ $peer := .Params.peer }}{{ $pair := printf \"%s>%s\" $node $peer }}\n",
    );
    s.push_str(&head(
        "(printf \"exanet link %s - %s\" $node $peer)",
        "$node",
        "$peer",
    ));
    let dirs = rack.directions();
    let _ = writeln!(
        s,
        "{{{{ if not (match {} $pair) }}}}<p class=\"error\">Rack {} has no link direction \
         &#34;{{{{ $node }}}}&#34; -&gt; &#34;{{{{ $peer }}}}&#34;: give <code>?node=NODE&amp;peer=PEER</code> \
         of two linked nodes, or pick a link on the <a href=\"{RACK_PAGE}\">rack view</a>.</p>\n{{{{ else }}}}",
        one_of(
            dirs.iter()
                .map(|(a, b, _)| format!("{}>{}", rack.node(*a), rack.node(*b)))
        ),
        rack.name
    );
    s.push_str("{{ $rate := \"\" }}{{ $kind := \"\" }}\n");
    for kind in KINDS {
        let of_kind: Vec<String> = dirs
            .iter()
            .filter(|d| d.2 == kind)
            .map(|(a, b, _)| format!("{}>{}", rack.node(*a), rack.node(*b)))
            .collect();
        if of_kind.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "{{{{ if match {} $pair }}}}{{{{ $rate = \"{}e9\" }}}}{{{{ $kind = \"{}\" }}}}{{{{ end }}}}",
            one_of(of_kind),
            kind.gbps(),
            kind_words(kind)
        );
    }
    let _ = writeln!(
        s,
        "<h1>Link <a href=\"{NODE_PAGE}?node={{{{ $node }}}}\">{{{{ $node }}}}</a> &#8212; \
         <a href=\"{NODE_PAGE}?node={{{{ $peer }}}}\">{{{{ $peer }}}}</a> \
         <small>({{{{ $kind }}}}, {{{{ humanize $rate }}}}b/s nominal)</small></h1>\n\
         <p>Each column is one direction, named from its sender. Queues and CRC refusals are \
         counted where the direction arrives, everything else where it leaves. Values are \
         over the last {{{{ $w }}}} (rates, utilizations) or now (queues, state); &#8599; graphs \
         a value in Prometheus.</p>\n<table class=\"link\">\n\
         <tr><th></th><th data-dir=\"{{{{ $node }}}}->{{{{ $peer }}}}\">{{{{ $node }}}} -&gt; {{{{ $peer }}}}</th>\
         <th data-dir=\"{{{{ $peer }}}}->{{{{ $node }}}}\"><a href=\"{LINK_PAGE}?node={{{{ $peer }}}}&amp;peer={{{{ $node }}}}\">{{{{ $peer }}}} -&gt; {{{{ $node }}}}</a></th></tr>"
    );
    view_rows(
        &mut s,
        views::LINK,
        &[("$node", "$peer"), ("$peer", "$node")],
        "$rate",
    );
    s.push_str("</table>\n{{ end }}\n{{ template \"exanet.tail\" }}\n");
    s
}

/// The node page: `?node=A`, every node view and the node's link directions.
fn node_page(rack: &Rack) -> String {
    let shape = rack.shape;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{{{{/* One node of rack {}: generated by exanet-deploy (consoles.rs). */}}}}",
        rack.name
    );
    s.push_str(&params_prelude());
    s.push_str("{{ $node := .Params.node }}\n");
    s.push_str(&head("(printf \"exanet node %s\" $node)", "$node", "\"\""));
    let _ = writeln!(
        s,
        "{{{{ if not (match {} $node) }}}}<p class=\"error\">Rack {} has no node &#34;{{{{ $node }}}}&#34;: \
         give <code>?node=NODE</code> (such as {}), or pick a node on the <a href=\"{RACK_PAGE}\">rack view</a>.</p>\n{{{{ else }}}}",
        one_of(shape.node_ids().map(|id| rack.node(id))),
        rack.name,
        rack.node(NodeId(0)),
    );
    s.push_str(
        "<h1>Node {{ $node }}</h1>\n<p>Its switch and network interface over the last {{ $w }} \
         (rates) or now; &#8599; graphs a value in Prometheus.</p>\n<table class=\"node\">\n",
    );
    view_rows(&mut s, views::NODE, &[("$node", "\"\"")], "\"\"");
    s.push_str("</table>\n<h2>Link directions</h2>\n<table class=\"links\">\n<tr><th>direction</th><th>kind</th>");
    for v in NODE_LINK_COLUMNS {
        let _ = write!(s, "<th>{}</th>", html_text(v.title));
    }
    s.push_str("</tr>\n");
    // A chain over the rack's nodes: templates have no list literals, and the rows come
    // from the topology, so that a node whose daemon is down still lists its links.
    let mut first = true;
    for id in shape.node_ids() {
        let name = rack.node(id);
        let _ = writeln!(
            s,
            "{{{{ {}if eq $node \"{name}\" }}}}",
            if first { "" } else { "else " }
        );
        first = false;
        for l in topology::node_links(&shape, id) {
            let Some((peer, _)) = l.other(id) else {
                continue;
            };
            let peer = rack.node(peer);
            for (a, b) in [(&name, &peer), (&peer, &name)] {
                let _ = writeln!(
                    s,
                    "{{{{ template \"exanet.linkrow\" (args $w $range \"{a}\" \"{b}\" \"{}e9\" \"{}\") }}}}",
                    l.kind.gbps(),
                    kind_words(l.kind)
                );
            }
        }
    }
    if !first {
        s.push_str("{{ end }}\n");
    }
    s.push_str("</table>\n{{ end }}\n{{ template \"exanet.tail\" }}\n");
    s
}

/// The library template of one row of a node page's link table: args (W RANGE A B RATE
/// KIND).
fn link_row_template() -> String {
    let mut s = format!(
        "{{{{ define \"exanet.linkrow\" }}}}<tr><td><a href=\"{LINK_PAGE}?node={{{{ .arg2 }}}}&amp;peer={{{{ .arg3 }}}}\">{{{{ .arg2 }}}} -&gt; {{{{ .arg3 }}}}</a></td><td>{{{{ .arg5 }}}}</td>"
    );
    for v in NODE_LINK_COLUMNS {
        let _ = write!(
            s,
            "<td>{{{{ template \"exanet.view.{}\" (args .arg0 .arg1 .arg2 .arg3 .arg4) }}}}</td>",
            v.id
        );
    }
    s.push_str("</tr>{{ end }}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn generate(shape: &str, name: &str) -> BTreeMap<String, String> {
        files(shape.parse().unwrap(), name)
            .into_iter()
            .map(|f| (f.path.to_string_lossy().into_owned(), f.text))
            .collect()
    }

    /// The Go raw strings of a template: its queries and the regexps that check names.
    fn raw_strings(t: &str) -> Vec<&str> {
        t.split('`').skip(1).step_by(2).collect()
    }

    /// The actions of a template (what is between `{{` and `}}`), trimmed.
    fn actions(t: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = t;
        while let Some(i) = rest.find("{{") {
            let after = &rest[i + 2..];
            let j = after.find("}}").expect("an action is closed");
            out.push(after[..j].trim_matches(|c: char| c == '-' || c.is_whitespace()));
            rest = &after[j + 2..];
        }
        out
    }

    /// The string arguments of every call of library template `name`.
    fn calls<'a>(t: &'a str, name: &str) -> Vec<Vec<&'a str>> {
        let head = format!("template \"{name}\" (args ");
        actions(t)
            .into_iter()
            .filter_map(|a| a.strip_prefix(head.as_str()))
            .map(|args| args.split('"').skip(1).step_by(2).collect())
            .collect()
    }

    #[test]
    fn templates_are_well_formed_and_call_only_defined_templates() {
        for shape in ["1x1x1", "2x1x1", "3x2x2"] {
            let files = generate(shape, "r");
            assert_eq!(
                files.keys().cloned().collect::<Vec<_>>(),
                [
                    "console_libraries/exanet.lib",
                    "consoles/exanet-link.html",
                    "consoles/exanet-node.html",
                    "consoles/exanet-rack.html",
                ]
            );
            let lib = &files["console_libraries/exanet.lib"];
            let defined: BTreeSet<&str> = actions(lib)
                .into_iter()
                .filter_map(|a| a.strip_prefix("define \""))
                .map(|a| a.trim_end_matches('"'))
                .collect();
            for v in views::all() {
                assert!(defined.contains(format!("exanet.view.{}", v.id).as_str()));
            }
            for (path, text) in &files {
                assert_eq!(
                    text.matches("{{").count(),
                    text.matches("}}").count(),
                    "{path}"
                );
                let mut depth = 0i32;
                for a in actions(text) {
                    let word = a.split_whitespace().next().unwrap_or("");
                    match word {
                        "if" | "range" | "with" | "define" | "block" => depth += 1,
                        "end" => depth -= 1,
                        "else" => assert!(depth > 0, "{path}: else outside a block"),
                        _ => {}
                    }
                    assert!(depth >= 0, "{path}: `end` without a block");
                    if let Some(called) = a.strip_prefix("template \"") {
                        let name = called.split('"').next().unwrap();
                        assert!(defined.contains(name), "{path} calls undefined {name}");
                    }
                }
                assert_eq!(depth, 0, "{path}: unclosed blocks");
            }
        }
    }

    #[test]
    fn every_console_expression_reads_catalog_families() {
        let files = generate("2x2x2", "r");
        let mut names = 0;
        let mut exprs = 0;
        for (path, text) in &files {
            for e in raw_strings(text)
                .into_iter()
                .filter(|e| !e.starts_with('^'))
            {
                exprs += 1;
                // The template's arguments are the only verbs.
                let verbs: BTreeSet<&str> =
                    e.match_indices("%[").map(|(i, _)| &e[i..i + 5]).collect();
                for v in &verbs {
                    assert!(
                        ["%[1]s", "%[2]s", "%[3]s", "%[4]s", "%[5]s"].contains(v),
                        "{path}: {v} in {e}"
                    );
                }
                assert!(!e.contains('$'), "{path}: an unbound placeholder in {e}");
                for name in views::metric_names(e) {
                    names += 1;
                    assert!(
                        views::in_catalog(name),
                        "{path}: {name} (in {e}) is not in the catalog"
                    );
                }
            }
        }
        assert!(
            exprs >= 25 && names >= 30,
            "{exprs} expressions, {names} names"
        );
    }

    /// The node and link views of the Grafana rack dashboard (by panel title) and of the
    /// node and link pages (by template) are the same, and are all of them.
    #[test]
    fn grafana_and_consoles_show_the_same_node_and_link_views() {
        let shape: Shape = "2x2x1".parse().unwrap();
        let grafana = crate::grafana::files(shape, "r").unwrap();
        let rack: serde_json::Value = serde_json::from_str(
            &grafana
                .iter()
                .find(|f| f.path.ends_with("exanet-rack.json"))
                .unwrap()
                .text,
        )
        .unwrap();
        let titles: BTreeSet<&str> = rack["panels"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["title"].as_str())
            .collect();
        let files = generate("2x2x1", "r");
        let shown = |page: &str| -> BTreeSet<String> {
            actions(&files[page])
                .into_iter()
                .filter_map(|a| a.strip_prefix("template \"exanet.view."))
                .map(|a| a.split('"').next().unwrap().to_string())
                .collect()
        };
        for (set, page) in [
            (views::NODE, "consoles/exanet-node.html"),
            (views::LINK, "consoles/exanet-link.html"),
        ] {
            let ids: BTreeSet<String> = set.iter().map(|v| v.id.to_string()).collect();
            let in_grafana: BTreeSet<String> = set
                .iter()
                .filter(|v| titles.contains(v.title))
                .map(|v| v.id.to_string())
                .collect();
            assert_eq!(in_grafana, ids, "Grafana's rack dashboard");
            assert_eq!(shown(page), ids, "{page}");
        }
        // The rack view's stats are the rack-wide views.
        let rack_page = shown("consoles/exanet-rack.html");
        for v in views::RACK {
            assert!(rack_page.contains(v.id), "{}", v.id);
            assert!(titles.contains(v.title), "{}", v.title);
        }
    }

    #[test]
    fn the_rack_view_draws_every_link_direction_once_inside_the_picture() {
        for shape_text in ["2x1x1", "1x1x3", "4x4x2", "3x3x3"] {
            let shape: Shape = shape_text.parse().unwrap();
            let files = generate(shape_text, "r");
            let page = &files["consoles/exanet-rack.html"];
            let view_box: Vec<f64> = page
                .split("viewBox=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .split(' ')
                .map(|n| n.parse().unwrap())
                .collect();
            let (w, h) = (view_box[2], view_box[3]);
            let mut drawn = BTreeMap::new();
            for args in calls(page, "exanet.linkdir") {
                let [a, b, rate, d] = args[..] else {
                    panic!("{args:?}")
                };
                assert!(drawn.insert((a.to_string(), b.to_string()), rate).is_none());
                for n in d
                    .split(|c: char| c.is_ascii_alphabetic() || c == ' ')
                    .filter(|n| !n.is_empty())
                {
                    let n: f64 = n.parse().unwrap();
                    assert!(n >= 0.0 && n <= w.max(h), "{shape_text}: {a}->{b}: {d}");
                }
                for pair in d
                    .split(|c: char| c.is_ascii_alphabetic())
                    .filter(|p| !p.trim().is_empty())
                {
                    let xy: Vec<f64> = pair
                        .split_whitespace()
                        .map(|n| n.parse().unwrap())
                        .collect();
                    for p in xy.chunks(2) {
                        assert!(
                            (0.0..=w).contains(&p[0]) && (0.0..=h).contains(&p[1]),
                            "{shape_text}: {a}->{b}: {d}"
                        );
                    }
                }
            }
            let links = topology::links(&shape);
            assert_eq!(drawn.len(), 2 * links.len(), "{shape_text}");
            for l in &links {
                let (a, b) = (shape.display(l.a), shape.display(l.b));
                let rate = format!("{}e9", l.kind.gbps());
                assert_eq!(drawn[&(a.clone(), b.clone())], rate, "{a}->{b}");
                assert_eq!(drawn[&(b.clone(), a.clone())], rate, "{b}->{a}");
            }
            let nodes: BTreeSet<String> = calls(page, "exanet.node")
                .into_iter()
                .map(|args| args[0].to_string())
                .collect();
            assert_eq!(nodes.len(), shape.nodes() as usize, "{shape_text}");
        }
    }

    /// Idle link directions are numbers: the rack view's utilizations fall back to 0 on
    /// the link's own state.
    #[test]
    fn idle_links_fall_back_to_zero() {
        let files = generate("2x1x1", "r");
        let lib = &files["console_libraries/exanet.lib"];
        let linkdir = lib.split("define \"exanet.linkdir\"").nth(1).unwrap();
        let linkdir = linkdir.split("define \"").next().unwrap();
        let queries = raw_strings(linkdir);
        assert_eq!(queries.len(), 3, "{queries:?}");
        for q in &queries[..2] {
            assert!(
                q.ends_with(
                    r#" or (sum by (node, peer) (exanet_link_up{node="%[3]s",peer="%[4]s"}) * 0)"#
                ),
                "{q}"
            );
        }
        assert!(queries[0].contains("exanet_link_modeled_busy_seconds_total"));
        assert!(queries[1].contains("exanet_link_bytes_total") && queries[1].contains("%[5]s"));
    }

    /// A node or a pair of nodes from the URL reaches a query only if the rack has it.
    #[test]
    fn names_from_the_url_are_checked_against_the_rack() {
        let shape: Shape = "2x1x1".parse().unwrap();
        let files = generate("2x1x1", "<u>{{ .x }}</u>");
        let alternatives = |re: &str| -> BTreeSet<String> {
            re.trim_start_matches("^(")
                .trim_end_matches(")$")
                .split('|')
                .map(str::to_string)
                .collect()
        };
        let node = &files["consoles/exanet-node.html"];
        let checked = raw_strings(node)
            .into_iter()
            .find(|r| r.starts_with("^(M"))
            .unwrap();
        let all: BTreeSet<String> = shape.node_ids().map(|id| shape.display(id)).collect();
        assert_eq!(alternatives(checked), all);
        assert!(node.contains("{{ if not (match `^(M"));
        let link = &files["consoles/exanet-link.html"];
        let pairs: Vec<BTreeSet<String>> = raw_strings(link)
            .into_iter()
            .filter(|r| r.starts_with("^(M"))
            .map(alternatives)
            .collect();
        // Every direction, then the torus ones (the rate of the others is the QFDB's).
        let dirs: BTreeSet<String> = topology::links(&shape)
            .iter()
            .flat_map(|l| {
                let (a, b) = (shape.display(l.a), shape.display(l.b));
                [format!("{a}>{b}"), format!("{b}>{a}")]
            })
            .collect();
        assert_eq!(pairs[0], dirs);
        assert!(pairs[2]
            .iter()
            .eq(["M1QAF1>M1QBF1", "M1QBF1>M1QAF1"].iter()));
        // The rack's name is text, whatever it holds.
        for text in files.values() {
            let outside_strings = text.replace(r#""exanet rack <u>{{ .x }}</u>""#, "");
            assert!(!outside_strings.contains("<u>") && !outside_strings.contains("{{ .x }}"));
        }
        let rack = &files["consoles/exanet-rack.html"];
        assert!(rack.contains("&lt;u&gt;&#123;&#123; .x &#125;&#125;&lt;/u&gt;"));
        // In a string argument it stays as it is: Prometheus escapes it where it goes.
        assert!(rack.contains(r#"(args "exanet rack <u>{{ .x }}</u>" $w"#));
        assert_eq!(go_str("a\"b\\c\u{1}"), r#""a\"b\\c""#);
    }
}
