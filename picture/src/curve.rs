//! Learning curves: the mean return of several seeds against environment steps or
//! wall-clock time, with the range the seeds span, as SVG and as CSV.

use std::fmt::Write as _;

/// One point of a [`Series`]: at `x`, the mean over seeds and the lowest and highest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub x: f64,
    pub mean: f64,
    pub lo: f64,
    pub hi: f64,
}

/// One line of a chart: a name (an agent, a framework) and its points in order of `x`.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<Point>,
}

impl Series {
    /// The mean and range over `runs` (one per seed, each a list of `(x, y)`), point by
    /// point: the runs share their `x`s (evaluations at the same steps), and the `x` of
    /// each point is the mean of theirs (wall-clock times differ a little between runs).
    /// A point missing from a shorter run, or not finite, is left out of that point's
    /// statistics; a point no run has a finite value for is left out.
    ///
    /// ```
    /// use stepgraph_picture::Series;
    ///
    /// let s = Series::over_runs("dqn", &[vec![(0.0, 10.0), (1.0, 30.0)], vec![(0.0, 20.0), (1.0, 50.0)]]);
    /// assert_eq!((s.points[1].mean, s.points[1].lo, s.points[1].hi), (40.0, 30.0, 50.0));
    /// ```
    pub fn over_runs(name: impl Into<String>, runs: &[Vec<(f64, f64)>]) -> Series {
        let len = runs.iter().map(Vec::len).max().unwrap_or(0);
        let points = (0..len)
            .filter_map(|i| {
                let here: Vec<(f64, f64)> = runs
                    .iter()
                    .filter_map(|r| r.get(i).copied())
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .collect();
                if here.is_empty() {
                    return None;
                }
                let n = here.len() as f64;
                Some(Point {
                    x: here.iter().map(|p| p.0).sum::<f64>() / n,
                    mean: here.iter().map(|p| p.1).sum::<f64>() / n,
                    lo: here.iter().map(|p| p.1).fold(f64::INFINITY, f64::min),
                    hi: here.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max),
                })
            })
            .collect();
        Series {
            name: name.into(),
            points,
        }
    }
}

/// A chart of learning curves: lines of [`Series`] over a shaded range, an optional
/// threshold (a task's "solved" return), axis labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Curves {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// A horizontal line and its label: `(475.0, "solved")`.
    pub threshold: Option<(f64, String)>,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 55.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// The chart as a self-contained SVG: each series a line (its mean) over a band (its
/// range), in its own colour, named in a legend; the threshold dashed; ticks on both
/// axes. The output depends only on the chart, byte for byte.
///
/// ```
/// use stepgraph_picture::{Curves, Series, curves_svg};
///
/// let chart = Curves {
///     title: "CartPole-v1".into(),
///     x_label: "environment steps".into(),
///     y_label: "return".into(),
///     threshold: Some((475.0, "solved".into())),
///     series: vec![Series::over_runs("dqn", &[vec![(0.0, 20.0), (5000.0, 500.0)]])],
/// };
/// let svg = curves_svg(&chart);
/// assert!(svg.starts_with("<svg") && svg.contains(">dqn</text>") && svg.contains("<polyline"));
/// ```
pub fn curves_svg(chart: &Curves) -> String {
    let points = chart.series.iter().flat_map(|s| &s.points);
    let (mut x0, mut x1) = bounds(points.clone().map(|p| p.x));
    let ys = points
        .flat_map(|p| [p.lo, p.hi, p.mean])
        .chain(chart.threshold.as_ref().map(|t| t.0));
    let (mut y0, mut y1) = bounds(ys);
    if x1 <= x0 {
        (x0, x1) = (x0 - 1.0, x0 + 1.0);
    }
    if y1 <= y0 {
        (y0, y1) = (y0 - 1.0, y0 + 1.0);
    }
    let pad = (y1 - y0) * 0.05;
    let (y0, y1) = (y0 - pad, y1 + pad);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * plot_w;
    let sy = |y: f64| TOP + (y1 - y) / (y1 - y0) * plot_h;

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
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{}</text>"#,
        escape(&chart.title)
    );
    for i in 0..=5 {
        let f = f64::from(i) / 5.0;
        let (x, y) = (x0 + f * (x1 - x0), y0 + f * (y1 - y0));
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{top:.1}" x2="{px:.1}" y2="{bottom:.1}" stroke="#eee"/><text x="{px:.1}" y="{ty:.1}" text-anchor="middle">{}</text>"##,
            tick(x),
            px = sx(x),
            top = TOP,
            bottom = TOP + plot_h,
            ty = TOP + plot_h + 16.0,
        );
        let _ = writeln!(
            svg,
            r##"<line x1="{left:.1}" y1="{py:.1}" x2="{right:.1}" y2="{py:.1}" stroke="#eee"/><text x="{tx:.1}" y="{ly:.1}" text-anchor="end">{}</text>"##,
            tick(y),
            py = sy(y),
            left = LEFT,
            right = LEFT + plot_w,
            tx = LEFT - 6.0,
            ly = sy(y) + 4.0,
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
        HEIGHT - 14.0,
        escape(&chart.x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        escape(&chart.y_label)
    );
    if let Some((value, label)) = &chart.threshold {
        let _ = writeln!(
            svg,
            r##"<line class="threshold" x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#555" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}">{} ({})</text>"##,
            LEFT + plot_w,
            LEFT + plot_w + 6.0,
            sy(*value) + 4.0,
            escape(label),
            tick(*value),
            y = sy(*value),
        );
    }
    for (k, s) in chart.series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        if s.points.is_empty() {
            continue;
        }
        let upper = s.points.iter().map(|p| (sx(p.x), sy(p.hi)));
        let lower = s.points.iter().rev().map(|p| (sx(p.x), sy(p.lo)));
        let _ = writeln!(
            svg,
            r#"<polygon class="range" points="{}" fill="{colour}" fill-opacity="0.18" stroke="none"/>"#,
            coords(upper.chain(lower))
        );
        let _ = writeln!(
            svg,
            r#"<polyline class="mean" points="{}" fill="none" stroke="{colour}" stroke-width="2"><title>{}</title></polyline>"#,
            coords(s.points.iter().map(|p| (sx(p.x), sy(p.mean)))),
            escape(&s.name)
        );
        let ly = TOP + 14.0 + 18.0 * k as f64 + if chart.threshold.is_some() { 24.0 } else { 0.0 };
        let lx = LEFT + plot_w + 10.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 4.0,
            lx + 18.0,
            ly - 4.0,
            lx + 24.0,
            escape(&s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The chart's points as CSV: a header, then `series,x,mean,lo,hi` per point.
///
/// ```
/// use stepgraph_picture::{Curves, Series, curves_csv};
///
/// let chart = Curves {
///     title: "t".into(), x_label: "steps".into(), y_label: "return".into(), threshold: None,
///     series: vec![Series::over_runs("dqn", &[vec![(10.0, 1.5)]])],
/// };
/// assert_eq!(curves_csv(&chart), "series,steps,mean,lo,hi\ndqn,10,1.5,1.5,1.5\n");
/// ```
pub fn curves_csv(chart: &Curves) -> String {
    let mut csv = format!("series,{},mean,lo,hi\n", csv_field(&chart.x_label));
    for s in &chart.series {
        for p in &s.points {
            let _ = writeln!(
                csv,
                "{},{},{},{},{}",
                csv_field(&s.name),
                p.x,
                p.mean,
                p.lo,
                p.hi
            );
        }
    }
    csv
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc: Option<(f64, f64)>, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
        .unwrap_or((0.0, 1.0))
}

fn coords(points: impl Iterator<Item = (f64, f64)>) -> String {
    points
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A tick label: integers and large values whole, others with two or three decimals.
fn tick(v: f64) -> String {
    if (v == v.round() && v.abs() < 1e9) || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::parse;

    fn chart() -> Curves {
        Curves {
            title: "CartPole-v1 <dqn>".into(),
            x_label: "environment steps".into(),
            y_label: "mean return".into(),
            threshold: Some((475.0, "solved".into())),
            series: vec![
                Series::over_runs(
                    "stepgraph, 8 seeds",
                    &[
                        vec![(0.0, 9.0), (2500.0, 120.0), (5000.0, 500.0)],
                        vec![(0.0, 11.0), (2500.0, 80.0), (5000.0, 480.0)],
                    ],
                ),
                Series::over_runs("rejax", &[vec![(0.0, 10.0), (2500.0, f64::NAN)]]),
            ],
        }
    }

    #[test]
    fn each_series_is_a_mean_line_over_its_range_band() {
        let svg = curves_svg(&chart());
        let doc = parse(&svg);
        let class = |c: &str| {
            doc.descendants()
                .filter(|n| n.attribute("class") == Some(c))
                .count()
        };
        assert_eq!(class("mean"), 2);
        assert_eq!(class("range"), 2);
        assert_eq!(class("threshold"), 1);
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        assert!(texts.contains(&"CartPole-v1 <dqn>"), "{texts:?}");
        assert!(texts.contains(&"stepgraph, 8 seeds"));
        // The band of the first series spans its seeds at the middle point.
        let s = &chart().series[0];
        assert_eq!(
            (s.points[1].lo, s.points[1].hi, s.points[1].mean),
            (80.0, 120.0, 100.0)
        );
        // A point no run has a finite value for is left out.
        assert_eq!(chart().series[1].points.len(), 1);
    }

    #[test]
    fn the_same_chart_draws_the_same_bytes_and_a_changed_one_does_not() {
        let a = curves_svg(&chart());
        assert_eq!(a, curves_svg(&chart()));
        let mut other = chart();
        other.series[0].points[2].mean = 400.0;
        assert_ne!(a, curves_svg(&other));
    }

    #[test]
    fn an_empty_or_flat_chart_still_draws() {
        let mut c = chart();
        c.series.clear();
        c.threshold = None;
        parse(&curves_svg(&c));
        c.series = vec![Series::over_runs("flat", &[vec![(1.0, 5.0), (1.0, 5.0)]])];
        parse(&curves_svg(&c));
    }

    #[test]
    fn the_csv_has_a_row_per_point_and_quotes_what_needs_it() {
        let csv = curves_csv(&chart());
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "series,environment steps,mean,lo,hi");
        assert_eq!(lines.len(), 1 + 3 + 1);
        assert_eq!(lines[2], "\"stepgraph, 8 seeds\",2500,100,80,120");
    }
}
