//! The timeline picture, looked at: a recorded profile (the workspace's
//! `tests/fixtures/*.profile.json`, no GPU needed) is drawn as SVG, rendered to PNG by
//! headless Chromium, and the PNG is checked for what a reader needs: it is not blank,
//! every lane's label is drawn where the SVG puts it, and every part's colour shows. Also
//! checks that the committed documentation images in `docs/` are what the recorded
//! profiles draw today, and that the records are in the form `record::to_string` writes.
//!
//! Needs `chromium` on PATH (Debian's package), which `cargo xtask test` installs before
//! it runs the tests; without it the browser test fails saying so. It installs nothing.

use std::fs::{self, File};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stepgraph_picture::{Profile, record, timeline_svg, trace_json};

/// Relative to the workspace root, as the messages show them.
const FIXTURE: &str = "tests/fixtures/fork_join.profile.json";
/// The recorded profiles whose pictures are committed in `docs/`.
const RECORDED: [&str; 2] = ["fork_join", "dqn"];
/// The screenshot's size: the SVG's width, and taller than its height.
const WINDOW: (u32, u32) = (1200, 600);
/// How long one Chromium screenshot may take before the test gives up on it.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(60);

/// The workspace root: the fixtures and `docs/` are the workspace's.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the picture crate sits one folder below the workspace root")
}

fn read_record(path: &str) -> (String, Profile) {
    let text = fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let profile = record::from_str(&text).unwrap_or_else(|e| panic!("{path}: {}", chain(&e)));
    (text, profile)
}

/// An error and its sources, one after the other.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// A fresh, empty folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stepgraph-picture-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("temp folder");
    dir
}

/// Chromium from PATH; the test fails saying how to get it when it is not there.
fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("chromium"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "this test renders SVG in headless Chromium, and `chromium` is not on PATH: run \
             `cargo xtask test`, which installs it with apt-get when run as root, or install \
             Debian's package yourself (`sudo apt-get install chromium fonts-dejavu-core`)"
        )
    })
}

/// Renders `svg` to a PNG of [`WINDOW`] with headless Chromium, returning its pixels as
/// RGB rows.
fn screenshot(svg: &str, dir: &Path) -> Image {
    let svg_path = dir.join("picture.svg");
    let png_path = dir.join("picture.png");
    fs::write(&svg_path, svg).expect("write the SVG");
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // One CSS pixel per PNG pixel, so the SVG's coordinates are the PNG's.
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", dir.join("profile").display()))
    .arg(format!("--screenshot={}", png_path.display()))
    .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
    .arg(format!("file://{}", svg_path.display()))
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("chromium starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if started.elapsed() > CHROMIUM_LIMIT {
            let _ = child.kill();
            panic!("chromium took over {CHROMIUM_LIMIT:?} to take a screenshot");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    assert!(
        status.success() && png_path.is_file(),
        "chromium failed ({status}) to write {}:\n{stderr}",
        png_path.display()
    );
    Image::read(&png_path)
}

/// An 8-bit RGB image.
struct Image {
    width: usize,
    height: usize,
    rgb: Vec<[u8; 3]>,
}

impl Image {
    fn read(path: &Path) -> Image {
        let file = BufReader::new(File::open(path).expect("open the PNG"));
        let mut decoder = png::Decoder::new(file);
        decoder.set_transformations(png::Transformations::normalize_to_color8());
        let mut reader = decoder.read_info().expect("a PNG");
        let mut buf = vec![0; reader.output_buffer_size().expect("a PNG of sane size")];
        let info = reader.next_frame(&mut buf).expect("a PNG frame");
        let bytes = &buf[..info.buffer_size()];
        let rgb = match info.color_type {
            png::ColorType::Rgb => bytes.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect(),
            png::ColorType::Rgba => bytes.chunks_exact(4).map(|p| [p[0], p[1], p[2]]).collect(),
            other => panic!("unexpected PNG colour type {other:?}"),
        };
        Image {
            width: info.width as usize,
            height: info.height as usize,
            rgb,
        }
    }

    /// Pixels in the rectangle from (x0, y0) to (x1, y1), clipped to the image.
    fn region(&self, x0: f64, y0: f64, x1: f64, y1: f64) -> impl Iterator<Item = [u8; 3]> + '_ {
        let clip = |v: f64, max: usize| (v.max(0.0) as usize).min(max);
        let (x0, x1) = (clip(x0, self.width), clip(x1, self.width));
        let (y0, y1) = (clip(y0, self.height), clip(y1, self.height));
        (y0..y1).flat_map(move |y| (x0..x1).map(move |x| self.rgb[y * self.width + x]))
    }
}

fn luma([r, g, b]: [u8; 3]) -> f64 {
    0.2126 * r as f64 + 0.7152 * g as f64 + 0.0722 * b as f64
}

fn dark(p: [u8; 3]) -> bool {
    luma(p) < 100.0
}

fn hex(color: &str) -> [u8; 3] {
    let c = |i: usize| u8::from_str_radix(&color[i..i + 2], 16).expect("a #rrggbb colour");
    [c(1), c(3), c(5)]
}

fn close(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(&b).all(|(x, y)| x.abs_diff(*y) <= 8)
}

fn attr(node: &roxmltree::Node<'_, '_>, name: &str) -> f64 {
    node.attribute(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("<{}> has no numeric {name}", node.tag_name().name()))
}

#[test]
fn timeline_renders_in_headless_chromium_with_labelled_lanes() {
    let (_, profile) = read_record(FIXTURE);
    let svg = timeline_svg(&profile);
    let doc = roxmltree::Document::parse(&svg).expect("the SVG is well-formed XML");
    let height = attr(&doc.root_element(), "height");
    assert!(
        height <= WINDOW.1 as f64,
        "the picture ({height} high) fits the window"
    );
    let image = screenshot(&svg, &scratch("timeline"));
    assert_eq!(
        (image.width, image.height),
        (WINDOW.0 as usize, WINDOW.1 as usize)
    );

    // Not blank: a good share of the picture is drawn, in many colours.
    let drawn = image.rgb.iter().filter(|&&p| p != [255, 255, 255]).count();
    let share = drawn as f64 / image.rgb.len() as f64;
    assert!(
        share > 0.10,
        "only {:.1}% of the pixels are not white",
        share * 100.0
    );
    let mut colors: Vec<[u8; 3]> = image.rgb.clone();
    colors.sort_unstable();
    colors.dedup();
    assert!(colors.len() > 50, "only {} distinct colours", colors.len());

    // Every lane is labelled with its stream: the SVG has the text, and the PNG has
    // dark glyph pixels where the text sits, in the label column of that lane.
    let labels: Vec<_> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("lane-label"))
        .collect();
    let names: Vec<&str> = labels.iter().filter_map(|n| n.text()).collect();
    assert_eq!(
        names, profile.streams,
        "one label per lane, in stream order"
    );
    for label in &labels {
        let (x, y) = (attr(label, "x"), attr(label, "y"));
        let size = attr(label, "font-size");
        let name = label.text().unwrap_or_default();
        let width = name.chars().count() as f64 * size * 0.6;
        let ink = image
            .region(x, y - size, x + width, y + 3.0)
            .filter(|&p| dark(p))
            .count();
        assert!(
            ink >= 12 * name.len(),
            "lane label `{name}` at ({x}, {y}): {ink} dark pixels"
        );
        // Right of the text, in the same column, is lane background: the ink above is
        // the text, not a dark block.
        let column_end = x + width + 24.0;
        let beyond = image
            .region(x + width + 4.0, y - size, column_end, y + 3.0)
            .filter(|&p| dark(p))
            .count();
        assert_eq!(beyond, 0, "dark pixels right of `{name}`");
    }

    // Every part's colour shows (the critical bars are drawn at full strength), and the
    // critical path's outline is drawn.
    let keys: Vec<&str> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("legend-key") && n.has_tag_name("rect"))
        .filter_map(|n| n.attribute("fill"))
        .filter(|f| *f != "#d0d0d0")
        .collect();
    assert_eq!(keys.len(), 3, "seed, chain and total: {keys:?}");
    for key in keys {
        let want = hex(key);
        let n = image.rgb.iter().filter(|&&p| close(p, want)).count();
        assert!(n > 100, "part colour {key} covers only {n} pixels");
    }
    let critical = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("op critical"))
        .count();
    assert_eq!(critical, profile.critical_path.len());
}

#[test]
fn committed_documentation_images_are_what_the_recorded_profiles_draw() {
    for name in RECORDED {
        let path = format!("tests/fixtures/{name}.profile.json");
        let (_, profile) = read_record(&path);
        let regenerate = format!(
            "regenerate them with `cargo xtask render-profile {path} --out docs` and review the diff"
        );
        for (file, want) in [
            (format!("docs/{name}.timeline.svg"), timeline_svg(&profile)),
            (
                format!("docs/{name}.trace.json"),
                trace_json(&profile).expect("a fixture's trace is written"),
            ),
        ] {
            let have = fs::read_to_string(root().join(&file))
                .unwrap_or_else(|e| panic!("{file}: {e}; {regenerate}"));
            assert!(have == want, "{file} is out of date; {regenerate}");
        }
    }
}

#[test]
fn committed_records_are_as_the_writer_writes_them() {
    for name in RECORDED {
        let path = format!("tests/fixtures/{name}.profile.json");
        let (text, profile) = read_record(&path);
        let written = record::to_string(&profile).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            written == text,
            "{path} reads back, but `record::to_string` writes it differently: rewrite it \
             with the writer so that a new recording diffs against it line by line"
        );
    }
}
