//! The SVG renderer both pictures share, and the profile's timeline.
//!
//! A profile and a plan are each laid out as a [`Timeline`] (lanes, bars on an axis,
//! arrows between points, marks), and only that is drawn, so the drawing code exists
//! once. The SVG is written by hand: it is a handful of element kinds with fixed
//! attributes, and owning the writer keeps it byte-for-byte deterministic (same input,
//! same bytes), which the committed documentation images and their up-to-date check rely
//! on.

use std::fmt::Write as _;

use stepgraph_plan::Profile;

/// The profile as a self-contained SVG timeline: a header with the step, device, total
/// time and overlap; one lane per stream labelled with its name; each op a bar to scale
/// on a time axis in milliseconds, coloured by part (its function), named inside or
/// above when the name fits, with a `<title>` tooltip (`name stream start–end ms`); each
/// wait an arrow from the end of the op waited for to the start of the op that waited;
/// the critical path outlined in black (its bars carry the class `critical`); and a
/// legend. The output depends only on the profile, byte for byte.
///
/// A profile that [`record::from_str`](crate::record::from_str) would refuse (a stream
/// index past the streams, a wait or path step past the ops) still draws: what cannot be
/// placed is left out or put on the last lane.
///
/// ```
/// use stepgraph_picture::{OpTiming, Profile, WaitEdge, timeline_svg};
///
/// let op = |name: &str, stream, start_ms, end_ms| OpTiming {
///     name: name.into(), func: name.into(), stream, start_ms, end_ms,
/// };
/// let profile = Profile {
///     step: "two".into(),
///     device: "test".into(),
///     streams: vec!["main".into(), "side".into()],
///     ops: vec![op("a", 0, 0.0, 0.1), op("b", 1, 0.1, 0.3)],
///     waits: vec![WaitEdge { from: 0, to: 1 }],
///     critical_path: vec![0, 1],
///     total_ms: 0.3,
/// };
/// let svg = timeline_svg(&profile);
/// assert!(svg.starts_with("<svg"));
/// assert!(svg.contains(">side</text>"));
/// assert!(svg.contains("<title>b side 0.1000–0.3000 ms</title>"));
/// ```
pub fn timeline_svg(profile: &Profile) -> String {
    render_svg(&Timeline::of_profile(profile))
}

/// The name of stream `stream`, `?` when the profile has no such stream.
pub(crate) fn stream_name(profile: &Profile, stream: usize) -> &str {
    profile.streams.get(stream).map_or("?", String::as_str)
}

/// What the SVG renderer draws: lanes, bars on a horizontal axis, arrows between points,
/// marks. A profile and a plan each become one, so the drawing code exists once.
pub(crate) struct Timeline {
    /// The header's first line.
    pub(crate) title: String,
    /// The header's second line.
    pub(crate) subtitle: String,
    /// Lane labels, top to bottom.
    pub(crate) streams: Vec<String>,
    pub(crate) bars: Vec<Bar>,
    pub(crate) arrows: Vec<Arrow>,
    pub(crate) marks: Vec<Mark>,
    pub(crate) axis: Axis,
    /// What an arrow means, for the legend.
    pub(crate) arrow_meaning: &'static str,
}

pub(crate) struct Bar {
    pub(crate) name: String,
    /// The op's function: bars of one part share a colour.
    pub(crate) part: String,
    pub(crate) lane: usize,
    pub(crate) start: f64,
    pub(crate) end: f64,
    pub(crate) critical: bool,
    pub(crate) tooltip: String,
}

impl Bar {
    pub(crate) fn start_at(&self) -> At {
        At {
            t: self.start,
            lane: self.lane,
            on: On::Bar {
                start: self.start,
                end: self.end,
            },
        }
    }

    pub(crate) fn end_at(&self) -> At {
        At {
            t: self.end,
            ..self.start_at()
        }
    }
}

/// A point on a lane, at the height of the lane's bars: the start or end of a bar, or a
/// mark.
#[derive(Clone, Copy)]
pub(crate) struct At {
    pub(crate) t: f64,
    pub(crate) lane: usize,
    pub(crate) on: On,
}

/// What an arrow's end sits on, which says where its edges are.
#[derive(Clone, Copy)]
pub(crate) enum On {
    Bar { start: f64, end: f64 },
    Mark,
}

pub(crate) struct Arrow {
    pub(crate) from: At,
    pub(crate) to: At,
    pub(crate) label: Option<String>,
    pub(crate) critical: bool,
    pub(crate) tooltip: String,
}

/// A point event drawn as a circle with a label (capture begin and end).
pub(crate) struct Mark {
    pub(crate) at: At,
    pub(crate) label: &'static str,
}

pub(crate) struct Axis {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    /// Positions and labels.
    pub(crate) ticks: Vec<(f64, String)>,
    /// Written below the lane labels, at the tick labels' height.
    pub(crate) caption: &'static str,
}

impl Timeline {
    fn of_profile(p: &Profile) -> Timeline {
        let lo = p.ops.iter().map(|o| o.start_ms).fold(0.0, f64::min);
        let mut hi = p.ops.iter().map(|o| o.end_ms).fold(p.total_ms, f64::max);
        if !hi.is_finite() || hi <= lo {
            hi = lo + 1.0;
        }
        let bars: Vec<Bar> = p
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| Bar {
                name: op.name.clone(),
                part: op.func.clone(),
                lane: op.stream,
                start: op.start_ms,
                end: op.end_ms,
                critical: p.critical_path.contains(&i),
                tooltip: format!(
                    "{} {} {:.4}–{:.4} ms",
                    op.name,
                    stream_name(p, op.stream),
                    op.start_ms,
                    op.end_ms
                ),
            })
            .collect();
        let on_path = |a: usize, b: usize| p.critical_path.windows(2).any(|w| w == [a, b]);
        let arrows = p
            .waits
            .iter()
            .filter_map(|w| {
                let (from, to) = (bars.get(w.from)?, bars.get(w.to)?);
                Some(Arrow {
                    from: from.end_at(),
                    to: to.start_at(),
                    label: None,
                    critical: on_path(w.from, w.to),
                    tooltip: format!("{} waits for {}", to.name, from.name),
                })
            })
            .collect();
        let path: Vec<&str> = p
            .critical_path
            .iter()
            .filter_map(|&i| p.ops.get(i).map(|o| o.name.as_str()))
            .collect();
        let mut subtitle = format!(
            "{:.3} ms, {} ops on {} streams, overlap {:.2}x",
            p.total_ms,
            p.ops.len(),
            p.streams.len(),
            p.overlap(),
        );
        if !path.is_empty() {
            let _ = write!(
                subtitle,
                "; critical path {:.3} ms: {}",
                p.critical_path_ms(),
                path.join(" → ")
            );
        }
        Timeline {
            title: format!("{} on {}", p.step, p.device),
            subtitle,
            streams: p.streams.clone(),
            bars,
            arrows,
            marks: Vec::new(),
            axis: Axis {
                lo,
                hi,
                ticks: ms_ticks(lo, hi),
                caption: "time (ms)",
            },
            arrow_meaning: "waits for (cross-stream event)",
        }
    }
}

/// Round tick positions (1, 2 or 5 times a power of ten apart, about eight of them)
/// from `lo` to `hi`, labelled with as many decimals as the step needs.
fn ms_ticks(lo: f64, hi: f64) -> Vec<(f64, String)> {
    let raw = (hi - lo) / 8.0;
    if !raw.is_finite() || raw <= 0.0 {
        return vec![(lo, format!("{lo}"))];
    }
    let mag = 10f64.powf(raw.log10().floor());
    let step = match raw / mag {
        n if n <= 1.0 => mag,
        n if n <= 2.0 => 2.0 * mag,
        n if n <= 5.0 => 5.0 * mag,
        _ => 10.0 * mag,
    };
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last)
        .map(|k| {
            let t = k as f64 * step;
            (t, format!("{t:.decimals$}"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The SVG renderer
// ---------------------------------------------------------------------------------------

/// Width of every picture in SVG units (pixels at 100%): the width the headless-browser
/// test screenshots, and wide enough for a readable timeline.
const WIDTH: f64 = 1200.0;
const HEADER_H: f64 = 62.0;
const LANE_H: f64 = 58.0;
/// A bar's top within its lane, leaving room above it for its name.
const BAR_TOP: f64 = 22.0;
const BAR_H: f64 = 26.0;
const AXIS_H: f64 = 34.0;
const LEGEND_ROW_H: f64 = 24.0;
const RIGHT_PAD: f64 = 40.0;
const OP_FONT: f64 = 11.0;
/// Radius of a capture begin or end mark.
const MARK_R: f64 = 6.0;
const LANE_FONT: f64 = 13.0;
const LEGEND_FONT: f64 = 12.0;
/// A monospace glyph's advance per unit of font size, to tell whether a name fits.
const MONO_ADVANCE: f64 = 0.6;
/// A generous average advance of the sans font, for laying out the legend.
const SANS_ADVANCE: f64 = 0.62;
const FONT_SANS: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";
const FONT_MONO: &str = "DejaVu Sans Mono, Menlo, Consolas, monospace";
/// Part colours (Tableau 10 without its red), in first-seen order of the parts.
const PALETTE: [&str; 9] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
    "#bab0ac",
];
const INK: &str = "#1a1a1a";
const CRITICAL_STROKE: f64 = 2.5;
/// Bars off the critical path are paler, so the path stands out without a legend.
const OFF_PATH_OPACITY: f64 = 0.55;
const ARROW: &str = "#6b6b6b";

/// Parts in first-seen order, each with its palette colour.
pub(crate) struct Parts(Vec<String>);

impl Parts {
    pub(crate) fn of<'a>(funcs: impl Iterator<Item = &'a str>) -> Parts {
        let mut parts: Vec<String> = Vec::new();
        for f in funcs {
            if !parts.iter().any(|p| p == f) {
                parts.push(f.to_string());
            }
        }
        Parts(parts)
    }

    pub(crate) fn color(&self, part: &str) -> &'static str {
        let i = self.0.iter().position(|p| p == part).unwrap_or(0);
        PALETTE[i % PALETTE.len()]
    }
}

/// Dark or white text, whichever reads better on `fill` drawn at `opacity` over white.
pub(crate) fn text_color_on(fill: &str, opacity: f64) -> &'static str {
    let channel = |i: usize| {
        let v = fill
            .get(i..i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(255) as f64
            / 255.0;
        v * opacity + (1.0 - opacity)
    };
    let luma = 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5);
    if luma < 0.55 { "#ffffff" } else { INK }
}

/// Keeps at most `max` characters, ending with `…` when cut.
fn fit(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

pub(crate) fn render_svg(tl: &Timeline) -> String {
    let parts = Parts::of(tl.bars.iter().map(|b| b.part.as_str()));
    let layout = Layout::of(tl);
    // The legend is laid out first: its rows set the picture's height.
    let (placed, rows) = place_legend(tl, &parts);
    let legend_top = layout.lanes_bottom() + AXIS_H + 6.0;
    let height = legend_top + rows as f64 * LEGEND_ROW_H + 8.0;

    let mut s = String::new();
    // Names of bars, arrows and marks, drawn over all of them.
    let mut labels = String::new();
    write_header(&mut s, tl, height);
    write_lanes(&mut s, tl, &layout);
    write_axis(&mut s, tl, &layout);
    write_bars(&mut s, &mut labels, tl, &layout, &parts);
    write_arrows(&mut s, &mut labels, tl, &layout);
    write_marks(&mut s, &mut labels, tl, &layout);
    s.push_str(&labels);
    write_legend(&mut s, &placed, legend_top);
    s.push_str("</svg>\n");
    s
}

/// Where things go: the lanes top to bottom, time left to right past the label column.
struct Layout {
    lanes: usize,
    label_w: f64,
    x0: f64,
    x1: f64,
    lo: f64,
    span: f64,
}

impl Layout {
    fn of(tl: &Timeline) -> Layout {
        let longest = tl
            .streams
            .iter()
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(4);
        let label_w = (longest as f64 * LANE_FONT * MONO_ADVANCE + 28.0).max(96.0);
        Layout {
            lanes: tl.streams.len().max(1),
            label_w,
            x0: label_w + 14.0,
            x1: WIDTH - RIGHT_PAD,
            lo: tl.axis.lo,
            span: tl.axis.hi - tl.axis.lo,
        }
    }

    /// The x of time `t`.
    fn x(&self, t: f64) -> f64 {
        self.x0 + (t - self.lo) / self.span * (self.x1 - self.x0)
    }

    fn lane_top(&self, lane: usize) -> f64 {
        HEADER_H + lane as f64 * LANE_H
    }

    fn bar_mid(&self, lane: usize) -> f64 {
        self.lane_top(lane) + BAR_TOP + BAR_H / 2.0
    }

    fn lanes_bottom(&self) -> f64 {
        self.lane_top(self.lanes)
    }

    /// Where an arrow leaves or enters `at`: a bar's top or bottom edge (the one facing
    /// `toward`, a direction down the lanes) at its end or start, or a mark's rim.
    fn edge(&self, at: &At, toward: f64) -> (f64, f64) {
        let lane = at.lane.min(self.lanes - 1);
        let (px, half) = match at.on {
            On::Bar { start, end } => {
                let (bx0, bx1) = (self.x(start), self.x(end).max(self.x(start) + 2.0));
                let inset = ((bx1 - bx0) / 2.0).min(3.0);
                // The source's end or the target's start, a little inside the bar.
                let px = if at.t >= end {
                    bx1 - inset
                } else {
                    bx0 + inset
                };
                (px, BAR_H / 2.0)
            }
            On::Mark => (self.x(at.t), MARK_R),
        };
        (px, self.bar_mid(lane) + half * toward.signum())
    }
}

/// One legend entry placed: its x, its row, its key and its text.
type Placed<'a> = (f64, usize, LegendKey, &'a str);

/// The legend's entries, left to right, wrapped into rows; with the number of rows.
fn place_legend<'a>(tl: &'a Timeline, parts: &'a Parts) -> (Vec<Placed<'a>>, usize) {
    let mut legend: Vec<(LegendKey, &str)> = parts
        .0
        .iter()
        .map(|p| (LegendKey::Part(parts.color(p)), p.as_str()))
        .collect();
    if tl.bars.iter().any(|b| b.critical) {
        legend.push((LegendKey::Critical, "critical path"));
    }
    if !tl.arrows.is_empty() {
        legend.push((LegendKey::Arrow, tl.arrow_meaning));
    }
    if !tl.marks.is_empty() {
        legend.push((LegendKey::Mark, "capture begin / end"));
    }
    let mut placed = Vec::with_capacity(legend.len());
    let (mut lx, mut row) = (14.0, 0usize);
    for (key, text) in legend {
        let w = 26.0 + text.chars().count() as f64 * LEGEND_FONT * SANS_ADVANCE + 20.0;
        if lx + w > WIDTH - 14.0 && lx > 14.0 {
            lx = 14.0;
            row += 1;
        }
        placed.push((lx, row, key, text));
        lx += w;
    }
    (placed, row + 1)
}

/// The `<svg>` element opened, with its title, arrow heads, background and headings.
fn write_header(s: &mut String, tl: &Timeline, height: f64) {
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {WIDTH} {height:.0}\" font-family=\"{FONT_SANS}\" role=\"img\">"
    );
    let _ = writeln!(s, "<title>{}</title>", xml(&tl.title));
    s.push_str("<defs>\n");
    for (id, color) in [("arrow", ARROW), ("arrow-critical", INK)] {
        let _ = writeln!(
            s,
            "<marker id=\"{id}\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" \
             markerHeight=\"7\" markerUnits=\"userSpaceOnUse\" orient=\"auto\">\
             <path d=\"M0,0 L10,5 L0,10 z\" fill=\"{color}\"/></marker>"
        );
    }
    s.push_str("</defs>\n");
    // A background of its own, so the picture reads the same on a dark page.
    let _ = writeln!(
        s,
        "<rect width=\"{WIDTH}\" height=\"{height:.0}\" fill=\"#ffffff\"/>"
    );
    let _ = writeln!(
        s,
        "<text class=\"title\" x=\"14\" y=\"25\" font-size=\"16\" font-weight=\"bold\" \
         fill=\"{INK}\">{}</text>",
        xml(&fit(&tl.title, 120))
    );
    let _ = writeln!(
        s,
        "<text class=\"subtitle\" x=\"14\" y=\"46\" font-size=\"12\" fill=\"#444444\">{}</text>",
        xml(&fit(&tl.subtitle, 180))
    );
}

/// Lanes: alternating bands with the stream's name in the left column.
fn write_lanes(s: &mut String, tl: &Timeline, layout: &Layout) {
    let (label_w, lanes_bottom) = (layout.label_w, layout.lanes_bottom());
    for (i, name) in tl.streams.iter().enumerate() {
        let fill = if i % 2 == 0 { "#f3f4f7" } else { "#ffffff" };
        let _ = writeln!(
            s,
            "<rect class=\"lane\" x=\"0\" y=\"{:.1}\" width=\"{WIDTH}\" height=\"{LANE_H}\" \
             fill=\"{fill}\"/>",
            layout.lane_top(i)
        );
        let _ = writeln!(
            s,
            "<text class=\"lane-label\" x=\"14\" y=\"{:.1}\" font-family=\"{FONT_MONO}\" \
             font-size=\"{LANE_FONT}\" font-weight=\"bold\" fill=\"{INK}\">{}</text>",
            layout.bar_mid(i) + LANE_FONT * 0.35,
            xml(name)
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{label_w:.1}\" y1=\"{HEADER_H}\" x2=\"{label_w:.1}\" y2=\"{lanes_bottom:.1}\" \
         stroke=\"#c8c8c8\"/>"
    );
}

/// Axis: grid lines through the lanes, tick labels below them; every k-th tick only
/// (k = 1, 2, 5, 10, 20, ...) when all of them would not fit side by side.
fn write_axis(s: &mut String, tl: &Timeline, layout: &Layout) {
    let lanes_bottom = layout.lanes_bottom();
    let widest = tl
        .axis
        .ticks
        .iter()
        .map(|(_, l)| l.chars().count())
        .max()
        .unwrap_or(1);
    let room = widest as f64 * 11.0 * SANS_ADVANCE + 10.0;
    let pitch = match tl.axis.ticks.as_slice() {
        [(a, _), (b, _), ..] => (layout.x(*b) - layout.x(*a)).abs(),
        _ => f64::INFINITY,
    };
    let every = [1usize, 2, 5]
        .iter()
        .cycle()
        .scan(1usize, |scale, &m| {
            let k = m * *scale;
            if m == 5 {
                *scale *= 10;
            }
            Some(k)
        })
        .find(|&k| k as f64 * pitch >= room || k >= tl.axis.ticks.len())
        .unwrap_or(1);
    for (t, label) in tl.axis.ticks.iter().step_by(every) {
        let tx = layout.x(*t);
        let _ = writeln!(
            s,
            "<line class=\"grid\" x1=\"{tx:.2}\" y1=\"{HEADER_H}\" x2=\"{tx:.2}\" \
             y2=\"{:.1}\" stroke=\"#d9d9d9\" stroke-width=\"1\"/>",
            lanes_bottom + 4.0
        );
        let _ = writeln!(
            s,
            "<text class=\"tick\" x=\"{tx:.2}\" y=\"{:.1}\" font-size=\"11\" fill=\"#555555\" \
             text-anchor=\"middle\">{}</text>",
            lanes_bottom + 17.0,
            xml(label)
        );
    }
    let _ = writeln!(
        s,
        "<text class=\"axis-caption\" x=\"14\" y=\"{:.1}\" font-size=\"11\" fill=\"#555555\">{}</text>",
        lanes_bottom + 17.0,
        tl.axis.caption
    );
}

/// Bars, then their names: inside when the name fits, else above when that space on
/// the lane is free, else only in the tooltip.
fn write_bars(s: &mut String, labels: &mut String, tl: &Timeline, layout: &Layout, parts: &Parts) {
    let lanes = layout.lanes;
    let mut label_free = vec![f64::NEG_INFINITY; lanes];
    for bar in &tl.bars {
        let lane = bar.lane.min(lanes - 1);
        let bx = layout.x(bar.start);
        let bw = (layout.x(bar.end) - bx).max(2.0);
        let by = layout.lane_top(lane) + BAR_TOP;
        let fill = parts.color(&bar.part);
        let (class, opacity, stroke) = if bar.critical {
            (
                "op critical",
                1.0,
                format!(" stroke=\"{INK}\" stroke-width=\"{CRITICAL_STROKE}\""),
            )
        } else {
            ("op", OFF_PATH_OPACITY, String::new())
        };
        let _ = writeln!(
            s,
            "<rect class=\"{class}\" x=\"{bx:.2}\" y=\"{by:.1}\" width=\"{bw:.2}\" \
             height=\"{BAR_H}\" rx=\"3\" fill=\"{fill}\" fill-opacity=\"{opacity}\"{stroke}>\
             <title>{}</title></rect>",
            xml(&bar.tooltip)
        );
        let text_w = bar.name.chars().count() as f64 * OP_FONT * MONO_ADVANCE;
        if text_w + 8.0 <= bw {
            let _ = writeln!(
                labels,
                "<text class=\"op-label\" x=\"{:.2}\" y=\"{:.1}\" font-family=\"{FONT_MONO}\" \
                 font-size=\"{OP_FONT}\" fill=\"{}\" text-anchor=\"middle\" \
                 pointer-events=\"none\">{}</text>",
                bx + bw / 2.0,
                by + BAR_H / 2.0 + OP_FONT * 0.35,
                text_color_on(fill, opacity),
                xml(&bar.name)
            );
        } else if bx >= label_free[lane] && bx + text_w <= WIDTH - 4.0 {
            let _ = writeln!(
                labels,
                "<text class=\"op-label\" x=\"{bx:.2}\" y=\"{:.1}\" font-family=\"{FONT_MONO}\" \
                 font-size=\"{OP_FONT}\" fill=\"{INK}\" pointer-events=\"none\">{}</text>",
                by - 5.0,
                xml(&bar.name)
            );
            label_free[lane] = bx + text_w + 6.0;
        }
    }
}

/// Arrows over the bars, those on the critical path last so that they stay on top.
/// A wait between lanes leaves its source's top or bottom edge at the source's end
/// and enters the target's facing edge at the target's start, vertically at both
/// ends: fork and join points read as such even when the two ops are microseconds
/// apart, which is too close to route an arrow around.
fn write_arrows(s: &mut String, labels: &mut String, tl: &Timeline, layout: &Layout) {
    let lanes = layout.lanes;
    let mut order: Vec<&Arrow> = tl.arrows.iter().filter(|a| !a.critical).collect();
    order.extend(tl.arrows.iter().filter(|a| a.critical));
    for a in order {
        let down = (a.to.lane as f64 - a.from.lane as f64).signum();
        let (class, color, width, marker) = if a.critical {
            ("wait critical-edge", INK, 2.0, "arrow-critical")
        } else {
            ("wait", ARROW, 1.3, "arrow")
        };
        let d = if down == 0.0 {
            let (sx, sy) = (
                layout.x(a.from.t),
                layout.bar_mid(a.from.lane.min(lanes - 1)),
            );
            format!("M{sx:.2},{sy:.1} L{:.2},{sy:.1}", layout.x(a.to.t))
        } else {
            let (sx, sy) = layout.edge(&a.from, down);
            let (ex, ey) = layout.edge(&a.to, -down);
            let mid = (sy + ey) / 2.0;
            format!("M{sx:.2},{sy:.1} C{sx:.2},{mid:.1} {ex:.2},{mid:.1} {ex:.2},{ey:.1}")
        };
        let _ = writeln!(
            s,
            "<path class=\"{class}\" d=\"{d}\" fill=\"none\" stroke=\"{color}\" \
             stroke-width=\"{width}\" marker-end=\"url(#{marker})\"><title>{}</title></path>",
            xml(&a.tooltip)
        );
        if let Some(label) = &a.label {
            // At the curve's midpoint, on a white halo so it stays legible over bars.
            let (sx, sy) = layout.edge(&a.from, down);
            let (ex, ey) = layout.edge(&a.to, -down);
            let _ = writeln!(
                labels,
                "<text class=\"event-label\" x=\"{:.2}\" y=\"{:.1}\" font-size=\"10\" \
                 fill=\"#333333\" text-anchor=\"middle\" stroke=\"#ffffff\" stroke-width=\"3\" \
                 paint-order=\"stroke\" pointer-events=\"none\">{}</text>",
                (sx + ex) / 2.0,
                (sy + ey) / 2.0 + 3.5,
                xml(label)
            );
        }
    }
}

/// The capture's begin and end marks, with their labels.
fn write_marks(s: &mut String, labels: &mut String, tl: &Timeline, layout: &Layout) {
    let lanes = layout.lanes;
    for m in &tl.marks {
        let (mx, my) = (layout.x(m.at.t), layout.bar_mid(m.at.lane.min(lanes - 1)));
        let _ = writeln!(
            s,
            "<circle class=\"mark\" cx=\"{mx:.2}\" cy=\"{my:.1}\" r=\"6\" fill=\"#ffffff\" \
             stroke=\"{INK}\" stroke-width=\"2\"><title>capture {}</title></circle>",
            m.label
        );
        let _ = writeln!(
            labels,
            "<text class=\"mark-label\" x=\"{mx:.2}\" y=\"{:.1}\" font-size=\"10\" \
             fill=\"#333333\" text-anchor=\"middle\">{}</text>",
            my - 11.0,
            m.label
        );
    }
}

/// The legend's keys and texts, where [`place_legend`] put them.
fn write_legend(s: &mut String, placed: &[Placed], legend_top: f64) {
    for &(lx, row, key, text) in placed {
        let y = legend_top + row as f64 * LEGEND_ROW_H;
        match key {
            LegendKey::Part(color) => {
                let _ = writeln!(
                    s,
                    "<rect class=\"legend-key\" x=\"{lx:.1}\" y=\"{y:.1}\" width=\"18\" \
                     height=\"14\" rx=\"2\" fill=\"{color}\"/>"
                );
            }
            LegendKey::Critical => {
                let _ = writeln!(
                    s,
                    "<rect class=\"legend-key\" x=\"{lx:.1}\" y=\"{y:.1}\" width=\"18\" \
                     height=\"14\" rx=\"2\" fill=\"#d0d0d0\" stroke=\"{INK}\" \
                     stroke-width=\"{CRITICAL_STROKE}\"/>"
                );
            }
            LegendKey::Arrow => {
                let _ = writeln!(
                    s,
                    "<path class=\"legend-key\" d=\"M{lx:.1},{:.1} L{:.1},{:.1}\" \
                     stroke=\"{ARROW}\" stroke-width=\"1.3\" marker-end=\"url(#arrow)\"/>",
                    y + 7.0,
                    lx + 18.0,
                    y + 7.0
                );
            }
            LegendKey::Mark => {
                let _ = writeln!(
                    s,
                    "<circle class=\"legend-key\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"6\" \
                     fill=\"#ffffff\" stroke=\"{INK}\" stroke-width=\"2\"/>",
                    lx + 9.0,
                    y + 7.0
                );
            }
        }
        let _ = writeln!(
            s,
            "<text class=\"legend\" x=\"{:.1}\" y=\"{:.1}\" font-size=\"{LEGEND_FONT}\" \
             fill=\"#333333\">{}</text>",
            lx + 26.0,
            y + 11.5,
            xml(text)
        );
    }
}

#[derive(Clone, Copy)]
enum LegendKey {
    Part(&'static str),
    Critical,
    Arrow,
    Mark,
}

/// Text for XML character data and attribute values.
/// Text for XML character data and attribute values.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters other than tab and newlines are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fork_join, parse, title_of, with_class};

    #[test]
    fn profile_svg_is_well_formed_and_labels_every_lane_and_op() {
        let p = fork_join();
        let svg = timeline_svg(&p);
        assert_eq!(svg, timeline_svg(&p), "same profile, same bytes");
        let doc = parse(&svg);
        let lanes: Vec<&str> = with_class(&doc, "lane-label")
            .iter()
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(lanes, ["main", "chain[0]", "chain[1]"]);
        let titles: Vec<String> = with_class(&doc, "op").iter().map(title_of).collect();
        assert_eq!(
            titles,
            [
                "seed main 0.0000–0.0050 ms",
                "chain[0] chain[0] 0.0080–0.3500 ms",
                "chain[1] chain[1] 0.0090–0.3620 ms",
                "total main 0.3640–0.3740 ms",
            ]
        );
        let title = with_class(&doc, "title")[0].text().unwrap();
        assert_eq!(title, "fork_join on Test GPU <&> \"quoted\"");
        let subtitle = with_class(&doc, "subtitle")[0].text().unwrap();
        assert!(
            subtitle.starts_with("0.374 ms, 4 ops on 3 streams, overlap 1.90x"),
            "{subtitle}"
        );
        // Long bars carry their names; the legend names each part once.
        let ops: Vec<&str> = with_class(&doc, "op-label")
            .iter()
            .filter_map(|n| n.text())
            .collect();
        assert!(
            ops.contains(&"chain[0]") && ops.contains(&"seed"),
            "{ops:?}"
        );
        let legend: Vec<&str> = with_class(&doc, "legend")
            .iter()
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(legend[..3], ["seed", "chain", "total"]);
    }

    #[test]
    fn bars_are_to_scale_and_critical_class_marks_exactly_the_critical_ops() {
        let doc_text = timeline_svg(&fork_join());
        let doc = parse(&doc_text);
        let critical: Vec<String> = with_class(&doc, "critical")
            .iter()
            .map(|n| {
                title_of(n)
                    .split(' ')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        assert_eq!(critical, ["seed", "chain[1]", "total"]);
        let width = |name: &str| {
            let bar = with_class(&doc, "op")
                .into_iter()
                .find(|n| title_of(n).starts_with(name))
                .unwrap();
            bar.attribute("width").unwrap().parse::<f64>().unwrap()
        };
        let ratio = width("chain[0]") / width("total");
        assert!((ratio - 0.342 / 0.010).abs() < 0.5, "{ratio}");
    }

    #[test]
    fn each_wait_is_an_arrow_and_those_on_the_critical_path_are_marked() {
        let svg = timeline_svg(&fork_join());
        let doc = parse(&svg);
        let arrows = with_class(&doc, "wait");
        assert_eq!(arrows.len(), 4);
        assert!(arrows.iter().all(|a| a.attribute("marker-end").is_some()));
        let on_path: Vec<String> = with_class(&doc, "critical-edge")
            .iter()
            .map(title_of)
            .collect();
        assert_eq!(
            on_path,
            ["chain[1] waits for seed", "total waits for chain[1]"]
        );
        assert!(
            svg.contains("<marker id=\"arrow\"") && svg.contains("<marker id=\"arrow-critical\"")
        );
    }

    #[test]
    fn ticks_are_round_numbers_in_milliseconds() {
        let ticks = ms_ticks(0.0, 0.374);
        let labels: Vec<&str> = ticks.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "0.00", "0.05", "0.10", "0.15", "0.20", "0.25", "0.30", "0.35"
            ]
        );
        let labels: Vec<String> = ms_ticks(0.0, 12.0).into_iter().map(|(_, l)| l).collect();
        assert_eq!(labels, ["0", "2", "4", "6", "8", "10", "12"]);
        assert_eq!(ms_ticks(1.0, 1.0).len(), 1);
    }

    #[test]
    fn xml_text_escapes_markup_and_drops_control_characters() {
        assert_eq!(
            xml("<a & 'b'>\u{7}"),
            "&lt;a &amp; &apos;b&apos;&gt;\u{fffd}"
        );
        assert_eq!(xml("\"tab\there\""), "&quot;tab\there&quot;");
    }
}
