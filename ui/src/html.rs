//! The page's frame and the helpers every page draws with: text shown as
//! text, sparklines and bars as inline SVG.

use super::*;

pub(crate) const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
nav{background:#1d2330;padding:8px 16px}nav a{color:#fff;margin-right:16px;text-decoration:none}
main{padding:16px}h1{font-size:20px}h2{font-size:16px;margin-top:24px}
table{border-collapse:collapse;background:#fff;margin:8px 0}td,th{padding:4px 8px;border-bottom:1px solid #e3e6eb;text-align:left;vertical-align:top}
th{font-weight:600;background:#eef0f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#137333}.bad{color:#b3261e;font-weight:600}.error{color:#b3261e}.muted{color:#6b7280}
.bar{width:160px;height:10px;background:#e3e6eb}.bar div{height:10px;background:#2f6feb}
pre{white-space:pre-wrap;word-break:break-all;max-width:720px;margin:0}
form.inline{display:inline}button{cursor:pointer}
.signals{display:flex;flex-wrap:wrap;gap:6px}.signal{padding:2px 8px;border-radius:10px;background:#fff;border:1px solid #e3e6eb}
.signal.ok{border-color:#9fd3ad}.signal.bad{border-color:#e8a29c;background:#fdecea}";

pub(crate) fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · sturdy-ui" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                nav {
                    a href="/" { "Overview" }
                    a href="/dead" { "Dead letters" }
                    a href="/stuck" { "Stuck instances" }
                    a href="/batches" { "Batch jobs" }
                    form.inline method="get" action="/instance" {
                        input type="search" name="q" placeholder="instance id or business key";
                    }
                }
                main { (body) }
            }
        }
    }
}

/// A text as text: `maud` escapes markup; control characters (which the
/// page would not show) are written as their escapes.
pub(crate) fn shown(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                format!("\\u{{{:04x}}}", c as u32)
                    .chars()
                    .collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// A short text of a long one.
pub(crate) fn clipped(text: &str, at: usize) -> String {
    if text.chars().count() <= at {
        shown(text)
    } else {
        let cut: String = text.chars().take(at).collect();
        format!("{} … ({} characters)", shown(&cut), text.chars().count())
    }
}

/// A sparkline of `values` (oldest first) as inline SVG.
pub(crate) fn sparkline(values: &[f64], label: &str) -> Markup {
    let label = shown(label);
    let (w, h) = (120.0, 24.0);
    let max = values.iter().cloned().fold(0.0_f64, f64::max).max(1.0);
    let n = values.len().max(2) - 1;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                i as f64 * w / n as f64,
                h - 1.0 - v / max * (h - 2.0)
            )
        })
        .collect();
    html! {
        svg width=(w) height=(h) viewBox=(format!("0 0 {w} {h}")) role="img" aria-label=(label) {
            title { (label) }
            @if values.len() > 1 {
                polyline fill="none" stroke="#2f6feb" stroke-width="1.5" points=(points.join(" "));
            }
        }
    }
}

/// Bars of `values` (oldest first), each labelled.
pub(crate) fn bars(values: &[(String, f64)], label: &str) -> Markup {
    let label = shown(label);
    let (w, h) = (480.0, 80.0);
    let max = values
        .iter()
        .map(|(_, v)| *v)
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let bw = w / values.len().max(1) as f64;
    html! {
        svg width=(w) height=(h) viewBox=(format!("0 0 {w} {h}")) role="img" aria-label=(label) {
            title { (label) }
            @for (i, (at, v)) in values.iter().enumerate() {
                rect x=(format!("{:.1}", i as f64 * bw)) y=(format!("{:.1}", h - v / max * h))
                     width=(format!("{:.1}", (bw - 1.0).max(1.0))) height=(format!("{:.1}", v / max * h)) fill="#2f6feb" {
                    title { (at) ": " (v) }
                }
            }
        }
    }
}

pub(crate) fn text(row: &Row, i: usize) -> String {
    row.get::<_, Option<String>>(i).unwrap_or_default()
}

pub(crate) fn int(row: &Row, i: usize) -> i64 {
    row.get::<_, Option<i64>>(i).unwrap_or(0)
}

/// The sparkline series of one sampled thing over the last hour: the
/// figure `figure`, oldest first.
pub(crate) fn series(rows: &[Row], kind: &str, name: &str, subscriber: &str) -> Vec<(f64, f64)> {
    rows.iter()
        .filter(|r| text(r, 0) == kind && text(r, 1) == name && text(r, 2) == subscriber)
        .map(|r| {
            (
                r.get::<_, Option<f64>>(3).unwrap_or(0.0),
                r.get::<_, Option<f64>>(4).unwrap_or(0.0),
            )
        })
        .collect()
}
