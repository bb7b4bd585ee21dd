//! A dependency-free line chart: one `<polyline>` per series, axes with a few ticks and
//! a legend. Enough for a Ready-count-over-time curve in a Markdown report.

use std::fmt::Write as _;

/// Chart size in pixels, and the margins around the plot area.
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 380.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Series longer than this are thinned (every k-th point, always keeping the last).
const MAX_POINTS: usize = 1500;

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Stroke colour (any SVG colour).
    pub color: &'static str,
    /// Dashed stroke (for reference lines such as the baseline).
    pub dashed: bool,
    /// `(x, y)` points, in order of `x`.
    pub points: Vec<(f64, f64)>,
}

/// Renders `series` as a standalone SVG document with the given title and axis labels.
/// The axes start at 0 and end at the largest `x` and `y` of all series.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let x_max = nice_ceiling(all.clone().map(|p| p.0).fold(0.0, f64::max));
    let y_max = nice_ceiling(all.map(|p| p.1).fold(0.0, f64::max));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / x_max * plot_w;
    let sy = |y: f64| TOP + plot_h - y / y_max * plot_h;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    for i in 0..=5 {
        let fraction = f64::from(i) / 5.0;
        let (x, y) = (sx(fraction * x_max), sy(fraction * y_max));
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 16.0,
            format_tick(fraction * x_max)
        );
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            format_tick(fraction * y_max)
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 12.0,
        escape(x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let points: String = thin(&s.points)
            .map(|(x, y)| format!("{:.1},{:.1} ", sx(x), sy(y)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
            s.color,
            points.trim_end()
        );
        let ly = TOP + 14.0 + 16.0 * i as f64;
        let lx = LEFT + plot_w - 230.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 4.0,
            lx + 24.0,
            ly - 4.0,
            s.color,
            lx + 30.0,
            escape(&s.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// At most [`MAX_POINTS`] points of `points`, evenly spaced, keeping the last one.
fn thin(points: &[(f64, f64)]) -> impl Iterator<Item = (f64, f64)> + '_ {
    let step = points.len().div_ceil(MAX_POINTS).max(1);
    let last = points.len().saturating_sub(1);
    points
        .iter()
        .enumerate()
        .filter(move |(i, _)| i % step == 0 || *i == last)
        .map(|(_, p)| *p)
}

/// The smallest of 1, 2, 2.5, 5 × 10^k that is at least `value` (1 for empty charts).
fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&candidate| candidate >= value * 0.999_999)
        .unwrap_or(10.0 * magnitude)
}

/// A tick label: integers without decimals, others with one.
fn format_tick(value: f64) -> String {
    if (value - value.round()).abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// Escapes text for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_polyline_per_series_scaled_to_the_plot() {
        let series = [
            Series {
                label: "ready <N=2>".into(),
                color: "blue",
                dashed: false,
                points: vec![(0.0, 0.0), (1.0, 1.0), (2.0, 2.0)],
            },
            Series {
                label: "baseline".into(),
                color: "gray",
                dashed: true,
                points: vec![(0.0, 0.0), (1.0, 2.0)],
            },
        ];
        let svg = line_chart("t", "seconds", "VMs", &series);
        assert!(svg.starts_with("<svg "));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        // Axis maxima are 2 (x) and 2 (y): the last point sits at the top-right corner.
        let right = LEFT + (WIDTH - LEFT - RIGHT);
        assert!(svg.contains(&format!("{right:.1},{TOP:.1}")), "{svg}");
        assert!(svg.contains("ready &lt;N=2&gt;"));
        assert!(svg.contains("stroke-dasharray"));
    }

    #[test]
    fn nice_ceilings_and_thinning() {
        assert!((nice_ceiling(7.0) - 10.0).abs() < 1e-9);
        assert!((nice_ceiling(1000.0) - 1000.0).abs() < 1e-9);
        assert!((nice_ceiling(1800.0) - 2000.0).abs() < 1e-9);
        assert!((nice_ceiling(0.0) - 1.0).abs() < 1e-9);
        let many: Vec<(f64, f64)> = (0..10_000).map(|i| (f64::from(i), 0.0)).collect();
        let kept: Vec<_> = thin(&many).collect();
        assert!(kept.len() <= MAX_POINTS + 1);
        assert_eq!(kept.last(), many.last());
    }
}
