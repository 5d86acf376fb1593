//! The SVG report: one bar per row, the median ratio of its two sides,
//! with min–max whiskers and a dashed line at 1.0.

use std::fmt::Write as _;

use crate::rows::Row;
use crate::stats::{ratios, spread, Spread};

/// Bars of the ratios (median) with min–max whiskers, one per row, and a
/// line at 1.0.
pub fn render(title: &str, sections: &[(&str, &[Row])]) -> String {
    let rows: Vec<(&str, &Row)> = sections
        .iter()
        .flat_map(|(name, rows)| rows.iter().map(move |r| (*name, r)))
        .collect();
    let spreads: Vec<Option<Spread>> = rows
        .iter()
        .map(|(_, r)| spread(&ratios(&r.left, &r.right)))
        .collect();
    let top = spreads
        .iter()
        .flatten()
        .map(|s| s.max)
        .fold(1.5f64, f64::max)
        .ceil();
    let (left, width, bar_h, gap) = (600.0, 420.0, 16.0, 8.0);
    let height = 60.0 + rows.len() as f64 * (bar_h + gap) + 30.0;
    let x = |v: f64| left + v / top * width;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="12">"#,
        w = left + width + 60.0
    );
    let _ = writeln!(s, r#"<text x="10" y="20" font-size="14">{title}</text>"#);
    let y0 = 40.0;
    for (i, ((section, row), spread)) in rows.iter().zip(&spreads).enumerate() {
        let y = y0 + i as f64 * (bar_h + gap);
        let better = if row.lower_is_better {
            " (lower is better)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<text x="10" y="{ty}">{section}: {label}{better}</text>"#,
            ty = y + 12.0,
            label = row.label
        );
        if let Some(sp) = spread {
            let _ = writeln!(
                s,
                "<rect x=\"{left}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{bar_h}\" fill=\"#4a7ebb\"/>",
                bw = x(sp.median) - left
            );
            let mid = y + bar_h / 2.0;
            let _ = writeln!(
                s,
                r#"<line x1="{a:.1}" y1="{mid}" x2="{b:.1}" y2="{mid}" stroke="black"/><line x1="{a:.1}" y1="{t}" x2="{a:.1}" y2="{u}" stroke="black"/><line x1="{b:.1}" y1="{t}" x2="{b:.1}" y2="{u}" stroke="black"/>"#,
                a = x(sp.min),
                b = x(sp.max),
                t = y + 3.0,
                u = y + bar_h - 3.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{tx:.1}" y="{ty}">{m:.2}</text>"#,
                tx = x(sp.max) + 4.0,
                ty = y + 12.0,
                m = sp.median
            );
        }
    }
    let bottom = y0 + rows.len() as f64 * (bar_h + gap);
    let _ = writeln!(
        s,
        "<line x1=\"{one:.1}\" y1=\"{y0}\" x2=\"{one:.1}\" y2=\"{bottom}\" stroke=\"#c33\" stroke-dasharray=\"4 3\"/>",
        one = x(1.0)
    );
    let _ = writeln!(
        s,
        r#"<text x="{l}" y="{ty}">0</text><text x="{one:.1}" y="{ty}">1.0</text><text x="{r:.1}" y="{ty}">{top:.1}</text>"#,
        l = left,
        one = x(1.0) - 8.0,
        r = left + width - 10.0,
        ty = bottom + 16.0
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a row without its bar or label, a bar that does not show
    /// the median ratio, or a scale whose top is below the largest whisker.
    #[test]
    fn one_bar_per_row_at_the_median_ratio() {
        let row = |label: &str, left: Vec<f64>, right: Vec<f64>| Row {
            label: label.to_owned(),
            left,
            right,
            lower_is_better: false,
        };
        let rows = [
            row("a", vec![2.0, 3.0, 4.0], vec![1.0, 1.0, 1.0]),
            row("b", vec![], vec![]),
        ];
        let text = render("title", &[("S", &rows)]);
        assert!(text.starts_with("<svg ") && text.ends_with("</svg>\n"));
        assert!(text.contains(">S: a</text>") && text.contains(">S: b</text>"));
        // One bar (row b has no ratio): the median 3.0 on a scale to 4.0.
        assert_eq!(text.matches("<rect ").count(), 1);
        assert!(text.contains(">3.00</text>"), "{text}");
        assert!(text.contains(">4.0</text>"), "{text}");
        let bar = text.split("<rect ").nth(1).unwrap();
        assert!(
            bar.contains("width=\"315.0\""),
            "3.0 of 4.0 on 420 px: {bar}"
        );
    }
}
