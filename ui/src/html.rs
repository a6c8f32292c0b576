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
form.inline{display:inline}button{cursor:pointer}form.logout{float:right}
p.more{color:#6b7280;font-style:italic}
.signals{display:flex;flex-wrap:wrap;gap:6px}.signal{padding:2px 8px;border-radius:10px;background:#fff;border:1px solid #e3e6eb}
.signal.ok{border-color:#9fd3ad}.signal.bad{border-color:#e8a29c;background:#fdecea}";

/// A page: `body` in the frame every page shares (its navigation, and a
/// logout button while a session is open: see [`Frame`]).
pub(crate) fn layout(title: &str, body: Markup) -> Markup {
    let frame = FRAME.try_with(Frame::clone).unwrap_or_default();
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
                    @if let Some(csrf) = &frame.logout {
                        form.inline.logout method="post" action="/logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Log out" }
                        }
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
    clipped_of(text, text.chars().count(), at)
}

/// A short text of one `length` characters long, of which `text` is the
/// start (at least `at` characters of it, where it is longer): the
/// database sends only that much of a large value.
pub(crate) fn clipped_of(text: &str, length: usize, at: usize) -> String {
    if length <= at {
        shown(text)
    } else {
        let cut: String = text.chars().take(at).collect();
        format!("{} … ({length} characters)", shown(&cut))
    }
}

/// The first `n` of `rows`, and whether there were more: each list is read
/// one row past what it shows, so that a full page can say so.
pub(crate) fn first(rows: &[Row], n: i64) -> (&[Row], bool) {
    let n = usize::try_from(n).unwrap_or(0);
    (&rows[..rows.len().min(n)], rows.len() > n)
}

/// What a page says under a list it cut: `what` it shows ("the first 500
/// queues"), then `rest` (where to see more).
pub(crate) fn more(what: &str, rest: Markup) -> Markup {
    html! {
        p.more { "Showing " (what) "; there are more. " (rest) }
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

/// The sparkline series of `things` sampled things, oldest first, from
/// rows of (the thing's place in the list, from 1; depth; throughput), in
/// one pass: a page of a thousand things must not filter every row for each.
pub(crate) fn series(rows: &[Row], things: usize) -> Vec<Vec<(f64, f64)>> {
    let mut series = vec![Vec::new(); things];
    for r in rows {
        let place = usize::try_from(int(r, 0) - 1).ok();
        if let Some(points) = place.and_then(|p| series.get_mut(p)) {
            points.push((
                r.get::<_, Option<f64>>(1).unwrap_or(0.0),
                r.get::<_, Option<f64>>(2).unwrap_or(0.0),
            ));
        }
    }
    series
}
