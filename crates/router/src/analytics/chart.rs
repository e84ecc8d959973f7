//! Charts drawn on the server as SVG, so the admin page needs no charting library and no CDN. Each bar carries
//! its value in `data-value` (and a `<title>` for a tooltip), so what a chart shows can be checked against the
//! API it was drawn from.

use std::fmt::Write as _;

/// One series of a column chart.
pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub values: Vec<u64>,
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 260.0;
const LEFT: f64 = 64.0;
const BOTTOM: f64 = 40.0;
const TOP: f64 = 28.0;

/// Grouped columns: one group per label, one column per series. An empty chart says "no data".
pub fn columns(title: &str, labels: &[String], series: &[Series<'_>]) -> String {
    let mut svg = open(title, WIDTH, HEIGHT);
    let max = series.iter().flat_map(|s| s.values.iter().copied()).max().unwrap_or(0);
    if labels.is_empty() || max == 0 {
        no_data(&mut svg, WIDTH, HEIGHT);
        return close(svg);
    }
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    axis(&mut svg, max, plot_h);
    let group_w = plot_w / labels.len() as f64;
    let bar_w = (group_w * 0.8 / series.len().max(1) as f64).max(1.0);
    for (i, label) in labels.iter().enumerate() {
        let x0 = LEFT + i as f64 * group_w + group_w * 0.1;
        for (j, s) in series.iter().enumerate() {
            let value = s.values.get(i).copied().unwrap_or(0);
            let h = value as f64 / max as f64 * plot_h;
            let _ = write!(
                svg,
                r#"<rect class="bar" data-series="{}" data-label="{}" data-value="{value}" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {} {}</title></rect>"#,
                esc(s.name),
                esc(label),
                x0 + j as f64 * bar_w,
                TOP + plot_h - h,
                bar_w,
                h,
                s.color,
                esc(label),
                value,
                esc(s.name),
            );
        }
        if labels.len() <= 12 || i % labels.len().div_ceil(12) == 0 {
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                x0 + group_w * 0.4,
                HEIGHT - BOTTOM + 14.0,
                esc(&short_label(label)),
            );
        }
    }
    legend(&mut svg, series.iter().map(|s| (s.name, s.color)));
    close(svg)
}

/// Horizontal bars, largest first as given.
pub fn bars(title: &str, rows: &[(String, u64)], color: &str) -> String {
    let row_h = 22.0;
    let height = TOP + rows.len().max(1) as f64 * row_h + 12.0;
    let mut svg = open(title, WIDTH, height);
    let max = rows.iter().map(|(_, v)| *v).max().unwrap_or(0);
    if rows.is_empty() || max == 0 {
        no_data(&mut svg, WIDTH, height);
        return close(svg);
    }
    let label_w = 160.0;
    let plot_w = WIDTH - label_w - 90.0;
    for (i, (label, value)) in rows.iter().enumerate() {
        let y = TOP + i as f64 * row_h;
        let w = *value as f64 / max as f64 * plot_w;
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text><rect class="bar" data-label="{}" data-value="{value}" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{}: {value}</title></rect><text x="{:.1}" y="{:.1}" font-size="11">{value}</text>"#,
            label_w - 6.0,
            y + 14.0,
            esc(label),
            esc(label),
            label_w,
            y + 3.0,
            w.max(1.0),
            row_h - 6.0,
            esc(label),
            label_w + w + 4.0,
            y + 14.0,
        );
    }
    close(svg)
}

fn open(title: &str, width: f64, height: f64) -> String {
    let mut svg = String::with_capacity(4096);
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{}" font-family="system-ui, sans-serif"><text x="8" y="16" font-size="13" font-weight="600">{}</text>"#,
        esc(title),
        esc(title)
    );
    svg
}

fn close(mut svg: String) -> String {
    svg.push_str("</svg>");
    svg
}

fn no_data(svg: &mut String, width: f64, height: f64) {
    let _ = write!(
        svg,
        r##"<text class="no-data" x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle" fill="#666">no data yet</text>"##,
        width / 2.0,
        height / 2.0
    );
}

fn axis(svg: &mut String, max: u64, plot_h: f64) {
    for step in 0..=4u64 {
        let value = max * step / 4;
        let y = TOP + plot_h - plot_h * step as f64 / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            WIDTH - 8.0,
            LEFT - 4.0,
            y + 3.0,
            compact(value)
        );
    }
}

fn legend<'a>(svg: &mut String, entries: impl Iterator<Item = (&'a str, &'a str)>) {
    let mut x = LEFT;
    for (name, color) in entries {
        let _ = write!(
            svg,
            r#"<rect x="{x:.1}" y="{:.1}" width="10" height="10" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            HEIGHT - 16.0,
            x + 14.0,
            HEIGHT - 7.0,
            esc(name)
        );
        x += 24.0 + name.len() as f64 * 6.5;
    }
}

/// `2026-11-23T09` → `11-23 09h`; a day stays `2026-11-23`.
fn short_label(label: &str) -> String {
    match label.split_once('T') {
        Some((day, hour)) => format!("{} {hour}h", day.get(5..).unwrap_or(day)),
        None => label.to_owned(),
    }
}

fn compact(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=9_999_999 => format!("{:.0}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// Escape text for SVG content and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_a_bar_carrying_it_and_labels_are_escaped() {
        let svg = columns(
            "t",
            &["<a>".to_owned(), "b".to_owned()],
            &[
                Series { name: "x", color: "#000", values: vec![3, 0] },
                Series { name: "y", color: "#111", values: vec![1, 9] },
            ],
        );
        let values: Vec<&str> = svg.split("data-value=\"").skip(1).map(|s| &s[..s.find('"').unwrap_or(0)]).collect();
        assert_eq!(values, vec!["3", "1", "0", "9"]);
        assert!(svg.contains("&lt;a&gt;") && !svg.contains("<a>"));
        assert!(!columns("t", &[], &[]).contains("class=\"bar\""));
        assert!(bars("t", &[], "#000").contains("no data"));
    }
}
